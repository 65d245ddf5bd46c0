//! Running commands, and where things are.

use std::{
    env,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
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

/// [`cargo`] with a bound: past `limit` the whole process group (cargo, the
/// test binary it runs and what that started) is killed and this fails,
/// so a test that hangs ends the run with its output instead of running
/// into CI's own time limit with none. The last `Running …` line cargo
/// printed names the test binary that hung.
pub(crate) fn cargo_bounded<S: AsRef<OsStr>>(args: &[S], limit: Duration) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let shown = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("xtask: $ cargo {shown} (bounded to {}s)", limit.as_secs());
    let mut child = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(args)
        .current_dir(workspace_root())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start `cargo {shown}`"))?;
    let status = memwatch_test_support::process::wait_timeout(&mut child, limit)
        .with_context(|| format!("waiting for `cargo {shown}`"))?;
    let Some(status) = status else {
        let group = child.id() as libc::pid_t;
        // SAFETY: signals the process group this function made.
        unsafe { libc::killpg(group, libc::SIGKILL) };
        let _ = child.wait();
        bail!(
            "`cargo {shown}` was still running after {}s and was killed: a test hangs \
             (the last `Running` line above names its binary)",
            limit.as_secs()
        );
    };
    if !status.success() {
        bail!("`cargo {shown}` failed ({status})");
    }
    Ok(())
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

/// Builds every host crate's tests and the binaries they run
/// (`target/debug/memwatch`, `memhog`, …) in one `cargo test --no-run`, so
/// the binaries get the same features as the tests (dev-dependencies turn
/// some on, e.g. tokio's `test-util`): a separate `cargo build --bins`
/// would build much of the dependency tree a second time. Returns each
/// test executable by its target's name.
pub(crate) fn build_tests() -> anyhow::Result<Vec<(String, PathBuf)>> {
    let args = [
        "test",
        "--locked",
        "--no-run",
        "--workspace",
        "--exclude",
        "agent-ebpf",
        "--message-format=json-render-diagnostics",
    ];
    eprintln!("xtask: $ cargo {}", args.join(" "));
    let out = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(args)
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests failed ({})", out.status);
    }
    let mut tests = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && let (Some(name), Some(exe)) =
                (msg["target"]["name"].as_str(), msg["executable"].as_str())
        {
            tests.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    Ok(tests)
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
