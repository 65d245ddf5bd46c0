//! The capabilities the docs claim (deploy/systemd/memwatch.service's
//! `AmbientCapabilities=`, the DaemonSet's `capabilities.add`) are enough,
//! and each one is needed. Root only (it hands out capabilities); never
//! skipped in CI.

use std::{os::unix::fs::chown, process::Command, time::Duration};

use memwatch::EventKind;
use memwatch_test_support::env::in_ci;
use memwatch_tests::{
    agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, memhog_in,
    ops::documented_capabilities, process::combined_output, workspace_bin,
};

const MIB: u64 = 1 << 20;
const NOBODY: u32 = 65534;

/// `CAP_BPF CAP_PERFMON` → `+bpf,+perfmon` for setpriv.
fn setpriv_list(caps: &[String]) -> String {
    let mut list = String::from("-all");
    for cap in caps {
        list.push_str(",+");
        list.push_str(&cap.trim_start_matches("CAP_").to_lowercase());
    }
    list
}

/// How systemd runs the unit (DynamicUser=, AmbientCapabilities=,
/// CapabilityBoundingSet=, NoNewPrivileges=): an unprivileged user holding
/// exactly `caps`.
fn as_service_user(caps: &[String]) -> Vec<String> {
    let list = setpriv_list(caps);
    vec![
        "setpriv".into(),
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
        format!("--inh-caps={list}"),
        format!("--ambient-caps={list}"),
        format!("--bounding-set={list}"),
        "--no-new-privs".into(),
        "--".into(),
    ]
}

/// How the container runtime runs the DaemonSet's container (uid 0,
/// `drop: [ALL]`, `add: caps`, allowPrivilegeEscalation: false).
fn as_container_root(caps: &[String]) -> Vec<String> {
    vec![
        "setpriv".into(),
        "--inh-caps=-all".into(),
        "--ambient-caps=-all".into(),
        format!("--bounding-set={}", setpriv_list(caps)),
        "--no-new-privs".into(),
        "--".into(),
    ]
}

/// A state directory owned by `uid`, mode 0700: as StateDirectory= makes it
/// for the service user, as a root-owned hostPath is for the container (uid
/// 0 without CAP_DAC_OVERRIDE writes only what it owns).
fn state_dir_owned_by(uid: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("state dir");
    chown(dir.path(), Some(uid), Some(uid)).expect("chown the state dir");
    dir
}

async fn ready_and_reports_an_oom_kill(wrapper: &[String], owner: u32, label: &str) {
    let state = state_dir_owned_by(owner);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut agent = Agent::start_wrapped(&wrapper, state.path(), &[]).await;
    // start_wrapped returned: /ready said 200 under these capabilities.
    let cgroup = TestCgroup::create(&format!("caps-{label}"));
    cgroup.limit(64 * MIB);
    let mut child = memhog_in(cgroup.path(), 200, 30)
        .spawn()
        .expect("spawn memhog");
    let pid = child.id();
    let event = agent
        .wait_for_event(Duration::from_secs(30), "oom_kill", |e| {
            e.body.kind == EventKind::OomKill && e.body.pid == Some(pid)
        })
        .await;
    let _ = child.wait();
    assert_eq!(event.body.cgroup.as_deref(), Some(cgroup.path_str()));
    let (code, health) = agent.get("/health").await;
    assert_eq!(code, 200, "{health}");
    assert!(health.contains("\"source\":\"ebpf\""), "{health}");
    assert_eq!(agent.stop(), Some(0), "{}", agent.log_text());
}

#[tokio::test]
async fn documented_capabilities_suffice_as_the_service_user_and_as_container_root() {
    if !kernel_tests_enabled(
        "documented_capabilities_suffice_as_the_service_user_and_as_container_root",
    ) {
        return;
    }
    let caps = documented_capabilities();
    assert_eq!(
        caps,
        ["CAP_BPF", "CAP_PERFMON"],
        "the docs' set changed: re-measure"
    );
    ready_and_reports_an_oom_kill(&as_service_user(&caps), NOBODY, "user").await;
    ready_and_reports_an_oom_kill(&as_container_root(&caps), 0, "root").await;
}

#[tokio::test]
async fn without_any_one_documented_capability_run_fails_naming_it() {
    if !kernel_tests_enabled("without_any_one_documented_capability_run_fails_naming_it") {
        return;
    }
    let caps = documented_capabilities();
    for missing in &caps {
        let rest: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        for (wrapper, owner) in [
            (as_service_user(&rest), NOBODY),
            (as_container_root(&rest), 0),
        ] {
            let state = state_dir_owned_by(owner);
            // `--source ebpf`: the default (`auto`) would fall back to polling
            // and keep running. Bounded: a run that does not fail is killed.
            let out = Command::new("timeout")
                .arg("60")
                .args(&wrapper)
                .arg(workspace_bin("memwatch"))
                .args([
                    "run",
                    "--listen",
                    "127.0.0.1:0",
                    "--source",
                    "ebpf",
                    "--state-dir",
                ])
                .arg(state.path())
                .output()
                .expect("timeout (coreutils) and setpriv (util-linux)");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{wrapper:?}: {stderr}");
            assert!(
                stderr.contains(&format!("missing capability {missing}")),
                "{wrapper:?} must name {missing}: {stderr}"
            );
        }
    }
}

