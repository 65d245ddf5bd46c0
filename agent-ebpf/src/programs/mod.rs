//! One attach point per file.

pub mod cgroup_lifecycle;
pub mod growth;
pub mod oom_mark_victim;
pub mod signal_generate;
