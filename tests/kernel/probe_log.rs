//! The eBPF programs' own log (aya-log), behind `--probe-log`: off by
//! default at no cost, on when asked. The cost is measured the way the
//! kernel sees it, not by a timing: each program's instruction count after
//! the verifier (`memwatch doctor --json`), with the switch off, against a
//! build of the programs without the `log` feature (no log statement at
//! all), and with the switch on (the `_log` twins). Then the agent with `--probe-log` writes
//! an OOM victim's record to its log. Root only; never skipped in CI. Not
//! in the VMs: the build without logging needs cargo.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use memwatch::EventKind;
use memwatch_tests::{
    agent::Agent,
    cgroup::TestCgroup,
    kernel_tests_enabled, memhog_in,
    ops::repo,
    process::{combined_output, run_bounded},
    workspace_bin,
};
use serde_json::Value;

/// Builds agent-ebpf without its `log` feature, as agent/build.rs builds it
/// otherwise (aya-build's command line), into target/probe-without-log;
/// the object's path.
fn build_without_log() -> PathBuf {
    let target = repo().join("target/probe-without-log");
    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        "nightly",
        "cargo",
        "build",
        "--package",
        "agent-ebpf",
    ])
    .args(["--bins", "--release", "--target", "bpfel-unknown-none"])
    .args(["-Z", "build-std=core", "--no-default-features"])
    .arg("--target-dir")
    .arg(&target)
    .env(
        "CARGO_ENCODED_RUSTFLAGS",
        "--cfg=bpf_target_arch=\"x86_64\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf",
    )
    .env_remove("RUSTC")
    .env_remove("RUSTC_WORKSPACE_WRAPPER")
    .env_remove("RUSTFLAGS")
    .current_dir(repo());
    let out = run_bounded("cargo build agent-ebpf", &mut cmd, Duration::from_secs(600));
    assert!(
        out.status.success(),
        "building agent-ebpf without `log`: {}",
        combined_output(&out)
    );
    target.join("bpfel-unknown-none/release/agent-ebpf")
}

/// `memwatch doctor --json` with `args`: each loaded program's
/// instruction count after the verifier, by name.
fn translated(args: &[&str]) -> BTreeMap<String, u64> {
    let out = Command::new(workspace_bin("memwatch"))
        .args(["doctor", "--json"])
        .args(args)
        .output()
        .expect("memwatch doctor");
    assert!(out.status.success(), "{}", combined_output(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("doctor's JSON");
    assert_eq!(report["source"], "ebpf", "{report}");
    report["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["translated_insns"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn probe_log_costs_no_instruction_when_off() {
    if !kernel_tests_enabled("probe_log_costs_no_instruction_when_off") {
        return;
    }
    let without = build_without_log();
    let bare = translated(&["--probe-object", without.to_str().unwrap()]);
    let off = translated(&[]);
    let on = translated(&["--probe-log"]);
    assert_eq!(
        off.keys().collect::<Vec<_>>(),
        bare.keys().collect::<Vec<_>>(),
        "the same programs loaded"
    );
    // On, the twins that log are loaded instead (`_log` appended).
    let twin = |name: &str| {
        on.get(&format!("{name}_log"))
            .or_else(|| on.get(name))
            .copied()
            .unwrap_or_else(|| panic!("{name} or its twin loaded with --probe-log: {on:?}"))
    };
    for (name, size) in &off {
        println!(
            "{name}: {} instructions without logging, {size} with it off, {} with it on",
            bare[name],
            twin(name)
        );
    }
    assert_eq!(
        off, bare,
        "with the switch off, every program is as small as one built without logging"
    );
    // The OOM and cgroup programs do log when asked.
    for (name, size) in &off {
        if name.starts_with("oom_mark_victim") || name.starts_with("cgroup_") {
            assert!(
                twin(name) > *size,
                "{name}: {} on vs {size} off",
                twin(name)
            );
        }
    }
}

#[tokio::test]
async fn probe_log_writes_the_programs_records_to_the_agents_log() {
    if !kernel_tests_enabled("probe_log_writes_the_programs_records_to_the_agents_log") {
        return;
    }
    let agent = Agent::start(&["--probe-log"]).await;
    let victim = TestCgroup::create("probe-log");
    victim.limit(32 << 20);
    let status = memhog_in(victim.path(), 64, 30)
        .status()
        .expect("run memhog");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "OOM-killed: {status}");
    let kill = agent
        .wait_for_event(Duration::from_secs(20), "oom_kill", |e| {
            e.body.kind == EventKind::OomKill && e.body.cgroup.as_deref() == Some(victim.path_str())
        })
        .await;
    let pid = kill.body.pid.expect("the victim's pid");
    let line = format!("mark_victim: OOM victim pid {pid} recorded");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agent.log_text().contains(&line) {
        assert!(
            Instant::now() < deadline,
            "no {line:?} in the log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("--probe-log: {line:?} in the agent's log");
}
