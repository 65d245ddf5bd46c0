//! Helpers shared by memwatch's integration tests (`memwatch-tests`), the
//! agent's own tests and examples, and `xtask`'s benchmarks: one copy of
//! each. Nothing here depends on the `memwatch` crate: xtask must build
//! before the eBPF toolchain exists, and the agent's build.rs needs it.
//! Helpers typed on memwatch's own types live in `memwatch-tests`, on top
//! of these.

pub mod agent;
pub mod env;
pub mod http;
pub mod memhog;
pub mod metrics;
pub mod process;
pub mod stats;
pub mod wait;
pub mod webhook;
