//! Kernel tests of the OOM path: a real OOM kill in a real memory cgroup,
//! reported by the real agent over HTTP. Root only; never skipped in CI.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use memwatch::{Event, EventKind, OomConstraint};
use memwatch_test_support::{agent::UNPRIVILEGED, metrics::metric, process::wait_timeout};
use memwatch_tests::{
    agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, memhog_in, workspace_bin,
};

const MIB: u64 = 1 << 20;
/// How often the OOM tests read the events: the time an event is first
/// seen is measured.
const EVENT_POLL: Duration = Duration::from_millis(2);

#[tokio::test]
async fn oom_kill_in_a_memory_cgroup_is_reported_with_pid_comm_and_cgroup() {
    if !kernel_tests_enabled("oom_kill_in_a_memory_cgroup_is_reported_with_pid_comm_and_cgroup") {
        return;
    }
    let mut agent = Agent::start(&[]).await;
    let cgroup = TestCgroup::create("oom");
    cgroup.limit(64 * MIB);

    let mut child = memhog_in(cgroup.path(), 200, 30)
        .spawn()
        .expect("spawn memhog");
    let pid = child.id();

    let seen = agent
        .poll_event(Duration::from_secs(30), EVENT_POLL, |e| {
            e.body.kind == EventKind::OomKill && e.body.pid == Some(pid)
        })
        .await;
    let status = child.wait().expect("wait memhog");
    let exited = chrono::Utc::now();
    let Some((event, seen_at)) = seen else {
        panic!(
            "no oom_kill event for pid {pid} (memhog exit: {status}); agent log:\n{}",
            agent.log_text()
        );
    };

    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "memhog must die of the OOM killer: {status}"
    );
    assert_eq!(event.body.comm.as_deref(), Some("memhog"));
    assert_eq!(
        event.body.cgroup.as_deref(),
        Some(cgroup.path().to_str().unwrap())
    );
    assert_eq!(event.host, "test-node");
    assert_eq!(event.body.constraint, Some(OomConstraint::Cgroup));
    assert_eq!(event.body.limit_cgroup.as_deref(), Some(cgroup.path_str()));
    let rss = event.body.rss_bytes.expect("rss_bytes");
    assert!(
        (32 * MIB..=80 * MIB).contains(&rss),
        "victim RSS {} MiB should be near the 64 MiB limit",
        rss / MIB
    );
    let delay = (seen_at - event.time).to_std().unwrap_or_default();
    eprintln!(
        "OOM kill → event visible on /v1/events: {:.1} ms (kernel time {}, seen {}, exit seen {})",
        delay.as_secs_f64() * 1e3,
        event.time,
        seen_at,
        exited
    );
    assert!(
        delay < Duration::from_secs(1),
        "event took {delay:?} to appear"
    );

    let (_, metrics) = agent.get("/metrics").await;
    let kills = metric(&metrics, "memwatch_oom_kills_total{constraint=\"cgroup\"}")
        .expect("memwatch_oom_kills_total{constraint=\"cgroup\"} in /metrics");
    assert!(kills >= 1.0, "{metrics}");

    // `memwatch events --json` prints the same event as one JSON line.
    let out = Command::new(workspace_bin("memwatch"))
        .args(["events", "--json", "--agent", &agent.base_url])
        .output()
        .expect("memwatch events");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<Event> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert!(printed.iter().any(|e| e.id == event.id), "{printed:?}");
    assert_eq!(printed[0].body.kind, EventKind::AgentStarted);

    assert_eq!(
        agent.stop(),
        Some(0),
        "clean exit on SIGTERM; log:\n{}",
        agent.log_text()
    );
}

#[tokio::test]
async fn without_bpf_capabilities_run_names_the_missing_capability() {
    if !kernel_tests_enabled("without_bpf_capabilities_run_names_the_missing_capability") {
        return;
    }
    // As an unprivileged user with no capabilities at all, eBPF demanded.
    let out = Command::new(UNPRIVILEGED[0])
        .args(&UNPRIVILEGED[1..])
        .arg(workspace_bin("memwatch"))
        .args(["run", "--listen", "127.0.0.1:0", "--source", "ebpf"])
        .output()
        .expect("setpriv (util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "must fail without privileges: {stderr}"
    );
    assert!(
        stderr.contains("missing capability CAP_BPF, CAP_PERFMON"),
        "error must name the capabilities: {stderr}"
    );
}

/// The `oom_kill` event of `pid`, or a panic with the agent's log (2 s).
async fn oom_event_of(agent: &Agent, pid: u32) -> Event {
    agent
        .poll_event(Duration::from_secs(2), EVENT_POLL, |e| {
            e.body.kind == EventKind::OomKill && e.body.pid == Some(pid)
        })
        .await
        .map(|(event, _)| event)
        .unwrap_or_else(|| panic!("no oom_kill for {pid}; log:\n{}", agent.log_text()))
}

