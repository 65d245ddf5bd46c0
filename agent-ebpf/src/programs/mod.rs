//! One attach point per file.

pub mod cgroup_lifecycle;
pub mod oom_mark_victim;
pub mod rss_growth;
pub mod signal_generate;
