//! Installs what building the eBPF programs needs, only where it is missing:
//! rust-src for the nightly toolchain, LLVM 22 (Debian's llvm-22-dev), and
//! bpf-linker built against it. See docs/development.md for why these
//! exact pieces: a plain `cargo install bpf-linker` wants LLVM 23.

use std::{path::Path, time::Instant};

use anyhow::{Context as _, bail};

use crate::shell;

const NIGHTLY: &str = "nightly";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const LLVM_PACKAGE: &str = "llvm-22-dev";

pub(crate) fn ensure() -> anyhow::Result<()> {
    let started = Instant::now();
    shell::ensure_cargo_bin_on_path();
    ensure_nightly_rust_src()?;
    ensure_llvm()?;
    ensure_bpf_linker()?;
    eprintln!(
        "xtask: setup complete in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn ensure_nightly_rust_src() -> anyhow::Result<()> {
    let toolchains = shell::output("rustup", &["toolchain", "list"])
        .context("rustup is not on PATH: the eBPF build needs rustup's nightly toolchain")?;
    if !toolchains.lines().any(|l| l.starts_with(NIGHTLY)) {
        eprintln!("xtask: no nightly toolchain; installing it with rustup");
        shell::run(
            "rustup",
            &["toolchain", "install", NIGHTLY, "--profile", "minimal"],
        )
        .context(
            "the nightly toolchain is missing and rustup could not install it; \
             the eBPF programs are built with nightly (-Z build-std)",
        )?;
    }
    let components = shell::output(
        "rustup",
        &["component", "list", "--toolchain", NIGHTLY, "--installed"],
    )
    .unwrap_or_default();
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        shell::run(
            "rustup",
            &["component", "add", "rust-src", "--toolchain", NIGHTLY],
        )
        .context("cannot add rust-src to the nightly toolchain")?;
    }
    Ok(())
}

fn ensure_llvm() -> anyhow::Result<()> {
    if Path::new(LLVM_PREFIX).join("bin/llvm-config").exists() {
        return Ok(());
    }
    if !shell::is_root() {
        bail!(
            "{LLVM_PACKAGE} is missing and installing it needs root: \
             run `apt-get install {LLVM_PACKAGE}` as root, or run this command as root"
        );
    }
    eprintln!("xtask: installing {LLVM_PACKAGE} (bpf-linker links against LLVM 22)");
    shell::run("apt-get", &["update", "-qq"]).context("apt-get update failed")?;
    shell::run(
        "apt-get",
        &[
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            LLVM_PACKAGE,
        ],
    )
    .with_context(|| format!("cannot install {LLVM_PACKAGE} with apt-get"))
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    let installed = shell::cargo_bin_dir().join("bpf-linker");
    if linked_against_llvm_22(&installed) {
        return Ok(());
    }
    eprintln!("xtask: building bpf-linker against LLVM 22 (about 80 s)");
    // SAFETY: single-threaded; cargo install below reads it.
    unsafe { std::env::set_var("LLVM_PREFIX", LLVM_PREFIX) };
    shell::cargo(&[
        "install",
        "bpf-linker",
        "--locked",
        "--force",
        "--no-default-features",
        "--features",
        "llvm-22",
    ])
    .context("cannot build bpf-linker against LLVM 22")?;
    if !linked_against_llvm_22(&installed) {
        bail!(
            "bpf-linker was installed at {} but does not link LLVM 22",
            installed.display()
        );
    }
    Ok(())
}

/// bpf-linker prints no LLVM version; the library it links tells.
fn linked_against_llvm_22(bin: &Path) -> bool {
    bin.exists()
        && shell::output("ldd", &[bin]).is_some_and(|libs| {
            libs.lines()
                .any(|l| l.contains("libLLVM") && l.contains(".so.22"))
        })
}
