//! Kernel tests of the watchdog: real cgroups, real memory, the real agent
//! and `memwatch exec`. Root only; never skipped in CI.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use memwatch::{Event, EventKind};
use memwatch_tests::{agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, workspace_bin};

const MIB: u64 = 1 << 20;

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(|e| e.body.kind).collect()
}

/// `memwatch exec` against `agent`, with its exit code and stderr.
fn exec(agent: &Agent, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(workspace_bin("memwatch"))
        .args(["exec", "--socket"])
        .arg(agent.socket())
        .args(args)
        .output()
        .expect("run memwatch exec");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn leftover_memory_rejects_a_task_until_an_operator_resets_the_worker() {
    if !kernel_tests_enabled("leftover_memory_rejects_a_task_until_an_operator_resets_the_worker") {
        return;
    }
    let worker = TestCgroup::create("scoot");
    let _leftover = worker.hog(300);
    let agent = Agent::start_with_config(&format!(
        "[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\nsoft_cap = \"200MiB\"\n",
        worker.path_str()
    ))
    .await;

    let (code, answer) = agent
        .post(
            "/v1/tasks",
            Some(serde_json::json!({"task_id": "t-a", "worker": "w1"})),
        )
        .await;
    assert_eq!(code, 409, "{answer}");
    assert_eq!(answer["verdict"], "rejected");
    let reason = answer["reason"].as_str().unwrap();
    assert!(
        reason.contains("residual memory") && reason.contains("soft cap 200.0 MiB"),
        "{reason}"
    );

    let (code, health) = agent.get("/health").await;
    assert_eq!(code, 503, "{health}");
    assert!(health.contains("residual memory"), "{health}");
    // (The sampling loop may already have reported the worker over its cap.)
    let events: Vec<Event> = agent
        .events(0)
        .await
        .into_iter()
        .filter(|e| {
            matches!(
                e.body.kind,
                EventKind::WorkerUnhealthy | EventKind::TaskRejected
            )
        })
        .collect();
    assert_eq!(
        kinds(&events),
        [EventKind::WorkerUnhealthy, EventKind::TaskRejected],
        "{events:#?}"
    );
    assert_eq!(events[1].body.task_id.as_deref(), Some("t-a"));

    let (code, _) = agent.post("/v1/workers/w1/reset", None).await;
    assert_eq!(code, 200);
    let (code, health) = agent.get("/health").await;
    assert_eq!(code, 200, "{health}");
    agent
        .wait_for_event(Duration::from_secs(1), "worker_recovered", |e| {
            e.body.kind == EventKind::WorkerRecovered
                && e.body.reason.as_deref() == Some("operator reset")
        })
        .await;
}

#[tokio::test]
async fn exec_task_growing_past_its_soft_cap_is_reported_with_its_task_id() {
    if !kernel_tests_enabled("exec_task_growing_past_its_soft_cap_is_reported_with_its_task_id") {
        return;
    }
    let agent = Agent::start_with_config("sample_interval = \"100ms\"\n").await;
    let memhog = workspace_bin("memhog");
    let (code, stderr) = exec(
        &agent,
        &[
            "--soft-cap",
            "64M",
            "--task-id",
            "t-b",
            "--",
            memhog.to_str().unwrap(),
            "128",
            "2",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let crossing = agent
        .wait_for_event(Duration::from_secs(2), "soft_cap_exceeded", |e| {
            e.body.kind == EventKind::SoftCapExceeded && e.body.task_id.as_deref() == Some("t-b")
        })
        .await;
    assert_eq!(crossing.body.soft_cap_bytes, Some(64 * MIB));
    assert!(crossing.body.rss_bytes.unwrap() > 64 * MIB, "{crossing:?}");
    assert!(crossing.body.growth_bytes_per_sec.is_some());
    assert!(
        crossing
            .body
            .cgroup
            .as_deref()
            .unwrap()
            .ends_with("/memwatch/task-t-b"),
        "{crossing:?}"
    );
    let ended = agent
        .wait_for_event(Duration::from_secs(1), "task_finished", |e| {
            e.body.kind == EventKind::TaskFinished && e.body.task_id.as_deref() == Some("t-b")
        })
        .await;
    assert_eq!(
        ended.body.reason.as_deref(),
        Some("ended with exit status 0")
    );
}

#[tokio::test]
async fn exec_task_killed_by_its_hard_cap_exits_137_with_an_oom_kill_event() {
    if !kernel_tests_enabled("exec_task_killed_by_its_hard_cap_exits_137_with_an_oom_kill_event") {
        return;
    }
    let agent = Agent::start(&[]).await;
    let memhog = workspace_bin("memhog");
    let started = Instant::now();
    let (code, stderr) = exec(
        &agent,
        &[
            "--hard-cap",
            "64M",
            "--task-id",
            "t-c",
            "--",
            memhog.to_str().unwrap(),
            "200",
            "30",
        ],
    );
    assert_eq!(code, Some(137), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let kill = agent
        .wait_for_event(Duration::from_secs(1), "oom_kill", |e| {
            e.body.kind == EventKind::OomKill
        })
        .await;
    assert_eq!(kill.body.task_id.as_deref(), Some("t-c"), "{kill:?}");
    assert_eq!(kill.body.worker.as_deref(), Some("host"));
    assert_eq!(kill.body.comm.as_deref(), Some("memhog"));
    let ended = agent
        .wait_for_event(Duration::from_secs(1), "task_finished", |e| {
            e.body.kind == EventKind::TaskFinished && e.body.task_id.as_deref() == Some("t-c")
        })
        .await;
    assert_eq!(ended.body.reason.as_deref(), Some("OOM-killed"));
    assert!(
        ended.seq > kill.seq,
        "the task ends after the kill that ended it"
    );
}

#[tokio::test]
async fn rejected_exec_exits_75_without_running_the_command() {
    if !kernel_tests_enabled("rejected_exec_exits_75_without_running_the_command") {
        return;
    }
    let worker = TestCgroup::create("reject");
    let _leftover = worker.hog(100);
    let agent = Agent::start_with_config(&format!(
        "[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\nsoft_cap = \"50MiB\"\n",
        worker.path_str()
    ))
    .await;
    let marker = std::env::temp_dir().join(format!("memwatch-test-ran-{}", std::process::id()));
    let (code, stderr) = exec(
        &agent,
        &["--task-id", "t-r", "--", "touch", marker.to_str().unwrap()],
    );
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stderr.contains("rejected by worker w1"), "{stderr}");
    assert!(!marker.exists(), "the command must not run");
    // The task's cgroup was made under the worker's and removed again.
    assert!(!worker.path().join("task-t-r").exists());
}

#[tokio::test]
async fn worker_stuck_above_its_cap_turns_unhealthy_then_recovers_after_release() {
    if !kernel_tests_enabled(
        "worker_stuck_above_its_cap_turns_unhealthy_then_recovers_after_release",
    ) {
        return;
    }
    let worker = TestCgroup::create("stuck");
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"100ms\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\nsoft_cap = \"100MiB\"\n\
         unhealthy_after = \"2s\"\nrecover_after = \"2s\"\n",
        worker.path_str()
    ))
    .await;
    let _hog = worker.hog(150);

    let crossed = agent
        .wait_for_event(Duration::from_secs(5), "soft_cap_exceeded", |e| {
            e.body.kind == EventKind::SoftCapExceeded && e.body.worker.as_deref() == Some("w1")
        })
        .await;
    let (code, _) = agent.get("/health").await;
    assert_eq!(code, 200, "degraded, not yet unhealthy");
    let unhealthy = agent
        .wait_for_event(Duration::from_secs(10), "worker_unhealthy", |e| {
            e.body.kind == EventKind::WorkerUnhealthy
        })
        .await;
    assert!(
        unhealthy
            .body
            .reason
            .as_deref()
            .unwrap()
            .starts_with("unmanaged memory"),
        "{unhealthy:?}"
    );
    let waited = (unhealthy.time - crossed.time).to_std().unwrap();
    assert!(
        waited >= Duration::from_secs(2),
        "unhealthy after {waited:?}, before unhealthy_after"
    );
    let (code, health) = agent.get("/health").await;
    assert_eq!(code, 503, "{health}");

    worker.kill_all();
    let released = chrono::Utc::now();
    let recovered = agent
        .wait_for_event(Duration::from_secs(10), "worker_recovered", |e| {
            e.body.kind == EventKind::WorkerRecovered
        })
        .await;
    let waited = (recovered.time - released).to_std().unwrap_or_default();
    assert!(
        waited >= Duration::from_millis(1900),
        "recovered after {waited:?}, before recover_after"
    );
    let (code, health) = agent.get("/health").await;
    assert_eq!(code, 200, "{health}");
    println!(
        "stuck worker: unhealthy {:.1}s after crossing its cap; recovered {:.1}s after release",
        (unhealthy.time - crossed.time).as_seconds_f64(),
        waited.as_secs_f64()
    );
}

#[tokio::test]
async fn a_worker_without_a_configured_cap_takes_its_cgroups_soft_limit() {
    if !kernel_tests_enabled("a_worker_without_a_configured_cap_takes_its_cgroups_soft_limit") {
        return;
    }
    let worker = TestCgroup::create("own-cap");
    // The cgroup's own soft limit: memory.high on v2, memory.soft_limit_in_bytes
    // on v1. v2 throttles allocations above memory.high harder the further
    // past it they go, so the hog goes only a little over.
    let file = if worker.path().join("memory.high").exists() {
        "memory.high"
    } else {
        "memory.soft_limit_in_bytes"
    };
    std::fs::write(worker.path().join(file), (64 * MIB).to_string()).expect(file);
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"100ms\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        worker.path_str()
    ))
    .await;
    let _hog = worker.hog(70);
    let crossed = agent
        .wait_for_event(Duration::from_secs(10), "soft_cap_exceeded", |e| {
            e.body.kind == EventKind::SoftCapExceeded && e.body.worker.as_deref() == Some("w1")
        })
        .await;
    assert_eq!(
        crossed.body.soft_cap_bytes,
        Some(64 * MIB),
        "{file}: {crossed:?}"
    );
    println!(
        "{file} as the soft cap: crossed at {:?} bytes",
        crossed.body.rss_bytes
    );
}

