//! The kernel's pressure stall information (PSI) and memory event
//! counters, as figures: what the cgroup layer reads and the watchdog
//! judges.

use std::collections::BTreeMap;

/// One line of a PSI file (`some avg10=0.12 avg60=0.05 avg300=0.01 total=12345`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PsiLine {
    /// Share of the last 10, 60 and 300 seconds (a fraction 0–1: the file's
    /// percentage divided by 100).
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Stall time since boot (or since the cgroup was made), microseconds.
    pub total_us: u64,
}

impl PsiLine {
    /// `(window label, share)` for each averaging window.
    pub(crate) fn windows(&self) -> [(&'static str, f64); 3] {
        [
            ("10s", self.avg10),
            ("60s", self.avg60),
            ("300s", self.avg300),
        ]
    }
}

/// A `memory.pressure` or `/proc/pressure/memory` file: `some` always,
/// `full` since Linux 5.13 for the host file (older kernels have no line).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Pressure {
    pub some: PsiLine,
    pub full: Option<PsiLine>,
}

/// The memory event counters of a worker's cgroup, by the names of v2's
/// `memory.events` (`low`, `high`, `max`, `oom`, `oom_kill`,
/// `oom_group_kill`); on v1, `max` is `memory.failcnt` + `memory.memsw.failcnt`, `oom_kill` is
/// `memory.oom_control`'s, and `oom` counts the samples that found
/// `under_oom` newly set. Only the counters the kernel has are present.
pub(crate) type MemoryEvents = BTreeMap<&'static str, u64>;

/// The counters of v2's `memory.events` the agent exports, in order.
pub(crate) const MEMORY_EVENTS: [&str; 6] =
    ["low", "high", "max", "oom", "oom_kill", "oom_group_kill"];
