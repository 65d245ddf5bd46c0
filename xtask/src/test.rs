//! `cargo xtask test`: the one command CI runs.

use std::time::Instant;

use crate::shell;

pub fn run(lint: bool, extra: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    if lint {
        shell::cargo(&["fmt", "--all", "--check"])?;
        shell::cargo(&[
            "clippy",
            "--locked",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])?;
        // The eBPF crate needs its own run: linting it with the host
        // workspace pulls std in and clashes on panic_impl.
        shell::cargo(&[
            "clippy",
            "--locked",
            "-p",
            "agent-ebpf",
            "--",
            "-D",
            "warnings",
        ])?;
    }
    // The kernel tests run the real binary: build it first.
    shell::cargo(&["build", "--locked", "-p", "memwatch", "--bins"])?;
    let mut args: Vec<String> = ["test", "--locked", "--workspace"]
        .map(String::from)
        .to_vec();
    if !extra.is_empty() {
        args.push("--".into());
        args.extend(extra.iter().cloned());
    }
    shell::cargo(&args)?;
    eprintln!(
        "xtask: tests done in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
