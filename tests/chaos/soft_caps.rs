//! Fresh `memwatch exec` tasks crossing their soft caps one after another:
//! every crossing must be seen by the kernel's growth program (within
//! 50 ms of memhog touching the cap), not by the 60 s sampling round.
//!
//! It found a real bug (2026-11-30): a new cgroup's `mem_cgroup` often sits
//! at the address of a freed one, and the growth program applied the stale
//! LRU entry (the old cgroup's id, so no cap) to it: about one crossing in
//! five was seen only by the sampler. Entries are now checked by id.

use std::time::Duration;

use memwatch::EventKind;
use memwatch_tests::{agent::Agent, exec_memhog_with_mark, kernel_tests_enabled, ms_after_mark};

const TASKS: usize = 10;

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
        let mark_ns = exec_memhog_with_mark(&agent.base_url, "64M", &task, 128, 64);
        let events = agent.all_events().await;
        let crossing = events.iter().find(|e| {
            e.body.kind == EventKind::SoftCapExceeded && e.body.task_id.as_deref() == Some(&*task)
        });
        let delay_ms = crossing.map(|e| ms_after_mark(e, mark_ns));
        if delay_ms.is_none_or(|d| d > 50.0) {
            late.push((task, delay_ms));
        }
    }
    assert!(
        late.is_empty(),
        "crossings not seen by the kernel within 50 ms: {late:?}"
    );
}
