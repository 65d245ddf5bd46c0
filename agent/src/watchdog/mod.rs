//! Pure policy: facts and a clock in, verdicts out. No I/O here.

pub mod policy;
pub mod self_health;
pub mod task;
pub mod worker;
