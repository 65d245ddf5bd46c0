//! The agent on a state directory that fills up (a 1 MiB tmpfs): it stays
//! up, says so on /health, holds events in memory, and delivers everything
//! once space comes back. Root only (mount, BPF); never skipped in CI.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use memwatch::EventKind;
use memwatch_test_support::{metrics::metric, webhook::Receiver};
use memwatch_tests::{
    agent::Agent, kernel_tests_enabled, received_events, tmpfs::Tmpfs, workspace_bin,
};

/// The seqs the webhook got.
fn received(receiver: &Receiver) -> BTreeSet<u64> {
    received_events(receiver).iter().map(|e| e.seq).collect()
}

async fn status(agent: &Agent, path: &str) -> serde_json::Value {
    let (code, body) = agent.get(path).await;
    assert!(code == 200 || code == 503, "{path}: {code} {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_directory_degrades_then_recovers_without_losing_events() {
    if !kernel_tests_enabled("a_full_state_directory_degrades_then_recovers_without_losing_events")
    {
        return;
    }
    let disk = Tmpfs::mount("1m");
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "heartbeat_interval = \"1s\"\n").unwrap();
    let receiver = Receiver::start();
    let hook = receiver.url();
    let mut agent = Agent::start_in(
        disk.path(),
        &[
            "--config",
            config.path().to_str().unwrap(),
            "--webhook",
            &hook,
        ],
    )
    .await;

    // Fill the disk, and keep it full while the agent tries to write.
    disk.fill("filler");
    let deadline = Instant::now() + Duration::from_secs(60);
    let degraded = loop {
        let health = status(&agent, "/health").await;
        let reasons = health["reasons"].to_string();
        if reasons.contains("state directory not writable") {
            break health;
        }
        assert!(
            Instant::now() < deadline,
            "never degraded: {health}\n{}",
            agent.log_text()
        );
        disk.fill("filler");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(degraded["status"], "degraded", "{degraded}");
    // Still up and still making events (heartbeats), held in memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let state = status(&agent, "/v1/status").await;
    assert!(state["outbox"]["pending"].as_u64().unwrap() >= 1, "{state}");
    let (_, metrics) = agent.get("/metrics").await;
    let unpersisted = metric(&metrics, "memwatch_outbox_unpersisted_total")
        .expect("memwatch_outbox_unpersisted_total");
    assert!(unpersisted >= 1.0, "{metrics}");

    // Space comes back: the agent writes out what it held and heals.
    disk.free("filler");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = status(&agent, "/health").await;
        let state = status(&agent, "/v1/status").await;
        if health["status"] == "healthy" && state["outbox"]["pending"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never recovered: {health} {state}\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Every event made, held in memory or not, reaches the webhook.
    let last = status(&agent, "/v1/status").await["outbox"]["last_seq"]
        .as_u64()
        .unwrap();
    let all: BTreeSet<u64> = agent.events(0).await.iter().map(|e| e.seq).collect();
    assert_eq!(
        all,
        (1..=all.last().copied().unwrap()).collect(),
        "no gap in the outbox"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = received(&receiver);
        if (1..=last).all(|s| got.contains(&s)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "webhook missing events up to {last}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Heartbeats (every second here) carry the state, sink backlog included.
    let events = agent.events(0).await;
    let heartbeat = events
        .iter()
        .rev()
        .find(|e| e.body.kind == EventKind::Heartbeat)
        .expect("heartbeats while the test ran");
    let state = heartbeat.body.state.as_ref().expect("heartbeat state");
    assert_eq!(state["source"], "ebpf", "{state}");
    assert!(
        state["outbox"]["sinks"]["webhook-1"]["acked_seq"].is_u64(),
        "{state}"
    );
    assert_eq!(
        agent.stop(),
        Some(0),
        "clean exit; log:\n{}",
        agent.log_text()
    );
}

#[test]
fn an_unusable_state_directory_is_named() {
    if !kernel_tests_enabled("an_unusable_state_directory_is_named") {
        return;
    }
    // Below a regular file: not creatable, even by root.
    let out = std::process::Command::new(workspace_bin("memwatch"))
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            "/etc/hostname/memwatch",
        ])
        .output()
        .expect("run memwatch");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "state directory /etc/hostname/memwatch is unusable (--state-dir / `state_dir`)"
        ),
        "{stderr}"
    );
}
