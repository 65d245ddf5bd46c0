//! One attach point per file.

pub mod oom_mark_victim;
