//! `--baseline <rev>`: the agent built from another commit, to run beside
//! this tree's on the same workload.
//!
//! The commit is checked out in a git worktree under
//! target/bench-baseline/<commit>/src (as the upgrade test builds its old
//! release, tests/delivery/upgrade.rs) and built in release with its own
//! target directory, target/bench-baseline/<commit>/target, so nothing of
//! this tree's (target/release/memwatch above all) is overwritten. It is
//! built with the same packages as this tree's release build
//! (shell::build_bins), so the dependencies' features match.
//!
//! Nothing is shared with this tree's target directory, intermediate
//! artifacts included: cargo names a workspace member's artifacts by its
//! path relative to the workspace root, the same in both checkouts, so a
//! shared `build-dir` made each build overwrite the other's `memwatch`
//! and take it for fresh (this tree's `cargo build` then linked the
//! baseline's binary as its own). [`distinct`] refuses two builds that
//! are one binary.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::shell;

/// A build of another commit: its binary, and the commit it came from.
pub(crate) struct Baseline {
    pub(crate) bin: PathBuf,
    pub(crate) commit: String,
}

impl Baseline {
    /// The short name the tables give it.
    pub(crate) fn name(&self) -> String {
        self.commit.chars().take(7).collect()
    }
}

/// Where a baseline of `commit` lives under the target directory `target`:
/// its checkout, its own target directory, and its binary.
pub(crate) struct Layout {
    pub(crate) src: PathBuf,
    pub(crate) target: PathBuf,
    pub(crate) bin: PathBuf,
}

impl Layout {
    pub(crate) fn new(target: &Path, commit: &str) -> Layout {
        let dir = target.join("bench-baseline").join(commit);
        let own = dir.join("target");
        Layout {
            src: dir.join("src"),
            bin: own.join("release").join("memwatch"),
            target: own,
        }
    }
}

/// Checks out `rev` (any name git knows) and builds its `memwatch` in
/// release; reuses a checkout made before for the same commit (and cargo
/// what it built before).
pub(crate) fn build(rev: &str) -> anyhow::Result<Baseline> {
    let root = shell::workspace_root();
    let commit = git(&["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .with_context(|| format!("--baseline {rev}: not a commit of this repository"))?;
    let layout = Layout::new(&root.join("target"), &commit);
    if !layout.src.join("Cargo.toml").exists() {
        let dir = layout.src.parent().context("the baseline's directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let src_arg = layout.src.display().to_string();
        git(&["worktree", "add", "--force", "--detach", &src_arg, &commit])?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "xtask: building the baseline {commit} into {}",
        layout.target.display()
    );
    let status = Command::new(cargo)
        .args(["build", "--locked", "--release"])
        .args(["-p", "memwatch", "-p", "memwatch-tests", "--bins"])
        .current_dir(&layout.src)
        .env("CARGO_TARGET_DIR", &layout.target)
        .env_remove("CARGO_BUILD_BUILD_DIR")
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("building the baseline {commit} failed ({status})");
    }
    if !layout.bin.exists() {
        bail!("the baseline's build made no {}", layout.bin.display());
    }
    eprintln!("xtask: baseline {commit}: {}", layout.bin.display());
    Ok(Baseline {
        bin: layout.bin,
        commit,
    })
}

/// Fails when this tree's binary `ours` and the baseline's are one file,
/// or the same bytes while the commits differ: the comparison would be of
/// a build with itself.
pub(crate) fn distinct(ours: &Path, base: &Baseline) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let (a, b) = (
        std::fs::metadata(ours).with_context(|| format!("{}", ours.display()))?,
        std::fs::metadata(&base.bin).with_context(|| format!("{}", base.bin.display()))?,
    );
    let one_file = (a.dev(), a.ino()) == (b.dev(), b.ino());
    let same_bytes = !one_file
        && a.len() == b.len()
        && std::fs::read(ours)? == std::fs::read(&base.bin)?
        && !this_tree().starts_with(&base.name());
    if one_file || same_bytes {
        bail!(
            "{} and the baseline's {} are one binary: this comparison would measure a build              against itself (`cargo clean --release -p memwatch` and build again)",
            ours.display(),
            base.bin.display()
        );
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The baseline's binary is its own: never this tree's
    /// target/release/memwatch, which its build must not overwrite.
    #[test]
    fn the_baseline_builds_into_a_target_directory_of_its_own() {
        let target = Path::new("/w/target");
        let layout = Layout::new(target, "00cc42cd");
        assert_eq!(
            layout.src,
            Path::new("/w/target/bench-baseline/00cc42cd/src")
        );
        assert_eq!(
            layout.target,
            Path::new("/w/target/bench-baseline/00cc42cd/target")
        );
        assert_eq!(
            layout.bin,
            Path::new("/w/target/bench-baseline/00cc42cd/target/release/memwatch")
        );
        assert_ne!(layout.bin, target.join("release/memwatch"));
        let name = Baseline {
            bin: layout.bin,
            commit: "00cc42cd303b15f3".into(),
        }
        .name();
        assert_eq!(name, "00cc42c");
    }

    /// A baseline that is this tree's binary (one file, as a shared
    /// build-dir made it), or the same bytes from another commit, is
    /// refused; a binary of its own passes.
    #[test]
    fn a_baseline_that_is_this_trees_binary_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("memwatch");
        std::fs::write(&ours, b"this tree").unwrap();
        let linked = dir.path().join("linked");
        std::fs::hard_link(&ours, &linked).unwrap();
        let copied = dir.path().join("copied");
        std::fs::write(&copied, b"this tree").unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, b"the baseline").unwrap();
        let base = |bin: &Path| Baseline {
            bin: bin.to_path_buf(),
            commit: "0000000000000000000000000000000000000001".into(),
        };
        let refused = distinct(&ours, &base(&linked)).unwrap_err().to_string();
        assert!(refused.contains("one binary"), "{refused}");
        assert!(distinct(&ours, &base(&copied)).is_err());
        distinct(&ours, &base(&other)).unwrap();
    }
}
