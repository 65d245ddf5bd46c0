//! The kernel ring buffer (EVENTS_RING_BYTES) overflows while the agent's
//! reader is stopped (SIGSTOP): the loss is counted in the kernel and in the
//! metrics, and /health says `degraded`, naming it. Root only; never
//! skipped in CI.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use agent_common::{CgroupRecord, EVENTS_RING_BYTES};
use memwatch::EventKind;
use memwatch_test_support::{metrics::metric, process::wait_timeout};
use memwatch_tests::{agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, memhog_in};

/// Each mkdir and each rmdir writes one CgroupRecord (plus an 8-byte
/// header); twice the ring's worth of records is sure to overflow it.
fn cgroups_to_churn() -> usize {
    let record = size_of::<CgroupRecord>() + 8;
    EVENTS_RING_BYTES as usize / record + 64
}

/// The value of a counter series in `/metrics`, 0 while it is not there.
fn counter(text: &str, series: &str) -> f64 {
    metric(text, series).unwrap_or(0.0)
}

/// One test at a time: each churns cgroups, and every agent's probe sees
/// every cgroup made on the host, so one test's churn overflowed the other
/// agent's ring (157 drops where the other test expected none, in a CI run).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// SIGCONTs the agent even when the test fails half way.
struct Resume<'a>(&'a Agent);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.signal(libc::SIGCONT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ring_buffer_is_counted_and_degrades_health() {
    if !kernel_tests_enabled("a_full_ring_buffer_is_counted_and_degrades_health") {
        return;
    }
    let _serial = SERIAL.lock().await;
    let agent = Agent::start(&[]).await;
    let (_, metrics) = agent.get("/metrics").await;
    assert_eq!(
        counter(
            &metrics,
            "memwatch_probe_kernel_total{counter=\"ringbuf_full\"}"
        ),
        0.0,
        "{metrics}"
    );
    let parent = Path::new("/sys/fs/cgroup/memory")
        .join(format!("memwatch-chaos-ring-{}", std::process::id()));
    std::fs::create_dir(&parent).expect("a v1 memory cgroup");
    {
        agent.signal(libc::SIGSTOP);
        let _resume = Resume(&agent);
        let n = cgroups_to_churn();
        let started = Instant::now();
        for i in 0..n {
            let child = parent.join(format!("c{i}"));
            std::fs::create_dir(&child).expect("mkdir");
            std::fs::remove_dir(&child).expect("rmdir");
        }
        eprintln!("{n} cgroups made and removed in {:?}", started.elapsed());
    }
    std::fs::remove_dir(&parent).expect("remove the parent cgroup");

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, metrics) = agent.get("/metrics").await;
        let kernel = counter(
            &metrics,
            "memwatch_probe_kernel_total{counter=\"ringbuf_full\"}",
        );
        let dropped = counter(
            &metrics,
            "memwatch_events_dropped_total{reason=\"ringbuf_full\"}",
        );
        let (code, body) = agent.get("/health").await;
        let health: serde_json::Value = serde_json::from_str(&body).unwrap();
        let named = health["reasons"].as_array().is_some_and(|r| {
            r.iter()
                .any(|r| r.as_str().is_some_and(|r| r.contains("ring buffer full")))
        });
        if kernel > 0.0 && dropped > 0.0 && named {
            assert_eq!(code, 200, "degraded is still 200: {body}");
            assert_eq!(health["status"], "degraded", "{body}");
            assert_eq!(kernel, dropped, "both count the same loss");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no loss reported: kernel {kernel}, dropped {dropped}, health {body}\nlog:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The agent still works after the overflow.
    let (code, _) = agent
        .post("/v1/tasks", Some(serde_json::json!({ "task_id": "after" })))
        .await;
    assert_eq!(code, 201);
}

/// An OOM kill whose record the full ring buffer dropped is still
/// reported, once, from the kernel's counters: the loss triggers a walk,
/// and a kill no live event accounted for becomes an `oom_kill` with
/// `recovered: true` for its cgroup within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_lost_to_a_full_ring_buffer_is_recovered_from_the_counters() {
    const TEST: &str = "a_kill_lost_to_a_full_ring_buffer_is_recovered_from_the_counters";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let agent = Agent::start(&[]).await;
    let victim = TestCgroup::create("ring-lost-kill");
    victim.limit(64 << 20);
    let churn = TestCgroup::create("ring-churn");
    {
        agent.signal(libc::SIGSTOP);
        let _resume = Resume(&agent);
        for i in 0..cgroups_to_churn() {
            let child = churn.path().join(format!("c{i}"));
            std::fs::create_dir(&child).expect("mkdir");
            std::fs::remove_dir(&child).expect("rmdir");
        }
        // The ring is full: this kill's record has no room.
        let mut hog = memhog_in(victim.path(), 200, 30).spawn().expect("memhog");
        let status = wait_timeout(&mut hog, Duration::from_secs(30))
            .expect("wait memhog")
            .expect("memhog OOM-killed within 30 s");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    }
    let resumed = Instant::now();
    let kills = |events: &[memwatch::Event]| -> Vec<memwatch::Event> {
        events
            .iter()
            .filter(|e| {
                e.body.kind == EventKind::OomKill
                    && e.body.cgroup.as_deref() == Some(victim.path_str())
            })
            .cloned()
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    let found = loop {
        let found = kills(&agent.all_events().await);
        if !found.is_empty() || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let took = resumed.elapsed();
    assert_eq!(
        found.len(),
        1,
        "one report of the lost kill; log:\n{}",
        agent.log_text()
    );
    assert_eq!(found[0].body.recovered, Some(true), "{:?}", found[0]);
    assert!(
        found[0]
            .body
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("1 OOM kill that no live event"),
        "{:?}",
        found[0]
    );
    // Nothing twice: later checks and walks add nothing.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(kills(&agent.all_events().await).len(), 1);
    println!(
        "a kill lost to a full ring buffer: recovered from the counters {took:?} after the reader resumed"
    );
}
