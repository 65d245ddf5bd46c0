//! An independent OTLP logs receiver (tests/src/otlp_receiver.py: Python,
//! PyPI's opentelemetry-proto with grpcio and protobuf) on two loopback
//! ports, for the OpenTelemetry sink's tests. The packages are installed
//! with pip when missing (as root); the receiver is killed on drop.

use std::{
    fs,
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use memwatch_test_support::http::free_port;

use crate::process::{Guarded, root_or_skip, run_bounded};

/// The receiver, beside this file in the repository.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/otlp_receiver.py");
/// The PyPI packages it imports.
const PACKAGES: [&str; 3] = ["opentelemetry-proto", "grpcio", "protobuf"];
/// How long it may take to listen on both ports.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `python3` that imports grpc and opentelemetry.proto: as found, or after
/// `pip install` of [`PACKAGES`] (root). `None` (reason printed) where
/// neither; in CI that is a failure.
pub fn python_with_otlp(test: &str) -> Option<PathBuf> {
    let python = which::which("python3").expect("python3 on PATH");
    let importable = || {
        Command::new(&python)
            .args([
                "-c",
                "import grpc; from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if importable() {
        return Some(python);
    }
    if !root_or_skip(test, "to pip install opentelemetry-proto grpcio protobuf") {
        return None;
    }
    // Another test may be installing the same packages: wait, look again.
    let _one_at_a_time = crate::process::install_lock();
    if importable() {
        return Some(python);
    }
    let pip = |extra: &[&str]| {
        let mut cmd = Command::new(&python);
        cmd.args(["-m", "pip", "install", "-q"])
            .args(PACKAGES)
            .args(extra);
        run_bounded("pip install", &mut cmd, Duration::from_secs(300))
            .status
            .success()
    };
    // Debian marks its Python "externally managed"; a test machine is ours.
    assert!(
        pip(&[]) || pip(&["--break-system-packages"]),
        "pip install {PACKAGES:?} failed"
    );
    assert!(
        importable(),
        "opentelemetry-proto not importable after pip install"
    );
    Some(python)
}

/// The receiver process, its ports and the files it writes.
pub struct OtlpReceiver {
    python: PathBuf,
    pub grpc_port: u16,
    pub http_port: u16,
    dir: tempfile::TempDir,
    process: Option<Guarded>,
}

impl OtlpReceiver {
    /// Starts the receiver on two free ports and waits until both listen.
    pub fn start(python: PathBuf) -> OtlpReceiver {
        let mut receiver = OtlpReceiver {
            python,
            grpc_port: free_port(),
            http_port: free_port(),
            dir: tempfile::tempdir().expect("receiver dir"),
            process: None,
        };
        receiver.restart();
        receiver
    }

    /// Starts it again (after [`OtlpReceiver::kill`]) on the same ports,
    /// appending to the same file.
    pub fn restart(&mut self) {
        assert!(self.process.is_none(), "the receiver runs already");
        let child = Command::new(&self.python)
            .arg(SCRIPT)
            .args(["--grpc-port", &self.grpc_port.to_string()])
            .args(["--http-port", &self.http_port.to_string()])
            .arg("--out")
            .arg(self.records_file())
            .arg("--control")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.dir.path().join("stderr")).expect("stderr file"))
            .spawn()
            .expect("start the OTLP receiver");
        let mut process = Guarded(child);
        let deadline = Instant::now() + START_TIMEOUT;
        for port in [self.grpc_port, self.http_port] {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if process.0.try_wait().ok().flatten().is_some() {
                    panic!("the OTLP receiver exited at start:\n{}", self.stderr());
                }
                assert!(
                    Instant::now() < deadline,
                    "the OTLP receiver not listening on {port} after {START_TIMEOUT:?}"
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
        self.process = Some(process);
    }

    /// Kills it at once, as a crash would.
    pub fn kill(&mut self) {
        self.process = None;
    }

    /// Makes it answer UNAVAILABLE (gRPC) and 503 (HTTP) to every export
    /// while `on`.
    pub fn unavailable(&self, on: bool) {
        let flag = self.dir.path().join("unavailable");
        if on {
            fs::write(flag, b"").expect("set unavailable");
        } else {
            let _ = fs::remove_file(flag);
        }
    }

    /// How many exports it answered UNAVAILABLE / 503.
    pub fn refused(&self) -> usize {
        fs::read_to_string(self.dir.path().join("refused"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    fn records_file(&self) -> PathBuf {
        self.dir.path().join("records.jsonl")
    }

    /// Every record taken, in the order taken (one JSON object each: see
    /// the script).
    pub fn records(&self) -> Vec<serde_json::Value> {
        let text = fs::read_to_string(self.records_file()).unwrap_or_default();
        text.lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line from the receiver"))
            .collect()
    }

    /// What it wrote to stderr (for a failure message).
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
