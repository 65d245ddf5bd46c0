//! `cargo xtask test`: the one command CI runs.

use std::time::{Duration, Instant};

use crate::shell;

/// `cargo <args>` for the host crates: everything but the eBPF programs,
/// which only build for the bpf target (agent/build.rs does that).
const HOST_CRATES: [&str; 3] = ["--workspace", "--exclude", "agent-ebpf"];

/// How long the test binaries may run in all (about 12 minutes in CI on the
/// 2-core build machines): far above that, something hangs.
const TESTS_BOUND: Duration = Duration::from_secs(45 * 60);

pub(crate) fn run(lint: bool, extra: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    if lint {
        shell::cargo(&["fmt", "--all", "--check"])?;
        let mut clippy = vec!["clippy", "--locked", "--all-targets"];
        clippy.extend(HOST_CRATES);
        clippy.extend(["--", "-D", "warnings"]);
        shell::cargo(&clippy)?;
        // The agent without its optional sinks (each a Cargo feature, on by
        // default): it must build and lint clean with them left out.
        shell::cargo(&[
            "clippy",
            "--locked",
            "-p",
            "memwatch",
            "--no-default-features",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])?;
        // The eBPF crate needs its own run, for its own target: linted for
        // the host it pulls std in and clashes on panic_impl.
        shell::run(
            "cargo",
            &[
                "+nightly",
                "clippy",
                "--locked",
                "-p",
                "agent-ebpf",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--",
                "-D",
                "warnings",
            ],
        )?;
    }
    // agent/src imports only lower layers (docs/architecture.md).
    crate::layers::run()?;
    // The kernel tests run the real binaries: build them with the tests.
    shell::build_tests()?;
    // Every test binary, even after one failed: one run shows every failure.
    let mut args: Vec<String> = vec!["test".into(), "--locked".into(), "--no-fail-fast".into()];
    args.extend(HOST_CRATES.map(String::from));
    args.push("--".into());
    if extra.is_empty() {
        // The kernel tests print what they measured (event delays); keep it in the log.
        args.push("--show-output".into());
    } else {
        args.extend(extra.iter().cloned());
    }
    shell::cargo_bounded(&args, TESTS_BOUND)?;
    eprintln!(
        "xtask: tests done in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
