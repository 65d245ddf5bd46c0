//! The image under a real container runtime with the DaemonSet's security
//! context: podman + runc (Debian's), uid 0 with every capability dropped
//! but BPF and PERFMON, read-only root, no-new-privileges, the host's pids,
//! the DaemonSet's host mounts. With the seccomp profile memwatch ships
//! (deploy/seccomp/memwatch.json: no wider than containers-common's or
//! containerd's default, tests/ops/seccomp.rs) the probe loads: `/ready`, `source:
//! ebpf`, an OOM kill on the host reported live with its victim named.
//! With the runtime's own default profile (Debian 12's containers-common,
//! which allows bpf(2) only with CAP_SYS_ADMIN) it falls back to polling
//! and `/health` says "seccomp blocks bpf()", as docs/install.md says.
//! Root only; podman, buildah and runc installed from Debian when missing;
//! never skipped in CI.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use memwatch_test_support::http::{free_port, http_get, status_code};
use memwatch_tests::{
    cgroup::TestCgroup,
    kernel_tests_enabled, memhog_in,
    ops::repo,
    process::{apt_install, combined_output, run_bounded},
    workspace_bin,
};
use serde_json::Value;

/// The runtime's default profile (one of those the shipped one derives from).
const RUNTIME_DEFAULT: &str = "/usr/share/containers/seccomp.json";
const TAG: &str = "localhost/memwatch:0.1.0-test";
/// Time for one podman or build command (the image is built with vfs).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);

fn ensure_runtime() {
    apt_install(&["podman", "buildah", "runc"], || {
        ["podman", "buildah", "runc"]
            .iter()
            .all(|b| which::which(b).is_ok())
            && Path::new(RUNTIME_DEFAULT).exists()
    });
}

