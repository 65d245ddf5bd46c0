//! Fresh `memwatch exec` tasks crossing their soft caps one after another:
//! every crossing must be seen by the kernel's growth program (within
//! 50 ms of memhog touching the cap), not by the 60 s sampling round.
//!
//! It found a real bug (2026-11-30): a new cgroup's `mem_cgroup` often sits
//! at the address of a freed one, and the growth program applied the stale
//! LRU entry (the old cgroup's id, so no cap) to it: about one crossing in
//! five was seen only by the sampler. Entries are now checked by id.

use std::{process::Command, time::Duration};

use memwatch::event::EventKind;
use memwatch_tests::{agent::Agent, kernel_tests_enabled, workspace_bin};

const TASKS: usize = 10;

#[tokio::test]
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
