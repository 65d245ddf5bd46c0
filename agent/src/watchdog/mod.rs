//! Pure policy: facts and a clock in, verdicts out. No I/O here.

pub(crate) mod imminent;
pub(crate) mod policy;
pub(crate) mod predict;
pub(crate) mod self_health;
pub(crate) mod task;
pub(crate) mod throttle;
pub(crate) mod worker;
