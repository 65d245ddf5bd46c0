//! Fresh `memwatch exec` tasks crossing their soft caps one after another:
//! every crossing must be seen by the kernel's growth program, not by the
//! 60 s sampling round: its event must be there when the task has ended,
//! within a bound (1 s) far below the sampling interval and far above what
//! the kernel path takes (2–25 ms here; 245 ms once on a loaded CI machine,
//! which failed the 50 ms bound this test had). The delay itself is `cargo
//! xtask bench delay`'s figure.
//!
//! It found a real bug (2026-11-30): a new cgroup's `mem_cgroup` often sits
//! at the address of a freed one, and the growth program applied the stale
//! LRU entry (the old cgroup's id, so no cap) to it: about one crossing in
//! five was seen only by the sampler. Entries are now checked by id.

use std::time::Duration;

use memwatch::EventKind;
use memwatch_tests::{agent::Agent, exec_memhog_with_mark, kernel_tests_enabled, ms_after_mark};

const TASKS: usize = 10;
/// Only the kernel's line can report a crossing this soon (sampling: 60 s).
const KERNEL_PATH_BOUND_MS: f64 = 1000.0;

#[tokio::test]
async fn every_fresh_task_crossing_its_soft_cap_is_seen_by_the_kernel() {
    if !kernel_tests_enabled("every_fresh_task_crossing_its_soft_cap_is_seen_by_the_kernel") {
        return;
    }
    let agent = Agent::start_with_config("sample_interval = \"60s\"\n").await;
    tokio::time::sleep(Duration::from_millis(200)).await; // past the first sampling round
    let mut late = Vec::new();
    for n in 0..TASKS {
        let task = format!("fresh-{n}");
        let mark_ns = exec_memhog_with_mark(agent.socket(), "64M", &task, 128, 64);
        let events = agent.all_events().await;
        let crossing = events.iter().find(|e| {
            e.body.kind == EventKind::SoftCapExceeded && e.body.task_id.as_deref() == Some(&*task)
        });
        let delay_ms = crossing.map(|e| ms_after_mark(e, mark_ns));
        if delay_ms.is_none_or(|d| d > KERNEL_PATH_BOUND_MS) {
            late.push((task, delay_ms));
        }
    }
    assert!(
        late.is_empty(),
        "crossings not seen by the kernel within {KERNEL_PATH_BOUND_MS} ms: {late:?}"
    );
}
