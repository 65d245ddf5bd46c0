//! memwatch: a per-host memory watchdog. See ../shared/DESIGN.md for the
//! words (worker, task, soft cap, residual memory) and the contract.

pub mod agent;
pub mod api;
pub mod cgroup;
pub mod cli;
pub mod client;
pub mod config;
pub mod doctor;
pub mod exec;
pub mod heartbeat;
pub mod model;
pub mod monitor;
pub mod outbox;
pub mod pipeline;
pub mod probe;
pub mod reconcile;
pub mod record;
pub mod sampler;
pub mod sinks;
pub mod status;
pub mod status_cmd;
pub mod telemetry;
pub mod watchdog;
