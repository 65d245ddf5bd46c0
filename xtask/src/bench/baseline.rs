//! `--baseline <rev>`: the agent built from another commit, to run beside
//! this tree's on the same workload.
//!
//! The commit is checked out in a git worktree under
//! target/bench-baseline/<commit>/src (as the upgrade test builds its old
//! release, tests/delivery/upgrade.rs) and built in release with this
//! tree's target directory, so the dependencies both builds share are
//! compiled once: the baseline's crates have their own path, hence their
//! own artifacts. Its binary is copied to target/bench-baseline/<commit>/
//! before this tree's build puts its own back at target/release/memwatch.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::shell;

/// A build of another commit: its binary, and the commit it came from.
pub(crate) struct Baseline {
    pub(crate) bin: PathBuf,
    pub(crate) commit: String,
}

/// Checks out `rev` (any name git knows) and builds its `memwatch` in
/// release; reuses a checkout and a binary made before for the same commit.
pub(crate) fn build(rev: &str) -> anyhow::Result<Baseline> {
    let root = shell::workspace_root();
    let commit = git(&["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .with_context(|| format!("--baseline {rev}: not a commit of this repository"))?;
    let dir = root.join("target/bench-baseline").join(&commit);
    let src = dir.join("src");
    let bin = dir.join("memwatch");
    if bin.exists() {
        eprintln!("xtask: baseline {commit}: {} (built before)", bin.display());
        return Ok(Baseline { bin, commit });
    }
    if !src.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let src_arg = src.display().to_string();
        git(&["worktree", "add", "--force", "--detach", &src_arg, &commit])?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--locked",
            "--release",
            "-p",
            "memwatch",
            "--bin",
            "memwatch",
        ])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("building the baseline {commit} failed ({status})");
    }
    std::fs::copy(root.join("target/release/memwatch"), &bin)
        .with_context(|| format!("copy the baseline's binary to {}", bin.display()))?;
    eprintln!("xtask: baseline {commit}: {}", bin.display());
    Ok(Baseline { bin, commit })
}

/// `git -C <workspace> <args>`'s first line of output.
fn git(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(shell::workspace_root())
        .args(args)
        .output()
        .context("cannot run git")?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// This tree's commit (with `+` when the work tree has changes), for tables.
pub(crate) fn this_tree() -> String {
    let head = git(&["rev-parse", "--short=7", "HEAD"]).unwrap_or_else(|_| "?".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .is_ok_and(|first| !first.is_empty());
    if dirty { format!("{head}+") } else { head }
}
