//! A real `nats-server` with JetStream on a loopback port, for the NATS
//! sink's tests. Installed from Debian when missing (as root); killed on drop.

use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use memwatch_test_support::env::{in_ci, is_root};

/// How long the server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The `nats-server` binary: on PATH, or installed with apt-get when we are
/// root. `None` (after printing why) where it can be neither; in CI that
/// is a failure, not a skip.
pub fn nats_server_binary(test: &str) -> Option<PathBuf> {
    if let Ok(path) = which::which("nats-server") {
        return Some(path);
    }
    if is_root() {
        // The machine's policy-rc.d keeps the packaged service from
        // starting; tests start their own server.
        crate::process::apt_install(&["nats-server"], || which::which("nats-server").is_ok());
        return Some(which::which("nats-server").expect("nats-server after install"));
    }
    if in_ci() {
        panic!("{test}: CI must have nats-server or run as root to install it");
    }
    eprintln!("skipped {test}: nats-server is missing and installing it needs root");
    None
}

pub struct NatsServer {
    child: Child,
    pub port: u16,
}

impl NatsServer {
    /// Starts `nats-server -js` on 127.0.0.1:`port`, storing in `store_dir`,
    /// and waits until it accepts connections.
    pub fn start(binary: &Path, port: u16, store_dir: &Path) -> NatsServer {
        let child = Command::new(binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        let mut server = NatsServer { child, port };
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("nats-server exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "nats-server not listening after {START_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
        // JetStream needs a moment more than the listener.
        thread::sleep(Duration::from_millis(200));
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (no clean shutdown), as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
