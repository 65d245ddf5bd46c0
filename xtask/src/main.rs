//! `cargo xtask <task>`: everything a developer or CI runs, in one place.
//!
//! - `setup`: installs what the eBPF build needs and is missing (idempotent).
//! - `run`:   setup, build, and run the agent on this host.
//! - `test`:  setup, format and lint checks, the layer check, build, and
//!   every test.
//! - `layers`: agent/src modules import only lower layers
//!   (docs/architecture.md).
//! - `bench`: setup, then benchmarks that print ratios measured side by side.
//! - `image`: setup, release build, and the OCI image (buildah, no registry).
//! - `dist`:  shell completions and man pages from the CLI's definitions,
//!   in target/dist/.
//! - `vm-test`: setup, then the kernel tests on Debian kernels booted in QEMU
//!   (pure cgroup v2) and on this host; writes docs/kernels.md.

mod bench;
mod blocking;
mod kernels_doc;
mod layers;
mod lengths;
mod setup;
mod shell;
mod test;
mod vm;

use std::time::Duration;

use clap::{Parser, Subcommand};
use memwatch_test_support::env::in_ci;

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install nightly rust-src, LLVM 22 and bpf-linker where missing.
    Setup,
    /// Set up, build (release) and run `memwatch run` on this host (as root).
    Run {
        /// Arguments for `memwatch run`, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Set up, then run a benchmark (default: overhead) and print its table (as root).
    Bench {
        /// Which benchmark: `overhead`, `delay` (detection delay vs pollers), `idle` (agent CPU and RSS by cgroup count), `storm` (an OOM storm of 6,000 kills/min for a minute), `tasks` (registration and idle cost at 10 to 5,000 live tasks), `guard`, `predict` (the kill predictor against its rivals: this host's cells, then cgroup v2's in VMs), `predict-v2` (the VMs' cells only), or `all` (the quick ones: overhead and delay, then one summary table).
        which: Option<String>,
        /// Also build this commit (a git worktree and its own target
        /// directory under target/bench-baseline/, sharing this tree's
        /// dependency artifacts) and run it beside this tree on the same
        /// workload, interleaved, printing both figures and their ratio
        /// (every benchmark but `guard`).
        #[arg(long, value_name = "REV")]
        baseline: Option<String>,
    },
    /// Set up, build (release) and write the OCI image to target/memwatch.oci.tar (as root, needs buildah).
    Image,
    /// Set up, then write shell completions (bash, zsh, fish) and man pages,
    /// made from memwatch's clap definitions, to target/dist/.
    Dist,
    /// Set up, check formatting, lints and layers, build, and run every test.
    Test {
        /// Also run the kernel matrix (`vm-test`) after the tests; on by
        /// default when CI=true.
        #[arg(long)]
        vm: bool,
        /// Skip `cargo fmt --check` and clippy.
        #[arg(long)]
        no_lint: bool,
        /// Extra arguments for the test runner (a filter, …), after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Check that agent/src modules import only lower layers (docs/architecture.md),
    /// and that async code in agent/src makes no blocking call (xtask/src/blocking.rs).
    Layers,
    /// Set up, then run the kernel tests on Debian kernels booted in QEMU
    /// (pure cgroup v2) and on this host; print a summary per kernel and
    /// write docs/kernels.md (as root).
    VmTest {
        /// A kernel: a Debian line (`6.1`, `6.12`: its newest package), a
        /// version (`6.1.0-48`), a package name, or `host`. Repeatable;
        /// default: 6.1, 6.12 and host.
        #[arg(long = "kernel")]
        kernels: Vec<String>,
        /// Seconds allowed per kernel (boot and tests); scaled up under TCG.
        #[arg(long, default_value_t = 240)]
        timeout: u64,
        /// Leave docs/kernels.md as it is.
        #[arg(long)]
        no_docs: bool,
        /// Run the test binaries this many times in each VM (to chase a
        /// failure seen once); implies --no-docs when above 1.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Arguments for each kernel test binary, after `--` (a test name
        /// filter, `--exact`, …).
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// Inside a VM that `bench predict-v2` booted: the predict cells of its
    /// cgroup hierarchy with the binaries in BINS (nothing is built there),
    /// then the figures and plots as console lines for the host.
    #[command(hide = true)]
    BenchInVm {
        #[arg(long)]
        bins: std::path::PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    // The error's chain, not a backtrace: a CI log's tail must say what failed.
    match run(Cli::parse().task) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> anyhow::Result<()> {
    match task {
        Task::Setup => setup::ensure(),
        Task::Run { args } => {
            setup::ensure()?;
            shell::cargo(&["build", "--release", "--locked", "-p", "memwatch"])?;
            let bin = shell::workspace_root().join("target/release/memwatch");
            let mut run_args = vec!["run".to_string()];
            run_args.extend(args);
            shell::exec(&bin, &run_args)
        }
        Task::Bench { which, baseline } => {
            setup::ensure()?;
            bench::run(which.as_deref(), baseline.as_deref())
        }
        Task::BenchInVm { bins } => bench::predict::inside_vm(&bins),
        Task::Image => {
            setup::ensure()?;
            shell::cargo(&["build", "--release", "--locked", "-p", "memwatch"])?;
            let root = shell::workspace_root();
            let script = root.join("deploy/docker/build-oci.sh");
            let args = [
                root.join("target/release/memwatch").display().to_string(),
                root.join("target/memwatch.oci.tar").display().to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            ];
            shell::run(&script, &args)
        }
        Task::Dist => {
            setup::ensure()?;
            let out = shell::workspace_root().join("target/dist");
            shell::cargo(&[
                "run".as_ref(),
                "--quiet".as_ref(),
                "--locked".as_ref(),
                "-p".as_ref(),
                "memwatch".as_ref(),
                "--example".as_ref(),
                "cli_docs".as_ref(),
                "--".as_ref(),
                out.as_os_str(),
            ])
        }
        Task::Test { vm, no_lint, args } => {
            setup::ensure()?;
            let matrix = vm || in_ci();
            // The matrix runs its kernel tests on this host too (after the
            // VMs, alone): the host run leaves them to it.
            let left_to_matrix: &[&str] = if matrix { &vm::KERNEL_TESTS } else { &[] };
            let built = test::run(!no_lint, &args, left_to_matrix)?;
            if matrix {
                vm::run(&vm::Options {
                    kernels: Vec::new(),
                    timeout: Duration::from_secs(240),
                    write_docs: true,
                    repeat: 1,
                    test_args: Vec::new(),
                    built: Some(built),
                })?;
            }
            Ok(())
        }
        Task::Layers => source_checks(),
        Task::VmTest {
            kernels,
            timeout,
            no_docs,
            repeat,
            test_args,
        } => {
            setup::ensure()?;
            vm::run(&vm::Options {
                kernels,
                timeout: Duration::from_secs(timeout) * repeat.max(1),
                write_docs: !no_docs && repeat <= 1 && test_args.is_empty(),
                repeat: repeat.max(1),
                test_args,
                built: None,
            })
        }
    }
}

/// The checks of the source as text, before any build: the layers
/// (docs/architecture.md), no blocking call in async code, files a reader
/// can hold. `cargo xtask layers`, and `cargo xtask test` before the build.
pub(crate) fn source_checks() -> anyhow::Result<()> {
    layers::run()?;
    blocking::run()?;
    lengths::run()
}
