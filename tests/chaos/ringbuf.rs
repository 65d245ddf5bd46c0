//! The kernel ring buffers overflow while the agent's reader is stopped
//! (SIGSTOP): the loss is counted in the kernel and in the metrics, /health
//! says `degraded`, naming it; an OOM kill amid cgroup churn that fills the
//! event ring is still seen live (its ring is its own); kills a full OOM
//! ring dropped are recovered from the kernel's counters. Root only; never
//! skipped in CI.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use agent_common::{CgroupRecord, EVENTS_RING_BYTES};
use memwatch::EventKind;
use memwatch_test_support::{metrics::metric, process::wait_timeout};
use memwatch_tests::{
    agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, kills_reported, memhog_in,
};

/// Each mkdir and each rmdir writes one CgroupRecord (plus an 8-byte
/// header); twice the ring's worth of records is sure to overflow it.
fn cgroups_to_churn() -> usize {
    let record = size_of::<CgroupRecord>() + 8;
    EVENTS_RING_BYTES as usize / record + 64
}

/// The kernel's count of records a full ring had no room for.
const RINGBUF_FULL: &str = "memwatch_probe_records_lost_total";

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
    assert_eq!(counter(&metrics, RINGBUF_FULL), 0.0, "{metrics}");
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
        let kernel = counter(&metrics, RINGBUF_FULL);
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

/// Runs memhog in `cgroup` (limited below what it takes) until the kernel
/// kills it.
fn oom_kill_in(cgroup: &TestCgroup) {
    let mut hog = memhog_in(cgroup.path(), 200, 30).spawn().expect("memhog");
    let status = wait_timeout(&mut hog, Duration::from_secs(30))
        .expect("wait memhog")
        .expect("memhog OOM-killed within 30 s");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
}

/// Cgroup churn that overflows the event ring while an OOM kill happens:
/// the kill has a ring of its own and is reported live, victim named; the
/// churn's loss is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_amid_churn_that_fills_the_event_ring_is_reported_live() {
    const TEST: &str = "a_kill_amid_churn_that_fills_the_event_ring_is_reported_live";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let agent = Agent::start(&[]).await;
    let victim = TestCgroup::create("ring-amid-churn");
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
        // The event ring is full now; the kill's record goes to its own.
        oom_kill_in(&victim);
    }
    let resumed = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    let kill = loop {
        let events = agent.all_events().await;
        if let Some(kill) = events.into_iter().find(|e| {
            e.body.kind == EventKind::OomKill && e.body.cgroup.as_deref() == Some(victim.path_str())
        }) {
            break kill;
        }
        assert!(
            Instant::now() < deadline,
            "no oom_kill; log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = resumed.elapsed();
    assert_ne!(kill.body.recovered, Some(true), "seen live: {kill:?}");
    assert!(kill.body.pid.is_some(), "the victim is named: {kill:?}");
    // The kernel's counters are published every few seconds.
    let lost = loop {
        let (_, metrics) = agent.get("/metrics").await;
        let lost = counter(&metrics, RINGBUF_FULL);
        if lost > 0.0 {
            break lost;
        }
        assert!(
            Instant::now() < deadline,
            "the churn overflowed the event ring: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // Once: the walk the loss triggers finds it accounted for.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        kills_reported(&agent.all_events().await, victim.path_str()),
        (1, 0)
    );
    println!(
        "a kill amid churn that dropped {lost} records: reported live {took:?} after the reader resumed, pid {:?}",
        kill.body.pid
    );
}

/// Kills whose records a full OOM ring dropped (the ring made small, the
/// reader stopped) are still reported, each once, from the kernel's
/// counters: the loss triggers a walk, and kills no live event accounted
/// for become `oom_kill` events with `recovered: true` within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_lost_to_a_full_oom_ring_are_recovered_from_the_counters() {
    const TEST: &str = "kills_lost_to_a_full_oom_ring_are_recovered_from_the_counters";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    // One page: 42 records of 96 bytes.
    let agent = Agent::start(&["--probe-oom-ring-bytes", "4096"]).await;
    let victim = TestCgroup::create("ring-lost-kills");
    victim.limit(32 << 20);
    const KILLS: u64 = 50;
    let made = Instant::now();
    {
        agent.signal(libc::SIGSTOP);
        let _resume = Resume(&agent);
        for _ in 0..KILLS {
            oom_kill_in(&victim);
        }
    }
    let made = made.elapsed();
    let resumed = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(40);
    let (live, recovered) = loop {
        let found = kills_reported(&agent.all_events().await, victim.path_str());
        if found.0 + found.1 >= KILLS || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let took = resumed.elapsed();
    assert_eq!(
        live + recovered,
        KILLS,
        "every kill, once: {live} live + {recovered} recovered; log:\n{}",
        agent.log_text()
    );
    assert!(recovered > 0, "the small ring dropped some: {live} live");
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        counter(&metrics, RINGBUF_FULL) > 0.0,
        "the loss is counted: {metrics}"
    );
    // Nothing twice: later checks and walks add nothing.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        kills_reported(&agent.all_events().await, victim.path_str()),
        (live, recovered)
    );
    println!(
        "{KILLS} kills in {made:?} with the reader stopped and a one-page OOM ring: {live} reported live, \
         {recovered} recovered from the counters, all {took:?} after the reader resumed"
    );
}
