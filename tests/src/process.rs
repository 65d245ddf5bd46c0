//! Child processes with bounded waits, killed on drop.

use std::{
    fs::{File, OpenOptions, TryLockError},
    io::Read as _,
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
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

/// How long [`install_lock`] waits for another installer (Slurm, podman
/// and buildah from Debian take a minute or two each on a fresh machine).
const INSTALL_WAIT: Duration = Duration::from_secs(20 * 60);

/// One installer at a time on this host, whatever process it runs in: the
/// test binaries run at once (cargo-nextest, `.config/nextest.toml`), and two
/// apt-gets fight over dpkg's lock and the package lists, two pips over one
/// site-packages. An exclusive `flock` on a file in the temporary directory,
/// held until the returned file is dropped (a holder that dies releases it);
/// panics after [`INSTALL_WAIT`].
pub fn install_lock() -> File {
    let path = std::env::temp_dir().join("memwatch-tests-install.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let deadline = Instant::now() + INSTALL_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return file,
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(200));
            }
            Err(TryLockError::WouldBlock) => panic!(
                "another test held {} for {INSTALL_WAIT:?}: an install hangs",
                path.display()
            ),
            Err(TryLockError::Error(e)) => panic!("flock {}: {e}", path.display()),
        }
    }
}

/// `apt-get install` of `packages` unless `present()` already holds, one
/// install at a time on the host ([`install_lock`]); `apt-get update` first
/// when the lists are missing. Panics, naming the packages, when they
/// cannot be installed.
pub fn apt_install(packages: &[&str], present: impl Fn() -> bool) {
    if present() {
        return;
    }
    let _one_at_a_time = install_lock();
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