/// Runs `memhog 200` in the cgroup at `cgroup` and waits for it to die
/// (bounded).
fn oom_in(cgroup: &Path) -> (u32, std::process::ExitStatus) {
    let mut child = memhog_in(cgroup, 200, 30).spawn().expect("spawn memhog");
    let pid = child.id();
    let Some(status) = wait_timeout(&mut child, Duration::from_secs(30)).expect("wait memhog")
    else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("memhog was not OOM-killed within 30 s");
    };
    (pid, status)
}

/// A parent cgroup limited to 64 MiB with a child cgroup, and `memhog 200`
/// OOM-killed in the child by the parent's limit: (parent, child, pid,
/// exit status). Drop the child first.
fn oom_in_nested(
    name: &str,
) -> (
    TestCgroup,
    memwatch::OwnedCgroup,
    u32,
    std::process::ExitStatus,
) {
    let parent = TestCgroup::create(name);
    parent.limit(64 * MIB);
    let child = memwatch::OwnedCgroup::create(parent.path().join("child")).expect("child cgroup");
    let (pid, status) = oom_in(child.path());
    (parent, child, pid, status)
}

/// Kernels before 6.2 pass `mark_victim` only a pid; the probe then finds
/// the victim's task through the SIGKILL the OOM killer sent it
/// (`signal/signal_generate`). No kernel in the matrix needs that path any
/// more (Debian backported the task argument), so it is forced here
/// (`--probe-oom-by-pid`: the task's pid only), and must give the same
/// full attribution, nested limit included.
#[tokio::test]
async fn the_pid_only_oom_path_through_signal_generate_gives_full_attribution() {
    if !kernel_tests_enabled("the_pid_only_oom_path_through_signal_generate_gives_full_attribution")
    {
        return;
    }
    let agent = Agent::start(&["--probe-oom-by-pid"]).await;
    let (parent, child, pid, status) = oom_in_nested("bypid");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    let event = oom_event_of(&agent, pid).await;
    assert_eq!(event.body.comm.as_deref(), Some("memhog"), "{event:?}");
    assert_eq!(
        event.body.cgroup.as_deref(),
        child.path().to_str(),
        "{event:?}"
    );
    assert_eq!(
        event.body.limit_cgroup.as_deref(),
        Some(parent.path_str()),
        "{event:?}"
    );
    assert!(event.body.rss_bytes.unwrap_or(0) > 32 * MIB, "{event:?}");
    let log = agent.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("probe attached") && l.contains("signal/signal_generate")),
        "the signal_generate hook is attached; log:\n{log}"
    );
    drop(child);
}

#[tokio::test]
async fn nested_oom_names_the_parent_whose_limit_was_hit() {
    if !kernel_tests_enabled("nested_oom_names_the_parent_whose_limit_was_hit") {
        return;
    }
    let agent = Agent::start(&[]).await;
    let (parent, child, pid, _) = oom_in_nested("parent");
    let event = oom_event_of(&agent, pid).await;
    assert_eq!(
        event.body.cgroup.as_deref(),
        child.path().to_str(),
        "the victim's own cgroup"
    );
    assert_eq!(
        event.body.limit_cgroup.as_deref(),
        Some(parent.path_str()),
        "the limit hit"
    );
    assert_eq!(event.body.constraint, Some(OomConstraint::Cgroup));
    drop(child);
}

#[tokio::test]
async fn cgroup_removed_right_after_its_oom_still_resolves_to_its_path() {
    if !kernel_tests_enabled("cgroup_removed_right_after_its_oom_still_resolves_to_its_path") {
        return;
    }
    let agent = Agent::start(&[]).await;
    // Made after the agent started: only the cgroup_mkdir probe can have told it.
    let cgroup = TestCgroup::create("shortlived");
    cgroup.limit(64 * MIB);
    let path = cgroup.path_str().to_string();
    let (pid, _) = oom_in(cgroup.path());
    drop(cgroup); // rmdir at once
    assert!(!std::path::Path::new(&path).exists());
    let event = oom_event_of(&agent, pid).await;
    assert_eq!(
        event.body.cgroup.as_deref(),
        Some(path.as_str()),
        "{event:?}"
    );
}

