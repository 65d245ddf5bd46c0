//! The kill predictor against the real kernel: a process leaking ~10 MiB/s
//! into a memory cgroup limited to 256 MiB is warned of (`oom_imminent`
//! with an ETA) seconds before the real OOM kill, and the kill says how
//! early. Root only; never skipped in CI.

use std::time::Duration;

use memwatch::EventKind;
use memwatch_test_support::memhog::RATE_ENV;
use memwatch_tests::{agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, memhog_in};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 256 * MIB;

#[tokio::test]
async fn a_steady_leak_is_warned_of_seconds_before_the_real_kill() {
    if !kernel_tests_enabled("a_steady_leak_is_warned_of_seconds_before_the_real_kill") {
        return;
    }
    let cgroup = TestCgroup::create("predict");
    cgroup.limit(LIMIT);
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"1s\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        cgroup.path_str()
    ))
    .await;

    // 400 MiB at 10 MiB/s: the limit is reached after ~26 s.
    let mut child = memhog_in(cgroup.path(), 400, 60)
        .env(RATE_ENV, "10")
        .spawn()
        .expect("spawn memhog");
    let pid = child.id();
    // Generous: the leak takes ~26 s when the machine keeps up; a loaded
    // one only makes it slower, which makes the warning earlier.
    let kill = agent
        .poll_event(Duration::from_secs(180), Duration::from_millis(100), |e| {
            e.body.kind == EventKind::OomKill && e.body.pid.is_some()
        })
        .await;
    let _ = child.kill();
    let _ = child.wait();
    let Some((kill, _)) = kill else {
        panic!(
            "no oom_kill for memhog (pid {pid}); agent log:\n{}",
            agent.log_text()
        );
    };
    let events = agent.events(0).await;
    let imminent: Vec<_> = events
        .iter()
        .filter(|e| e.body.kind == EventKind::OomImminent && e.seq < kill.seq)
        .collect();
    let first = imminent.first().unwrap_or_else(|| {
        panic!(
            "no oom_imminent before the kill: {events:#?}\nagent log:\n{}",
            agent.log_text()
        )
    });
    assert_eq!(first.body.cgroup.as_deref(), Some(cgroup.path_str()));
    assert_eq!(first.body.worker.as_deref(), Some("w1"));
    assert_eq!(first.body.limit_bytes, Some(LIMIT));
    assert_eq!(first.body.limit_cgroup.as_deref(), Some(cgroup.path_str()));
    let eta = first.body.eta_seconds.expect("eta_seconds");
    assert!(
        eta > 0.0 && eta <= 60.0,
        "eta {eta} within the 60 s horizon"
    );
    let lead = kill
        .body
        .predicted_lead_seconds
        .unwrap_or_else(|| panic!("the kill carries no lead: {kill:#?}"));
    let error = kill.body.eta_error_seconds.expect("eta_error_seconds");
    eprintln!(
        "first oom_imminent: eta {eta:.1} s; kill: lead {lead:.1} s, eta error {error:+.1} s \
         ({} oom_imminent before it)",
        imminent.len()
    );
    assert!(lead >= 3.0, "warned only {lead} s ahead");
    // The kill time is the agent's, stamped when it handles the kill.
    let wall = (kill.time - first.time)
        .to_std()
        .unwrap_or_default()
        .as_secs_f64();
    assert!(
        wall + 1.0 >= lead,
        "lead {lead} s longer than the events' {wall} s apart"
    );
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics.contains("memwatch_predict_lead_seconds_count 1"),
        "{metrics}"
    );
}
