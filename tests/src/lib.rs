//! Helpers for memwatch's integration tests: privilege gating, a real agent
//! process on a loopback port, and memory cgroups that clean up after
//! themselves.

pub mod agent;
pub mod cgroup;
pub mod dask;
pub mod nats;
pub mod ops;
pub mod process;
pub mod slurm;
pub mod tmpfs;

use std::path::PathBuf;

/// Whether tests that need root and BPF can run here.
///
/// In CI (`CI=true`) they must: not being root there is a failure, not a
/// skip. Elsewhere they skip with the reason printed.
pub fn kernel_tests_enabled(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        return true;
    }
    if in_ci() {
        panic!("{test}: CI must run the kernel tests as root (euid is not 0)");
    }
    eprintln!("skipped {test}: needs root for BPF and cgroups (run `cargo xtask test` as root)");
    false
}

/// A binary built by this workspace (`memwatch`, `memhog`), next to the test
/// executable's directory: target/<profile>/<name>.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p memwatch --bins`, or `cargo xtask test`)",
        bin.display()
    );
    bin
}

/// `CI=true` (or `1`): tests must run, never skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