#[tokio::test]
async fn oom_kill_while_the_agent_was_down_is_reported_at_the_next_start() {
    if !kernel_tests_enabled("oom_kill_while_the_agent_was_down_is_reported_at_the_next_start") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::create("missed");
    cgroup.limit(64 * MIB);
    let mut agent = Agent::start_in(state.path(), &[]).await;
    assert_eq!(agent.stop(), Some(0), "log:\n{}", agent.log_text());

    // The kill happens while no agent runs.
    let status = memhog_in(cgroup.path(), 200, 30)
        .status()
        .expect("run memhog");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "memhog must be OOM-killed: {status}"
    );

    let agent = Agent::start_in(state.path(), &[]).await;
    let path = cgroup.path().to_str().unwrap();
    let seen = agent
        .poll_event(Duration::from_secs(10), EVENT_POLL, |e| {
            e.body.kind == EventKind::OomKill && e.body.cgroup.as_deref() == Some(path)
        })
        .await;
    let Some((event, _)) = seen else {
        panic!(
            "no recovered oom_kill for {path}; log:\n{}",
            agent.log_text()
        );
    };
    let reason = event.body.reason.as_deref().unwrap_or_default();
    assert!(
        reason.starts_with("recovered after the fact: 1 OOM kill in this cgroup"),
        "{reason}"
    );
    assert_eq!(event.host, "test-node");
    // Exactly one: the kill is not reported again.
    let all = agent.events(0).await;
    let reported = all
        .iter()
        .filter(|e| e.body.kind == EventKind::OomKill && e.body.cgroup.as_deref() == Some(path))
        .count();
    assert_eq!(reported, 1, "{all:?}");
}

#[tokio::test]
async fn a_kill_seen_live_is_not_recovered_again_after_the_agent_is_sigkilled() {
    if !kernel_tests_enabled("a_kill_seen_live_is_not_recovered_again_after_the_agent_is_sigkilled")
    {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let live = TestCgroup::create("seenlive");
    live.limit(64 * MIB);
    let missed = TestCgroup::create("missedwhiledown");
    missed.limit(64 * MIB);
    let mut agent = Agent::start_in(state.path(), &[]).await;
    let (pid, _) = oom_in(live.path());
    oom_event_of(&agent, pid).await;
    // The agent reads again and saves the counters of cgroups with a live
    // kill every 5 s (agent.rs), not only at a clean exit: none here.
    tokio::time::sleep(Duration::from_secs(7)).await;
    agent.kill();

    // A kill while no agent runs: the control that the next start reconciles.
    oom_in(missed.path());
    let agent = Agent::start_in(state.path(), &[]).await;
    let recovered = |cgroup: &TestCgroup| {
        let path = cgroup.path().to_str().unwrap().to_string();
        move |e: &Event| {
            e.body.kind == EventKind::OomKill
                && e.body.cgroup.as_deref() == Some(path.as_str())
                && e.body
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("recovered after the fact"))
        }
    };
    let control = agent
        .poll_event(Duration::from_secs(10), EVENT_POLL, recovered(&missed))
        .await;
    assert!(
        control.is_some(),
        "the kill while the agent was down was not recovered; log:\n{}",
        agent.log_text()
    );
    let again: Vec<Event> = agent
        .events(0)
        .await
        .into_iter()
        .filter(recovered(&live))
        .collect();
    assert!(
        again.is_empty(),
        "a kill reported live was recovered again: {again:?}"
    );
}

#[tokio::test]
async fn without_bpf_the_agent_falls_back_to_polling_and_still_reports_oom_kills() {
    if !kernel_tests_enabled(
        "without_bpf_the_agent_falls_back_to_polling_and_still_reports_oom_kills",
    ) {
        return;
    }
    let agent = Agent::start_unprivileged(&[]).await;
    let (code, health) = agent.get("/health").await;
    assert_eq!(code, 200, "{health}");
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["source"], "poll");
    assert_eq!(health["status"], "degraded");
    let reasons = health["reasons"].to_string();
    assert!(
        reasons.contains("eBPF unavailable") && reasons.contains("CAP_BPF"),
        "{reasons}"
    );
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics.contains("memwatch_probe_source{source=\"poll\"} 1"),
        "{metrics}"
    );

    let cgroup = TestCgroup::create("polled");
    cgroup.limit(64 * MIB);
    let (_, status) = oom_in(cgroup.path());
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let path = cgroup.path_str().to_string();
    let started = Instant::now();
    let (event, _) = agent
        .poll_event(Duration::from_secs(5), EVENT_POLL, |e| {
            e.body.kind == EventKind::OomKill && e.body.cgroup.as_deref() == Some(path.as_str())
        })
        .await
        .unwrap_or_else(|| panic!("no polled oom_kill for {path}; log:\n{}", agent.log_text()));
    println!(
        "poll source: oom_kill reported {} ms after the kill",
        started.elapsed().as_millis()
    );
    assert!(
        event
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("seen by polling"),
        "{event:?}"
    );
    assert_eq!(event.body.constraint, Some(OomConstraint::Cgroup));
    assert_eq!(event.body.limit_cgroup.as_deref(), Some(path.as_str()));
}
