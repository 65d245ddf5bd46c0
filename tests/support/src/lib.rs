//! Helpers shared by memwatch's integration tests (`memwatch-tests`), the
//! agent's own tests and examples, and `xtask`'s benchmarks: one copy of
//! each. Nothing here depends on the `memwatch` crate: xtask must build
//! before the eBPF toolchain exists, and the agent's build.rs needs it.
//! Helpers typed on memwatch's own types live in `memwatch-tests`, on top
//! of these.

pub mod agent;
pub mod env;
pub mod http;
#[cfg(feature = "kube")]
pub mod kube_api;
pub mod memhog;
pub mod metrics;
pub mod process;
pub mod stats;
pub mod storm;
pub mod wait;
pub mod webhook;

/// The value on the first line of `text` that reads `key <value>` (one
/// space, then the value): `key` must match the line's start exactly.
pub fn line_value<T: std::str::FromStr>(text: &str, key: &str) -> Option<T> {
    text.lines().find_map(|line| {
        line.strip_prefix(key)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
