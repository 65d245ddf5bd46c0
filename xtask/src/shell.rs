//! Running commands, and where things are.

use std::{
    env,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// The workspace root (this crate's parent directory).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `$CARGO_HOME/bin` (default `~/.cargo/bin`), where `cargo install` puts bpf-linker.
pub(crate) fn cargo_bin_dir() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

/// Puts `$CARGO_HOME/bin` on PATH for every child, so aya-build finds
/// bpf-linker even when the caller's PATH lacks it.
pub(crate) fn ensure_cargo_bin_on_path() {
    let bin = cargo_bin_dir();
    let path = env::var_os("PATH").unwrap_or_default();
    if !env::split_paths(&path).any(|p| p == bin) {
        let joined = env::join_paths(std::iter::once(bin).chain(env::split_paths(&path)))
            .expect("PATH entries are joinable");
        // SAFETY: xtask is single-threaded when it edits its environment.
        unsafe { env::set_var("PATH", joined) };
    }
}

/// Runs a command in the workspace root; fails on a non-zero exit.
pub(crate) fn run<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S]) -> anyhow::Result<()> {
    let program = program.as_ref();
    let shown = format!(
        "{} {}",
        program.to_string_lossy(),
        args.iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    eprintln!("xtask: $ {shown}");
    let status = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("cannot start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Runs cargo (the one that runs xtask).
pub(crate) fn cargo<S: AsRef<OsStr>>(args: &[S]) -> anyhow::Result<()> {
    run(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()), args)
}

/// Builds the agent and the test crate's binaries (memhog, faultbench...),
/// in release or debug, and returns their directory.
pub(crate) fn build_bins(release: bool) -> anyhow::Result<PathBuf> {
    let mut args = vec!["build", "--locked"];
    if release {
        args.push("--release");
    }
    args.extend(["-p", "memwatch", "-p", "memwatch-tests", "--bins"]);
    cargo(&args)?;
    let profile = if release { "release" } else { "debug" };
    Ok(workspace_root().join("target").join(profile))
}

/// A command's stdout, or `None` when it cannot run or fails.
pub(crate) fn output<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Replaces this process with `program` (so signals reach it directly).
pub(crate) fn exec(program: &Path, args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    eprintln!("xtask: $ {} {}", program.display(), args.join(" "));
    let error = Command::new(program).args(args).exec();
    Err(error).with_context(|| format!("cannot exec {}", program.display()))
}

/// Whether xtask runs as root (effective uid 0).
pub(crate) use memwatch_test_support::env::is_root;