#[tokio::test]
async fn a_cgroup_matching_a_rule_is_a_task_the_moment_it_appears() {
    if !kernel_tests_enabled("a_cgroup_matching_a_rule_is_a_task_the_moment_it_appears") {
        return;
    }
    let worker = TestCgroup::create("rules");
    // Sampling once a minute: only the cgroup_mkdir probe can be this quick.
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"60s\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{0}\"\n\
         [[rule]]\nworker = \"w1\"\ncgroup = \"{0}/job_*\"\nsoft_cap = \"32MiB\"\n",
        worker.path_str()
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await; // past the first sampling round
    let job = memwatch::OwnedCgroup::create(worker.path().join("job_1")).expect("job cgroup");
    let made = chrono::Utc::now();
    let started = agent
        .wait_for_event(Duration::from_secs(2), "task_started", |e| {
            e.body.kind == EventKind::TaskStarted
        })
        .await;
    let task_id = format!(
        "{}/job_1",
        worker.path().file_name().unwrap().to_str().unwrap()
    );
    assert_eq!(started.body.task_id.as_deref(), Some(task_id.as_str()));
    assert_eq!(started.body.soft_cap_bytes, Some(32 * MIB));
    let seen = chrono::Utc::now() - made;
    assert!(seen < chrono::TimeDelta::seconds(2), "noticed after {seen}");
    job.remove().expect("rmdir job");
    let ended = agent
        .wait_for_event(Duration::from_secs(2), "task_finished", |e| {
            e.body.kind == EventKind::TaskFinished
        })
        .await;
    assert_eq!(ended.body.reason.as_deref(), Some("cgroup removed"));
    println!(
        "rule task noticed {} ms after mkdir",
        seen.num_milliseconds()
    );
}