#[test]
fn systemd_unit_verifies_offline() {
    let analyze = which::which("systemd-analyze");
    let Ok(analyze) = analyze else {
        if in_ci() {
            panic!("systemd-analyze is missing (Debian package `systemd`)");
        }
        eprintln!("skipped systemd_unit_verifies_offline: no systemd-analyze");
        return;
    };
    // verify wants ExecStart= to exist: point it at the built binary.
    let unit = memwatch_tests::ops::read("deploy/systemd/memwatch.service").replace(
        "/usr/local/bin/memwatch",
        workspace_bin("memwatch").to_str().expect("UTF-8 path"),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memwatch.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze verify");
    let text = combined_output(&out);
    // verify exits 0 on unknown keys, only warning: any output is a failure.
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
}

/// Every datagram that reaches `socket` until one contains `wanted` (or
/// the deadline passes: a panic naming what came).
fn notifications_until(
    socket: &std::os::unix::net::UnixDatagram,
    wanted: &str,
    within: Duration,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while std::time::Instant::now() < deadline {
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        if let Ok(n) = socket.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            if got.last().is_some_and(|m| m.contains(wanted)) {
                return got;
            }
        }
    }
    panic!("no {wanted:?} within {within:?}; got {got:?}");
}

#[tokio::test]
async fn systemd_notify_ready_watchdog_and_stopping_from_the_real_agent() {
    // As systemd runs the unit (Type=notify, WatchdogSec=): the real agent
    // says READY=1 once /ready is 200, keeps the watchdog (2 s here: a ping
    // every second) while it is live, and says STOPPING=1 at SIGTERM. The
    // watchdog withheld from a stalled loop: telemetry::notify's unit test.
    if !kernel_tests_enabled("systemd_notify_ready_watchdog_and_stopping_from_the_real_agent") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let path = path.to_str().expect("UTF-8 path").to_string();
    let mut agent = Agent::start_with_env(
        &[("NOTIFY_SOCKET", &path), ("WATCHDOG_USEC", "2000000")],
        &[],
    )
    .await;
    let (status, _) = agent.get("/ready").await;
    assert_eq!(status, 200);
    let before = notifications_until(&socket, "READY=1", Duration::from_secs(5));
    assert_eq!(before[0], "STATUS=starting\n", "{before:?}");
    let ready = before.last().unwrap();
    assert!(ready.contains("\nSTATUS=ready: source "), "{ready}");
    assert!(
        before[..before.len() - 1]
            .iter()
            .all(|m| !m.contains("READY=1")),
        "{before:?}"
    );
    let pings = notifications_until(&socket, "WATCHDOG=1", Duration::from_secs(3));
    assert!(pings.iter().all(|m| !m.contains("STOPPING")), "{pings:?}");
    notifications_until(&socket, "WATCHDOG=1", Duration::from_secs(3));
    // SIGTERM, a clean exit, and STOPPING=1 said on the way.
    assert_eq!(agent.stop(), Some(0), "{}", agent.log_text());
    notifications_until(&socket, "STOPPING=1", Duration::from_secs(1));
}

/// A seccomp filter as Debian 12's container profile behaves for a
/// process without CAP_SYS_ADMIN: `bpf(2)` refused with EPERM, the rest
/// allowed. Installed in the child before it execs (x86_64 numbers).
fn refuse_bpf_with_eperm() -> std::io::Result<()> {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const SYS_BPF: u32 = 321;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        // arch == x86_64, else allow (the test runs there only).
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH_X86_64,
            0,
            3,
        ),
        // nr == bpf → EPERM
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, SYS_BPF, 0, 1),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with a filter that lives until the call returns (the
    // kernel copies it).
    let rc = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The capabilities are there, a seccomp filter refuses `bpf(2)`: doctor
/// (and `run`'s fallback reason, the same error) says "seccomp blocks
/// bpf()", not a map error, and polling is the source left.
#[test]
fn a_seccomp_filter_refusing_bpf_is_named_by_doctor() {
    if !kernel_tests_enabled("a_seccomp_filter_refusing_bpf_is_named_by_doctor")
        || !cfg!(target_arch = "x86_64")
    {
        return;
    }
    let mut doctor = Command::new(workspace_bin("memwatch"));
    doctor.args(["doctor", "--json"]);
    // SAFETY: only async-signal-safe calls (prctl) between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut doctor, refuse_bpf_with_eperm);
    }
    let out = doctor.output().expect("memwatch doctor");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let rows = report["rows"].as_array().expect("rows");
    let source = rows
        .iter()
        .find(|r| r["name"] == "source for `run`")
        .unwrap_or_else(|| panic!("no source row: {report}"));
    let detail = source["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("seccomp blocks bpf()") && detail.starts_with("poll"),
        "{source}"
    );
    println!("under a filter refusing bpf(2): {detail}");
}
