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

/// Runs `memwatch exec --agent <agent> --soft-cap <cap> --task-id <task> --
/// memhog <mib> 1` with `MEMHOG_MARK_MIB=<mark>`, asserts it succeeded, and
/// returns the wall-clock time (Unix nanoseconds) memhog printed when it had
/// touched `mark` MiB.
pub fn exec_memhog_with_mark(agent: &str, cap: &str, task: &str, mib: u32, mark: u32) -> i64 {
    exec_memhog_with_mark_and_pace(agent, cap, task, mib, mark).0
}

/// [`exec_memhog_with_mark`], and memhog's own pace before the mark
/// (nanoseconds per MiB touched): how long the workload itself takes to
/// go on from the mark to the cap on this machine (or emulator).
pub fn exec_memhog_with_mark_and_pace(
    agent: &str,
    cap: &str,
    task: &str,
    mib: u32,
    mark: u32,
) -> (i64, i64) {
    let out = std::process::Command::new(workspace_bin("memwatch"))
        .args([
            "exec",
            "--agent",
            agent,
            "--soft-cap",
            cap,
            "--task-id",
            task,
            "--",
        ])
        .arg(workspace_bin("memhog"))
        .args([mib.to_string(), "1".into()])
        .env("MEMHOG_MARK_MIB", mark.to_string())
        .output()
        .expect("memwatch exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| -> i64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("memhog printed no {key}: {stdout}"))
    };
    (field("mark "), field("pace "))
}
