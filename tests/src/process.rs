//! Child processes with bounded waits, killed on drop.

use std::{
    io::Read as _,
    process::{Child, Command, Output, Stdio},
    thread,
    time::Duration,
};

use memwatch_test_support::{
    env::{in_ci, is_root},
    process::wait_timeout,
};

/// Runs `cmd` to completion within `timeout` (killed after it), with its
/// output captured. Panics on a timeout, naming `what`.
pub fn run_bounded(what: &str, cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    // Read both pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let Some(status) = wait_timeout(&mut child, timeout).expect("wait") else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{what}: did not finish within {timeout:?}; stderr:\n{}",
            String::from_utf8_lossy(&err.join().unwrap_or_default())
        );
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// A command's stdout then its stderr, as text (for a failure message).
pub fn combined_output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A long-running child, SIGKILLed and reaped on drop.
pub struct Guarded(pub Child);

impl Guarded {
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Panics naming `what` when the child already exited.
    pub fn assert_running(&mut self, what: &str) {
        if let Ok(Some(status)) = self.0.try_wait() {
            panic!("{what} exited: {status}");
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether tests that install software and start clusters may run: as
/// root. Not root: skipped with the reason printed, or a failure in CI.
pub fn root_or_skip(test: &str, needs: &str) -> bool {
    if is_root() {
        return true;
    }
    if in_ci() {
        panic!("{test}: CI must run this test as root ({needs})");
    }
    eprintln!("skipped {test}: needs root ({needs})");
    false
}

/// `apt-get install` of `packages` unless `present()` already holds, one
/// install at a time in this process (tests of one binary run in parallel,
/// and two apt-gets fight over dpkg's lock), waiting for another process's
/// apt-get up to 5 minutes; `apt-get update` first when the lists are
/// missing. Panics, naming the packages, when they cannot be installed.
pub fn apt_install(packages: &[&str], present: impl Fn() -> bool) {
    static APT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = APT.lock().unwrap_or_else(|e| e.into_inner());
    if present() {
        return;
    }
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive");
        run_bounded("apt-get", &mut cmd, Duration::from_secs(600))
            .status
            .success()
    };
    let install: Vec<&str> = ["install", "-y", "-qq"]
        .into_iter()
        .chain(packages.iter().copied())
        .collect();
    if !apt(&install) {
        // A fresh machine may have no package lists yet.
        assert!(apt(&["update", "-qq"]), "apt-get update");
        assert!(apt(&install), "apt-get install {packages:?}");
    }
    assert!(present(), "{packages:?} missing after apt-get install");
}