fn run(what: &str, cmd: &mut Command) -> String {
    let out = run_bounded(what, cmd, COMMAND_TIMEOUT);
    assert!(
        out.status.success(),
        "{what} failed: {}",
        combined_output(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// podman with storage of its own (removed with the test's directory), the
/// settings MACHINE-NOTES gives for these machines: vfs, cgroupfs, runc, and
/// no default rlimits (neither runtime can set them here).
struct Podman {
    dir: PathBuf,
    /// Containers started, removed on drop.
    started: Vec<String>,
}

impl Podman {
    fn new(dir: &Path) -> Podman {
        fs::write(
            dir.join("containers.conf"),
            "[containers]\ndefault_ulimits = []\n",
        )
        .unwrap();
        Podman {
            dir: dir.to_path_buf(),
            started: Vec::new(),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .args([
                "--storage-driver=vfs",
                "--cgroup-manager=cgroupfs",
                "--runtime",
                "runc",
            ]);
        cmd
    }

    /// Starts the agent from the image as the DaemonSet does (its security
    /// context and host mounts), with `seccomp` as the profile (`None`: the
    /// runtime's default), listening on 127.0.0.1:`port`.
    fn start_agent(&mut self, name: &str, seccomp: Option<&Path>, port: u16) {
        let state = self.dir.join(format!("state-{name}"));
        fs::create_dir_all(&state).unwrap();
        let mut cmd = self.command();
        cmd.args(["run", "-d", "--name", name])
            .args(["--network", "host", "--pid", "host", "--user", "0:0"])
            .args([
                "--cap-drop",
                "ALL",
                "--cap-add",
                "BPF",
                "--cap-add",
                "PERFMON",
            ])
            .args(["--read-only", "--security-opt", "no-new-privileges"]);
        if let Some(profile) = seccomp {
            cmd.arg("--security-opt")
                .arg(format!("seccomp={}", profile.display()));
        }
        for (host, inside, mode) in [
            ("/sys/fs/cgroup", "/sys/fs/cgroup", "ro"),
            ("/sys/kernel/btf", "/sys/kernel/btf", "ro"),
            ("/sys/kernel/tracing", "/sys/kernel/tracing", "ro"),
        ] {
            cmd.arg("-v").arg(format!("{host}:{inside}:{mode}"));
        }
        cmd.arg("-v")
            .arg(format!("{}:/var/lib/memwatch:rw", state.display()))
            .arg(TAG)
            .args(["run", "--state-dir=/var/lib/memwatch", "--node-name=ctr"])
            .arg(format!("--listen=127.0.0.1:{port}"));
        run(&format!("podman run {name}"), &mut cmd);
        self.started.push(name.to_string());
    }

    fn logs(&self, name: &str) -> String {
        let out = run_bounded(
            "podman logs",
            self.command().args(["logs", name]),
            COMMAND_TIMEOUT,
        );
        combined_output(&out)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for name in &self.started {
            let _ = run_bounded(
                "podman rm",
                self.command().args(["rm", "-f", "-t", "5", name]),
                COMMAND_TIMEOUT,
            );
        }
    }
}

/// The JSON body of GET `path`, with its status code.
fn get(port: u16, path: &str) -> Option<(u16, Value)> {
    let answer = http_get(port, path).ok()?;
    let code = status_code(&answer)?;
    let body = answer.split_once("\r\n\r\n")?.1;
    Some((code, serde_json::from_str(body).ok()?))
}

/// Waits (bounded) until `/ready` answers 200; then `/health`.
fn ready_health(podman: &Podman, name: &str, port: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if http_get(port, "/ready").ok().and_then(|a| status_code(&a)) == Some(200) {
            return get(port, "/health").expect("/health").1;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: never ready; logs:\n{}",
            podman.logs(name)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_daemonset_container_loads_the_probe_with_the_shipped_seccomp_profile() {
    const TEST: &str = "the_daemonset_container_loads_the_probe_with_the_shipped_seccomp_profile";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    ensure_runtime();
    let shipped = repo().join("deploy/seccomp/memwatch.json");
    // The shipped profile: the runtimes' defaults intersected, plus bpf and
    // perf_event_open.
    // That it is derive.py's output, no wider than containers-common's
    // default (this runtime's) and containerd's: tests/ops/seccomp.rs.

    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("memwatch");
    run(
        "objcopy",
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(workspace_bin("memwatch"))
            .arg(&bin),
    );
    let archive = work.path().join("memwatch.oci.tar");
    run(
        "build-oci.sh",
        Command::new(repo().join("deploy/docker/build-oci.sh"))
            .arg(&bin)
            .arg(&archive)
            .arg("0.1.0-test"),
    );
    let mut podman = Podman::new(work.path());
    run(
        "podman load",
        podman
            .command()
            .arg("load")
            .arg("-q")
            .arg("-i")
            .arg(&archive),
    );

    // The shipped profile: the probe loads and sees a kill on the host.
    let port = free_port();
    podman.start_agent("memwatch-shipped", Some(&shipped), port);
    let health = ready_health(&podman, "memwatch-shipped", port);
    assert_eq!(
        (health["source"].as_str(), health["attach"].as_str()),
        (Some("ebpf"), Some("tp_btf")),
        "{health}\nlogs:\n{}",
        podman.logs("memwatch-shipped")
    );
    let victim = TestCgroup::create("container-victim");
    victim.limit(32 << 20);
    let status = memhog_in(victim.path(), 64, 30)
        .status()
        .expect("run memhog");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "OOM-killed: {status}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let kill = loop {
        let events = get(port, "/v1/events?after=0").map(|(_, e)| e);
        let kill = events.as_ref().and_then(|events| {
            events.as_array()?.iter().find(|e| {
                e["kind"] == "oom_kill" && e["cgroup"].as_str() == Some(victim.path_str())
            })
        });
        if let Some(kill) = kill {
            break kill.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no oom_kill for {}: {events:?}\nlogs:\n{}",
            victim.path_str(),
            podman.logs("memwatch-shipped")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(kill["comm"], "memhog", "the victim named: {kill}");
    assert!(kill["pid"].as_u64().is_some(), "{kill}");
    assert_ne!(kill["recovered"], true, "seen live: {kill}");

    // The runtime's default profile: bpf(2) refused, named as such.
    let port = free_port();
    podman.start_agent("memwatch-default", None, port);
    let health = ready_health(&podman, "memwatch-default", port);
    assert_eq!(health["source"], "poll", "{health}");
    let reasons = health["reasons"].to_string();
    assert!(reasons.contains("seccomp blocks bpf()"), "{health}");
    println!(
        "podman + runc, DaemonSet context: shipped profile → ebpf/tp_btf, kill of pid {} named; \
         runtime default → poll: {reasons}",
        kill["pid"]
    );
}
