//! memwatch: a per-host memory watchdog. See ../shared/DESIGN.md for the
//! words (worker, task, soft cap, residual memory) and the contract.

pub mod agent;
pub mod api;
pub mod cgroup;
pub mod cli;
pub mod client;
pub mod config;
pub mod event;
pub mod heartbeat;
pub mod pipeline;
pub mod probe;
pub mod reconcile;
pub mod shipper;
pub mod status;
pub mod telemetry;
pub mod watchdog;
