//! The agent on a state directory whose writes block (an ext4 file system
//! frozen with `fsfreeze`, as a hung disk or a storage snapshot does):
//! the API answers all along, `/live` turns 503 naming the outbox writer
//! within its documented bound (six periods and at least 60 s), turns 200
//! again after the thaw, and every event made while frozen is delivered;
//! and frozen, with every connection slot held and a worker turning
//! unhealthy, the probes still answer within a second.
//! Root only (loop mount, fsfreeze, BPF); never skipped in CI.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use memwatch_test_support::webhook::Receiver;
use memwatch_tests::{
    agent::Agent, cgroup::TestCgroup, ext4::Ext4, kernel_tests_enabled, received_events,
};

/// The documented bound (design.md, `GET /live`) and a margin for a
/// loaded machine.
const STALL_BOUND: Duration = Duration::from_secs(60 + 30);
/// Each answer of the API while the disk is frozen, at most.
const ANSWER_BOUND: Duration = Duration::from_secs(5);

/// GET `path` with a client that gives up after [`ANSWER_BOUND`]: the
/// point is that the API answers while writes hang.
async fn get(client: &reqwest::Client, agent: &Agent, path: &str) -> (u16, String) {
    let answer = client
        .get(format!("{}{path}", agent.base_url))
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{path} did not answer within {ANSWER_BOUND:?}: {e}\n{}",
                agent.log_text()
            )
        });
    let code = answer.status().as_u16();
    (code, answer.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_state_directory_fails_live_then_recovers_and_loses_nothing() {
    if !kernel_tests_enabled("a_frozen_state_directory_fails_live_then_recovers_and_loses_nothing")
    {
        return;
    }
    let mut disk = Ext4::mount(64);
    let state = disk.dir("state");
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "heartbeat_interval = \"1s\"\n").unwrap();
    let receiver = Receiver::start();
    let hook = receiver.url();
    let mut agent = Agent::start_in(
        &state,
        &[
            "--config",
            config.path().to_str().unwrap(),
            "--webhook",
            &hook,
        ],
    )
    .await;
    // Dropped before the agent: a failure while frozen thaws first.
    let _thaw = disk.thaw_on_drop();
    let client = reqwest::Client::builder()
        .timeout(ANSWER_BOUND)
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while received_events(&receiver).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no event delivered\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(&client, &agent, "/live").await.0, 200);

    disk.freeze();
    let frozen_at = Instant::now();
    let stalled = loop {
        let (code, body) = get(&client, &agent, "/live").await;
        // The rest of the API answers too, the outbox's figures included.
        let (health_code, health) = get(&client, &agent, "/health").await;
        assert!(health_code == 200 || health_code == 503, "{health}");
        let (metrics_code, _) = get(&client, &agent, "/metrics").await;
        assert_eq!(metrics_code, 200);
        if code == 503 {
            assert!(
                health.contains("outbox writer"),
                "/health names the stalled loop: {health}"
            );
            // Only the writer waits for the disk; the main loop goes on.
            assert!(
                !health.contains("main loop"),
                "the main loop waited for the frozen disk: {health}"
            );
            break body;
        }
        assert_eq!(code, 200, "{body}");
        assert!(
            frozen_at.elapsed() < STALL_BOUND,
            "/live still 200 after {:?} of frozen writes\n{}",
            frozen_at.elapsed(),
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let took = frozen_at.elapsed();
    assert!(stalled.contains("outbox writer"), "{stalled}");
    assert!(
        took >= Duration::from_secs(55),
        "not before the documented 60 s: {took:?} {stalled}"
    );
    println!("/live failed {took:?} after the freeze: {stalled}");
    let made_while_frozen = get(&client, &agent, "/v1/status").await.1;
    let last_while_frozen = serde_json::from_str::<serde_json::Value>(&made_while_frozen).unwrap()
        ["outbox"]["last_seq"]
        .as_u64()
        .unwrap();

    disk.thaw();
    let thawed_at = Instant::now();
    loop {
        let (code, body) = get(&client, &agent, "/live").await;
        if code == 200 {
            break;
        }
        assert!(
            thawed_at.elapsed() < Duration::from_secs(30),
            "/live never recovered: {body}\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Heartbeats (one a second) were made all through the freeze, queued
    // in memory; each reaches the webhook once the writes go through.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: BTreeSet<u64> = received_events(&receiver).iter().map(|e| e.seq).collect();
        if (1..=last_while_frozen).all(|s| got.contains(&s)) {
            break;
        }
        let missing: Vec<u64> = (1..=last_while_frozen)
            .filter(|s| !got.contains(s))
            .collect();
        assert!(
            Instant::now() < deadline,
            "events made while frozen not delivered: {missing:?}\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        last_while_frozen >= 50,
        "heartbeats were made while frozen: last seq {last_while_frozen}"
    );
    assert_eq!(agent.stop(), Some(0), "clean exit\n{}", agent.log_text());
}

/// Each probe's answer while the disk is frozen and every connection slot
/// is held (docs/design.md, "Connections"; issue 25).
const PROBE_BOUND: Duration = Duration::from_secs(1);

/// The worst moment at once: the state directory frozen, a worker turning
/// unhealthy (its verdict is an event the outbox cannot write), and 300
/// connections held open on the TCP listener (its bound is 256). `/live`,
/// `/ready` and `/health` each answer on a new connection within 1 s all
/// along, and `/health` turns 503 naming the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_within_a_second_while_frozen_with_every_slot_held_and_a_worker_turning_unhealthy()
 {
    const TEST: &str = "probes_answer_within_a_second_while_frozen_with_every_slot_held_and_a_worker_turning_unhealthy";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    let mut disk = Ext4::mount(64);
    let state = disk.dir("state");
    let worker = TestCgroup::create("frozen-worker");
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "sample_interval = \"100ms\"\nheartbeat_interval = \"1s\"\n[[worker]]\nname = \"w1\"\n\
             cgroup = \"{}\"\nsoft_cap = \"64MiB\"\nunhealthy_after = \"2s\"\n",
            worker.path_str()
        ),
    )
    .unwrap();
    let agent = Agent::start_in(&state, &["--config", config.path().to_str().unwrap()]).await;
    let _thaw = disk.thaw_on_drop();
    let addr = agent
        .base_url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();

    disk.freeze();
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    let _hog = worker.hog(100);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    loop {
        let mut unhealthy = false;
        for path in ["/live", "/ready", "/health"] {
            // A new connection for each probe, as kubelet makes them.
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let asked = Instant::now();
            let answer = client
                .get(format!("{}{path}", agent.base_url))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{path}, frozen, 300 held: {e}\n{}", agent.log_text()));
            let code = answer.status().as_u16();
            let body = answer.text().await.unwrap_or_default();
            let took = asked.elapsed();
            slowest = slowest.max(took);
            probes += 1;
            assert!(
                took < PROBE_BOUND,
                "{path} took {took:?} (frozen, 300 held): {code} {body}"
            );
            match path {
                "/health" => {
                    assert!(code == 200 || code == 503, "{body}");
                    let health: serde_json::Value = serde_json::from_str(&body).expect("JSON");
                    unhealthy = code == 503
                        && health["workers"].as_array().is_some_and(|ws| {
                            ws.iter()
                                .any(|w| w["name"] == "w1" && w["status"] == "unhealthy")
                        });
                }
                _ => assert_eq!(code, 200, "{path}: {body}"),
            }
        }
        if unhealthy {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "w1 never turned unhealthy while frozen\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The verdict's event was made while writes hang: it waits in memory.
    let status: serde_json::Value = reqwest::get(format!("{}/v1/status", agent.base_url))
        .await
        .expect("status")
        .json()
        .await
        .expect("status JSON");
    assert!(
        status["outbox"]["pending"].as_u64().unwrap_or(0) > 0,
        "events wait for the frozen disk: {}",
        status["outbox"]
    );
    println!(
        "frozen, 300 connections held, w1 unhealthy after {:?}: {probes} probes, slowest {slowest:?}",
        started.elapsed()
    );
    drop(held);
}
