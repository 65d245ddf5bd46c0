//! `cargo xtask test`: the one command CI runs.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::shell;

/// `cargo <args>` for the host crates: everything but the eBPF programs,
/// which only build for the bpf target (agent/build.rs does that).
const HOST_CRATES: [&str; 3] = ["--workspace", "--exclude", "agent-ebpf"];

/// How long the test binaries may run in all (about 12 minutes one after
/// another on the 2-core build machines, less at once): far above that,
/// something hangs.
const TESTS_BOUND: Duration = Duration::from_secs(45 * 60);

/// Lints, builds and runs the tests; `left_to_matrix` names the kernel test
/// binaries not to run here, because the kernel matrix runs them on this host
/// next. Returns the test executables built (name, path) for the matrix.
pub(crate) fn run(
    lint: bool,
    extra: &[String],
    left_to_matrix: &[&str],
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let started = Instant::now();
    if lint {
        shell::cargo(&["fmt", "--all", "--check"])?;
        let mut clippy = vec!["clippy", "--locked", "--all-targets"];
        clippy.extend(HOST_CRATES);
        clippy.extend(["--", "-D", "warnings"]);
        shell::cargo(&clippy)?;
        // The agent without its optional sinks (each a Cargo feature, on by
        // default): it must build and lint clean with them left out. Its
        // library and binary only: its unit tests are built and run slim
        // below (and linted with every feature on above), which saves
        // checking the agent's tests a second time (about a minute here).
        shell::cargo(&[
            "clippy",
            "--locked",
            "-p",
            "memwatch",
            "--no-default-features",
            "--lib",
            "--bins",
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
    // agent/src imports only lower layers (docs/architecture.md), makes no
    // blocking call in async code, and every long file says why.
    crate::source_checks()?;
    // The kernel tests run the real binaries: build them with the tests.
    let built = shell::build_tests()?;
    let args = if nextest() {
        vec![nextest_args(extra, left_to_matrix)]
    } else {
        eprintln!(
            "xtask: cargo-nextest is not installed: `cargo test`, one test binary after another \
             and the host integration tests one at a time (slower; `cargo install cargo-nextest \
             --locked` runs them at once)"
        );
        cargo_test_args(extra)
    };
    for args in args {
        shell::cargo_bounded(&args, TESTS_BOUND)?;
    }
    if extra.is_empty() {
        // The agent without its optional sinks (Cargo features, on by
        // default) must pass its own unit tests too, not only lint clean.
        shell::cargo_bounded(&slim_args(nextest()), TESTS_BOUND)?;
    }
    eprintln!(
        "xtask: tests done in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(built)
}

/// Whether `cargo nextest` is there (it is on the build machines).
fn nextest() -> bool {
    shell::output("cargo", &["nextest", "--version"]).is_some()
}

/// Every test binary at once (`.config/nextest.toml` says which may not
/// overlap), even after one failed: one run shows every failure. The
/// binaries the kernel matrix runs on this host after it are left to it.
fn nextest_args(extra: &[String], left_to_matrix: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["nextest", "run", "--locked", "--no-fail-fast"]
        .map(String::from)
        .to_vec();
    args.extend(HOST_CRATES.map(String::from));
    if !left_to_matrix.is_empty() {
        let binaries: Vec<String> = left_to_matrix
            .iter()
            .map(|b| format!("binary_id(memwatch-tests::{b})"))
            .collect();
        args.push("-E".into());
        args.push(format!("not ({})", binaries.join(" | ")));
    }
    if !extra.is_empty() {
        args.push("--".into());
        args.extend(extra.iter().cloned());
    }
    args
}

/// The agent's unit tests built with no optional sink (`--no-default-features`).
fn slim_args(nextest: bool) -> Vec<String> {
    let run: &[&str] = if nextest {
        &["nextest", "run"]
    } else {
        &["test"]
    };
    let mut args: Vec<String> = run.iter().map(|a| a.to_string()).collect();
    args.extend(
        [
            "--locked",
            "-p",
            "memwatch",
            "--no-default-features",
            "--lib",
        ]
        .map(String::from),
    );
    args
}

/// The `cargo test` runs: every test binary but the host integration
/// tests, one binary after another, each running its tests on its threads;
/// then the host integration tests (one binary, `tests/host.rs`) one at a
/// time: `.config/nextest.toml` keeps some of them apart (the OOM storms,
/// one real cluster at a time), which threads in one process would not.
fn cargo_test_args(extra: &[String]) -> Vec<Vec<String>> {
    let tail = |threads: &[&str]| -> Vec<String> {
        let mut args = vec!["--".to_string()];
        args.extend(threads.iter().map(|a| a.to_string()));
        if extra.is_empty() {
            // The kernel tests print what they measured (event delays); keep it in the log.
            args.push("--show-output".into());
        } else {
            args.extend(extra.iter().cloned());
        }
        args
    };
    let mut most: Vec<String> = ["test", "--locked", "--no-fail-fast"]
        .map(String::from)
        .to_vec();
    most.extend(HOST_CRATES.map(String::from));
    most.extend(["--exclude", "memwatch-tests"].map(String::from));
    most.extend(["--lib", "--bins", "--tests"].map(String::from));
    most.extend(tail(&[]));
    let mut ours: Vec<String> = [
        "test",
        "--locked",
        "--no-fail-fast",
        "-p",
        "memwatch-tests",
        "--lib",
        "--test",
        "kernels",
    ]
    .map(String::from)
    .to_vec();
    ours.extend(tail(&[]));
    let mut host: Vec<String> = ["test", "--locked", "-p", "memwatch-tests", "--test", "host"]
        .map(String::from)
        .to_vec();
    host.extend(tail(&["--test-threads=1"]));
    vec![most, ours, host]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_binaries_are_left_out_of_the_host_run() {
        let args = nextest_args(&[], &crate::vm::KERNEL_TESTS);
        let at = args.iter().position(|a| a == "-E").expect("a filter");
        assert_eq!(args[at + 1], "not (binary_id(memwatch-tests::kernels))");
        assert!(nextest_args(&[], &[]).iter().all(|a| a != "-E"));
    }

    #[test]
    fn the_slim_build_runs_the_agents_unit_tests() {
        for nextest in [true, false] {
            let args = slim_args(nextest);
            assert!(
                args.iter().any(|a| a == "--no-default-features"),
                "{args:?}"
            );
            assert!(args.windows(2).any(|w| w == ["-p", "memwatch"]), "{args:?}");
        }
    }

    #[test]
    fn a_filter_goes_after_the_separator() {
        let args = nextest_args(&["storm".into()], &[]);
        assert_eq!(&args[args.len() - 2..], ["--", "storm"]);
        let runs = cargo_test_args(&[]);
        assert!(
            runs.iter()
                .all(|args| args.last().map(String::as_str) == Some("--show-output"))
        );
        let host = runs.last().unwrap();
        assert!(host.windows(2).any(|w| w == ["--test", "host"]), "{host:?}");
        assert!(host.iter().any(|a| a == "--test-threads=1"), "{host:?}");
    }
}
