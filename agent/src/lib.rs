//! memwatch: a per-host memory watchdog. docs/design.md holds the words
//! (worker, task, soft cap, residual memory) and the contract;
//! docs/architecture.md the layers these modules form.

pub mod api;
pub mod cgroup;
pub mod cmd;
pub mod config;
pub mod daemon;
pub mod model;
pub mod outbox;
pub mod probe;
pub mod record;
pub mod sinks;
pub mod telemetry;
pub mod watchdog;
