//! Fresh `memwatch exec` tasks crossing their soft caps one after another:
//! every crossing must be seen by the kernel's growth program (within
//! 50 ms of memhog touching the cap), not by the 60 s sampling round.
//!
//! Ignored while it fails: on 2026-11-30 about one crossing in five (and
//! most of them when 10 tasks run at once, see docs/benchmarks.md) produced
//! no `above_cap` growth line and was reported only by the sampler. The fix
//! belongs to the growth program (agent-ebpf/, agent/src/probe/ebpf.rs);
//! run with `cargo test -p memwatch-tests --test chaos_soft_caps -- --ignored`.

use std::{process::Command, time::Duration};

use memwatch::event::EventKind;
use memwatch_tests::{agent::Agent, kernel_tests_enabled, workspace_bin};

const TASKS: usize = 10;

#[tokio::test]
#[ignore = "fails: the kernel growth program misses some soft-cap crossings of fresh tasks"]
async fn every_fresh_task_crossing_its_soft_cap_is_seen_by_the_kernel() {
    if !kernel_tests_enabled("every_fresh_task_crossing_its_soft_cap_is_seen_by_the_kernel") {
        return;
    }
    let agent = Agent::start_with_config("sample_interval = \"60s\"\n").await;
    tokio::time::sleep(Duration::from_millis(200)).await; // past the first sampling round
    let memhog = workspace_bin("memhog");
    let mut late = Vec::new();
    for n in 0..TASKS {
        let task = format!("fresh-{n}");
        let out = Command::new(workspace_bin("memwatch"))
            .args(["exec", "--agent", &agent.base_url, "--soft-cap", "64M"])
            .args(["--task-id", &task, "--"])
            .args([memhog.to_str().unwrap(), "128", "1"])
            .env("MEMHOG_MARK_MIB", "64")
            .output()
            .expect("memwatch exec");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mark_ns: i64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("mark "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("memhog printed no mark: {stdout}"));
        let events = agent.all_events().await;
        let crossing = events.iter().find(|e| {
            e.body.kind == EventKind::SoftCapExceeded && e.body.task_id.as_deref() == Some(&*task)
        });
        let delay_ms =
            crossing.map(|e| (e.time.timestamp_nanos_opt().unwrap() - mark_ns) as f64 / 1e6);
        if delay_ms.is_none_or(|d| d > 50.0) {
            late.push((task, delay_ms));
        }
    }
    assert!(
        late.is_empty(),
        "crossings not seen by the kernel within 50 ms: {late:?}"
    );
}