#[tokio::test]
async fn kernel_usage_figures_stay_within_5_percent_of_the_cgroup_counters() {
    if !kernel_tests_enabled("kernel_usage_figures_stay_within_5_percent_of_the_cgroup_counters") {
        return;
    }
    let agent = Agent::start_with_config("growth_step = \"1MiB\"\n").await;
    let memhog = workspace_bin("memhog");
    let mut exec = Command::new(workspace_bin("memwatch"))
        .args(["exec", "--socket"])
        .arg(agent.socket())
        .args(["--soft-cap", "1G", "--task-id", "t-u", "--"])
        .args([memhog.to_str().unwrap(), "100", "10"])
        .stdout(Stdio::null())
        .spawn()
        .expect("memwatch exec");
    let deadline = Instant::now() + Duration::from_secs(10);
    let (kernel, files) = loop {
        let (_, body) = agent.get("/v1/status").await;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        let task = status["tasks"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["task_id"] == "t-u"))
            .cloned();
        if let Some(task) = task
            && let Some(kernel) = task["kernel_usage_bytes"].as_u64()
            && kernel > 96 * MIB
        {
            let cgroup = task["source"]["cgroup"].as_str().unwrap().to_string();
            let usage: u64 = std::fs::read_to_string(format!("{cgroup}/memory.usage_in_bytes"))
                .or_else(|_| std::fs::read_to_string(format!("{cgroup}/memory.current")))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            break (kernel, usage);
        }
        assert!(
            Instant::now() < deadline,
            "no kernel figure near 100 MiB: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let gap = (kernel as f64 - files as f64).abs() / files as f64;
    println!(
        "kernel growth figure {:.1} MiB vs memory.usage_in_bytes {:.1} MiB: {:.2} % apart",
        kernel as f64 / MIB as f64,
        files as f64 / MIB as f64,
        gap * 100.0
    );
    assert!(gap < 0.05, "kernel {kernel} vs files {files}");
    // exec ends with memhog (10 s) and removes the task's cgroup: killed
    // instead, it would leave the cgroup behind. Bounded.
    let deadline = Instant::now() + Duration::from_secs(120);
    while exec.try_wait().expect("wait for exec").is_none() {
        if Instant::now() > deadline {
            let _ = exec.kill();
            panic!("memwatch exec did not end within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The workload `memwatch exec` runs gets none of exec's settings: the
/// agent's token, given to exec in the environment, stays with exec.
#[tokio::test]
async fn exec_keeps_the_token_from_its_command() {
    if !kernel_tests_enabled("exec_keeps_the_token_from_its_command") {
        return;
    }
    let worker = TestCgroup::create("exec-env");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let agent = Agent::start_with_config(&format!(
        "api_token_file = \"{}\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        token.display(),
        worker.path_str()
    ))
    .await;
    let seen = dir.path().join("env");
    let out = Command::new(workspace_bin("memwatch"))
        .args([
            "exec",
            "--agent",
            &agent.base_url,
            "--task-id",
            "t-env",
            "--",
        ])
        .args(["sh", "-c", &format!("env > {}", seen.display())])
        .env("MEMWATCH_TOKEN", "s3cret-token")
        .env("MEMWATCH_AGENT", &agent.base_url)
        .env("KEPT_FOR_THE_COMMAND", "1")
        .output()
        .expect("run memwatch exec");
    assert_eq!(
        out.status.code(),
        Some(0),
        "registered with the token from the environment: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(&seen).unwrap();
    assert!(env.contains("KEPT_FOR_THE_COMMAND=1"), "{env}");
    assert!(
        !env.contains("MEMWATCH_"),
        "the command saw memwatch's settings:\n{env}"
    );
}
