//! The kill predictor against the real kernel: a process leaking ~10 MiB/s
//! into a memory cgroup is warned of (`oom_imminent` with an ETA) seconds
//! before the real OOM kill, and the kill says how early; when a parent's
//! limit comes first, the warning names the parent; above `memory.high`
//! (cgroup v2) the warning says the kernel throttles the growth. Root only;
//! never skipped in CI (the v2 case runs in the VM matrix's v2 kernels).

use std::{path::Path, time::Duration};

use memwatch::{Event, EventKind};
use memwatch_test_support::{memhog::RATE_ENV, metrics::metric};
use memwatch_tests::{agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, memhog_in};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 256 * MIB;

/// memhog leaking `mib` MiB at 10 MiB/s in `cgroup` until the kernel
/// kills it: the `oom_kill` event, and the `oom_imminent`s of `cgroup`
/// before it.
async fn leak_until_killed(agent: &Agent, cgroup: &Path, mib: u64) -> (Event, Vec<Event>) {
    let mut child = memhog_in(cgroup, mib, 60)
        .env(RATE_ENV, "10")
        .spawn()
        .expect("spawn memhog");
    let pid = child.id();
    let cgroup = cgroup.to_str().expect("UTF-8 cgroup path");
    // Generous: the leak takes ~26 s when the machine keeps up; a loaded
    // one only makes it slower, which makes the warning earlier. The kill
    // in this cgroup: every agent reports every kill on the host, and the
    // other tests of this binary run beside this one.
    let kill = agent
        .poll_event(Duration::from_secs(240), Duration::from_millis(100), |e| {
            e.body.kind == EventKind::OomKill
                && e.body.pid.is_some()
                && e.body.cgroup.as_deref() == Some(cgroup)
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
    let imminent = agent
        .events(0)
        .await
        .into_iter()
        .filter(|e| {
            e.body.kind == EventKind::OomImminent
                && e.seq < kill.seq
                && e.body.cgroup.as_deref() == Some(cgroup)
        })
        .collect();
    (kill, imminent)
}

/// The kill's lead (asserted ≥ 3 s and no longer than the events' own
/// distance) and ETA error, for the test's line.
fn lead_of(kill: &Event, first: &Event) -> (f64, f64) {
    let lead = kill
        .body
        .predicted_lead_seconds
        .unwrap_or_else(|| panic!("the kill carries no lead: {kill:#?}"));
    let error = kill.body.eta_error_seconds.expect("eta_error_seconds");
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
    (lead, error)
}

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
    let (kill, imminent) = leak_until_killed(&agent, cgroup.path(), 400).await;
    let first = imminent.first().unwrap_or_else(|| {
        panic!(
            "no oom_imminent before the kill\nagent log:\n{}",
            agent.log_text()
        )
    });
    assert_eq!(first.body.worker.as_deref(), Some("w1"));
    assert_eq!(first.body.limit_bytes, Some(LIMIT));
    assert_eq!(first.body.limit_cgroup.as_deref(), Some(cgroup.path_str()));
    let eta = first.body.eta_seconds.expect("eta_seconds");
    assert!(
        eta > 0.0 && eta <= 60.0,
        "eta {eta} within the 60 s horizon"
    );
    let (lead, error) = lead_of(&kill, first);
    eprintln!(
        "first oom_imminent: eta {eta:.1} s; kill: lead {lead:.1} s, eta error {error:+.1} s \
         ({} oom_imminent before it)",
        imminent.len()
    );
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics.contains("memwatch_predict_lead_seconds_count 1"),
        "{metrics}"
    );
    // With the growth program attached, the predictor read the cgroup
    // when the kernel's samples said it moved, not by asking it.
    if metric(&metrics, "memwatch_probe_growth_runs_total").unwrap_or(0.0) > 0.0 {
        let samples = metric(&metrics, r#"memwatch_growth_lines_total{line="sample"}"#);
        let kernel = metric(&metrics, r#"memwatch_predict_reads_total{why="kernel"}"#);
        let polled = metric(&metrics, r#"memwatch_predict_reads_total{why="poll"}"#);
        eprintln!("kernel samples {samples:?}, reads on a sample {kernel:?}, polled {polled:?}");
        // ~26 s of leak, near the limit (over half) for ~13 s of it.
        assert!(
            samples.unwrap_or(0.0) >= 50.0,
            "samples {samples:?}\n{metrics}"
        );
        assert!(kernel.unwrap_or(0.0) >= 50.0, "reads {kernel:?}\n{metrics}");
        assert_eq!(polled, None, "nothing polled while the kernel follows it");
    }
}

/// A job cgroup with a limit of its own of 1 GiB inside a worker limited
/// to 256 MiB: the worker's limit is reached first, and the job's warning
/// names it (`limit_cgroup`: the worker's cgroup).
#[tokio::test]
async fn a_parents_limit_reached_first_is_the_one_the_warning_names() {
    if !kernel_tests_enabled("a_parents_limit_reached_first_is_the_one_the_warning_names") {
        return;
    }
    let worker = TestCgroup::create("predict-parent");
    worker.limit(LIMIT);
    let job = worker.child("job-1");
    job.limit(1024 * MIB);
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"1s\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{w}\"\n\
         [[rule]]\nworker = \"w1\"\ncgroup = \"{w}/job-*\"\n",
        w = worker.path_str()
    ))
    .await;
    // Let the rule find the job before it grows.
    agent
        .poll_event(Duration::from_secs(10), Duration::from_millis(100), |e| {
            e.body.kind == EventKind::TaskStarted
        })
        .await
        .expect("the rule's task_started for the job");

    let (kill, imminent) = leak_until_killed(&agent, job.path(), 400).await;
    let first = imminent.first().unwrap_or_else(|| {
        panic!(
            "no oom_imminent of the job before the kill\nagent log:\n{}",
            agent.log_text()
        )
    });
    assert_eq!(first.body.worker.as_deref(), Some("w1"));
    assert_eq!(
        (first.body.limit_bytes, first.body.limit_cgroup.as_deref()),
        (Some(LIMIT), Some(worker.path_str())),
        "the parent's limit, not the job's own 1 GiB: {first:#?}"
    );
    let (lead, error) = lead_of(&kill, first);
    eprintln!(
        "the job's first oom_imminent names the parent's 256 MiB (eta {:?} s); kill: lead {lead:.1} s, \
         eta error {error:+.1} s",
        first.body.eta_seconds
    );
    drop(job);
}

/// cgroup v2, `memory.high` at 0.9 × `memory.max`: the kernel throttles
/// the leak above `memory.high`, and the warning says so (`throttled`).
/// On cgroup v1 (no `memory.high`) it says why it checks nothing else; the
/// VM matrix runs it on v2 kernels.
#[tokio::test]
async fn above_memory_high_the_warning_says_the_growth_is_throttled() {
    if !kernel_tests_enabled("above_memory_high_the_warning_says_the_growth_is_throttled") {
        return;
    }
    let cgroup = TestCgroup::create("predict-high");
    if !cgroup.path().join("memory.high").exists() {
        eprintln!("cgroup v1: no memory.high here; the v2 kernels of the VM matrix run this");
        return;
    }
    cgroup.limit(LIMIT);
    let high = LIMIT / 10 * 9;
    std::fs::write(cgroup.path().join("memory.high"), high.to_string()).expect("set memory.high");
    // A horizon of 10 min: throttled, the last 10 % may take minutes, and
    // what is checked is the flag, not the horizon.
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"1s\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n\
         predict_horizon = \"10m\"\n",
        cgroup.path_str()
    ))
    .await;
    let mut child = memhog_in(cgroup.path(), 400, 120)
        .env(RATE_ENV, "10")
        .spawn()
        .expect("spawn memhog");
    let throttled = agent
        .poll_event(Duration::from_secs(180), Duration::from_millis(100), |e| {
            e.body.kind == EventKind::OomImminent && e.body.throttled == Some(true)
        })
        .await;
    let _ = child.kill();
    let _ = child.wait();
    let events = agent.events(0).await;
    let Some((throttled, _)) = throttled else {
        panic!(
            "no oom_imminent saying throttled above memory.high: {events:#?}\nagent log:\n{}",
            agent.log_text()
        );
    };
    let usage = throttled.body.rss_bytes.unwrap_or(0);
    assert!(
        usage >= high,
        "said throttled at {usage} bytes, below memory.high {high}"
    );
    eprintln!(
        "above memory.high ({} MiB of {} MiB): oom_imminent throttled, {:?} B/s, eta {:?} s",
        high / MIB,
        LIMIT / MIB,
        throttled.body.growth_bytes_per_sec,
        throttled.body.eta_seconds
    );
}
