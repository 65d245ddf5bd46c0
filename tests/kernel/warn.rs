//! `memwatch exec --warn-signal` against the real kernel: a child leaking
//! ~10 MiB/s under a 256 MiB hard cap gets SIGUSR1 from exec, on the
//! agent's `oom_imminent`, seconds before the real OOM kill; and the agent
//! going away while exec follows it neither kills nor stalls the child.
//! Root only; never skipped in CI.

use std::{process::Stdio, time::Duration};

use memwatch::EventKind;
use memwatch_test_support::memhog::{RATE_ENV, SIGNAL_FILE_ENV, printed};
use memwatch_tests::{agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, workspace_bin};

const TASK: &str = "t-warn";

#[tokio::test]
async fn the_child_is_signalled_seconds_before_its_oom_kill() {
    if !kernel_tests_enabled("the_child_is_signalled_seconds_before_its_oom_kill") {
        return;
    }
    let worker = TestCgroup::create("warn");
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"1s\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        worker.path_str()
    ))
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let signal_file = dir.path().join("signals");

    // 400 MiB at 10 MiB/s under a 256 MiB cap: the kill comes after ~26 s.
    let exec = tokio::process::Command::new(workspace_bin("memwatch"))
        .args(["exec", "--socket"])
        .arg(agent.socket())
        .args(["--worker", "w1"])
        .args(["--task-id", TASK, "--hard-cap", "256MiB"])
        .args(["--warn-signal", "SIGUSR1", "--"])
        .arg(workspace_bin("memhog"))
        .args(["400", "60"])
        .env(RATE_ENV, "10")
        .env(SIGNAL_FILE_ENV, &signal_file)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .output();
    // Generous: the leak takes ~26 s when the machine keeps up; a loaded
    // one only makes it slower, which makes the warning earlier.
    let out = tokio::time::timeout(Duration::from_secs(180), exec)
        .await
        .unwrap_or_else(|_| panic!("exec still running after 180 s:\n{}", agent.log_text()))
        .expect("run memwatch exec");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(137),
        "the child was not OOM-killed; exec said:\n{stderr}\nagent log:\n{}",
        agent.log_text()
    );
    let sent = stderr
        .lines()
        .find(|l| l.contains("sent SIGUSR1"))
        .unwrap_or_else(|| panic!("exec said nothing of SIGUSR1:\n{stderr}"));
    assert!(sent.contains("ETA") && sent.contains(TASK), "{sent}");
    assert_eq!(
        stderr.matches("sent SIGUSR1").count(),
        1,
        "one signal per episode:\n{stderr}"
    );

    // Both times are the child's CLOCK_MONOTONIC: the handler's stamp, and
    // the last MiB it touched (no later than the kill, so the lead measured
    // is at most the real one).
    let lines = std::fs::read_to_string(&signal_file).expect("read the signal file");
    let handled = printed(&lines, "signal")
        .unwrap_or_else(|| panic!("the SIGUSR1 handler never ran:\n{stderr}"));
    let last_touched = lines
        .lines()
        .filter_map(|l| l.strip_prefix("touched "))
        .filter_map(|n| n.trim().parse::<i64>().ok())
        .max()
        .expect("memhog touched memory");
    let lead = (last_touched - handled) as f64 / 1e9;
    eprintln!("exec: {sent}\nhandler ran {lead:.1} s before the last MiB touched");
    assert!(
        lead >= 3.0,
        "the handler ran only {lead:.1} s before the kill"
    );

    let events = agent.events(0).await;
    let ours = |kind: EventKind| {
        events
            .iter()
            .any(|e| e.body.kind == kind && e.body.task_id.as_deref() == Some(TASK))
    };
    assert!(ours(EventKind::OomImminent), "{events:#?}");
    assert!(ours(EventKind::OomKill), "{events:#?}");
}

#[tokio::test]
async fn the_agent_going_away_neither_kills_nor_stalls_the_child() {
    if !kernel_tests_enabled("the_agent_going_away_neither_kills_nor_stalls_the_child") {
        return;
    }
    let worker = TestCgroup::create("warn-down");
    let mut agent = Agent::start_with_config(&format!(
        "[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        worker.path_str()
    ))
    .await;
    let started = std::time::Instant::now();
    let exec = tokio::process::Command::new(workspace_bin("memwatch"))
        .args(["exec", "--socket"])
        .arg(agent.socket())
        .args(["--worker", "w1", "--task-id", "t-down"])
        .args(["--warn-signal", "USR1", "--"])
        .args(["sh", "-c", "sleep 6; exit 7"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run memwatch exec");
    // Stop the agent once the task is registered (exec follows it by then).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = agent.get("/v1/status").await;
        if body.contains("\"t-down\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "t-down never registered: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.kill();
    let out = tokio::time::timeout(Duration::from_secs(60), exec.wait_with_output())
        .await
        .expect("exec stalled after the agent went away")
        .expect("wait for memwatch exec");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // CMD's own status: neither signalled nor killed.
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert_eq!(
        stderr.matches("cannot follow the agent's events").count(),
        1,
        "said once:\n{stderr}"
    );
    // Generous: `sleep 6` plus at most one bounded request and a pause.
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(40),
        "exec took {took:?}:\n{stderr}"
    );
}
