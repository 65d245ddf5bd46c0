//! `memwatch exec` over the agent's local socket: the agent has an
//! `api_token`, exec has no token at all, and the task is registered and
//! ended all the same, owned by exec's uid. Over HTTP, without the token,
//! the same exec is refused. Root (exec makes a memory cgroup; the agent
//! polls, no BPF); never skipped in CI.

use std::{process::Command, time::Duration};

use memwatch::EventKind;
use memwatch_tests::{agent::Agent, cgroup::TestCgroup, process::root_or_skip, workspace_bin};

const ADMIN_TOKEN: &str = "s3cret-admin-token";

/// A token file as the agent wants it: mode 0600.
fn private_file(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `memwatch exec` with none of the client's settings from the test's
/// environment: no token, no agent URL, no socket but the one given.
fn exec(args: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("memwatch"))
        .arg("exec")
        .args(args)
        .env_remove("MEMWATCH_TOKEN")
        .env_remove("MEMWATCH_AGENT")
        .env_remove("MEMWATCH_SOCKET")
        .output()
        .expect("run memwatch exec")
}

#[tokio::test]
async fn exec_over_the_socket_needs_no_token() {
    if !root_or_skip(
        "exec_over_the_socket_needs_no_token",
        "memwatch exec makes a memory cgroup",
    ) {
        return;
    }
    let worker = TestCgroup::create("socket-exec");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    private_file(&token, &format!("{ADMIN_TOKEN}\n"));
    let mut agent = Agent::start_with_config(&format!(
        "source = \"poll\"\napi_token_file = \"{}\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        token.display(),
        worker.path_str()
    ))
    .await;
    let socket = agent.socket().to_str().expect("UTF-8 path").to_string();

    let out = exec(&[
        "--socket",
        &socket,
        "--task-id",
        "t-sock",
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "registered and ended over the socket, CMD's status passed on: {}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent.log_text()
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("could not tell the agent"),
        "the end was told too: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    agent.set_token(ADMIN_TOKEN);
    let finished = agent
        .wait_for_event(Duration::from_secs(10), "task_finished", |e| {
            e.body.kind == EventKind::TaskFinished && e.body.task_id.as_deref() == Some("t-sock")
        })
        .await;
    assert_eq!(
        finished.body.reason.as_deref(),
        Some("ended with exit status 3")
    );
    let (code, body) = agent.get("/v1/status").await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let task = status["finished_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task_id"] == "t-sock")
        .unwrap_or_else(|| panic!("t-sock among the finished tasks: {status}"));
    // SAFETY: getuid(2) cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    assert_eq!(task["owner"], format!("uid:{uid}"), "{task}");
    assert_eq!(status["socket"]["listening"], true, "{status}");

    // The same exec over HTTP without the token is refused: the socket
    // made the difference.
    let out = exec(&[
        "--agent",
        &agent.base_url,
        "--task-id",
        "t-http",
        "--",
        "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// With no token configured (the shipped defaults), TCP reads and changes
/// nothing: any local user reaches 127.0.0.1. A reset or a registration
/// over TCP is refused with what to do instead, and nothing changes; the
/// same calls on the socket, as root, go through.
#[tokio::test]
async fn with_no_token_tcp_only_reads_and_the_socket_changes() {
    if !root_or_skip(
        "with_no_token_tcp_only_reads_and_the_socket_changes",
        "memwatch exec makes a memory cgroup",
    ) {
        return;
    }
    let worker = TestCgroup::create("socket-tcp-read");
    let agent = Agent::start_with_config(&format!(
        "source = \"poll\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        worker.path_str()
    ))
    .await;

    let (code, answer) = agent.post_tcp("/v1/workers/w1/reset", None).await;
    assert_eq!(code, 403, "{answer}");
    assert_eq!(answer["scope"], "admin", "{answer}");
    let (code, answer) = agent
        .post_tcp("/v1/tasks", Some(serde_json::json!({ "task_id": "t-tcp" })))
        .await;
    assert_eq!(code, 403, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap_or_default()
            .contains("local socket"),
        "says what to do: {answer}"
    );
    let out = exec(&[
        "--agent",
        &agent.base_url,
        "--task-id",
        "t-exec-tcp",
        "--",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("403") && stderr.contains("socket"),
        "{stderr}"
    );

    let (code, body) = agent.get("/v1/status").await;
    assert_eq!(code, 200, "TCP still reads: {body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["tasks"], serde_json::json!([]), "{status}");
    assert_eq!(status["finished_tasks"], serde_json::json!([]), "{status}");
    let kinds: Vec<EventKind> = agent
        .all_events()
        .await
        .iter()
        .map(|e| e.body.kind)
        .collect();
    assert!(
        !kinds.iter().any(|k| matches!(
            k,
            EventKind::TaskStarted | EventKind::TaskFinished | EventKind::WorkerRecovered
        )),
        "the refused calls made no event: {kinds:?}"
    );

    // On the socket, root is admin.
    let (code, answer) = agent.post("/v1/workers/w1/reset", None).await;
    assert_eq!(code, 200, "{answer}");
    let socket = agent.socket().to_str().expect("UTF-8 path").to_string();
    let out = exec(&[
        "--socket",
        &socket,
        "--task-id",
        "t-exec-sock",
        "--",
        "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The systemd unit makes the socket's directory (`RuntimeDirectory=`, the
/// default socket's parent): with `ProtectSystem=strict` nothing else
/// could, and TCP alone changes nothing without a token.
#[test]
fn the_systemd_unit_makes_the_default_sockets_directory() {
    let unit = memwatch_tests::ops::read("deploy/systemd/memwatch.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
    };
    assert_eq!(value("RuntimeDirectory"), Some("memwatch"));
    assert_eq!(value("RuntimeDirectoryMode"), Some("0755"));
    assert_eq!(value("ProtectSystem"), Some("strict"));
    let default = std::path::Path::new(memwatch::DEFAULT_SOCKET);
    assert_eq!(
        default.parent(),
        Some(std::path::Path::new("/run/memwatch"))
    );
    assert!(
        !unit.contains("--socket"),
        "the unit keeps the default socket, in its RuntimeDirectory"
    );
}

/// A token file other users may read is refused at start: exit 2, naming
/// the flag's key, the file and its mode; the agent never serves.
#[test]
fn a_token_file_others_may_read_stops_the_agent_at_start() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    private_file(&token, "s3cret\n");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new("timeout")
        .arg("30")
        .arg(workspace_bin("memwatch"))
        .args(["run", "--listen", "127.0.0.1:0", "--source", "poll"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--api-token-file")
        .arg(&token)
        .output()
        .expect("timeout (coreutils)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`api_token_file`"), "{stderr}");
    assert!(stderr.contains(&token.display().to_string()), "{stderr}");
    assert!(stderr.contains("mode 0644"), "{stderr}");
}

/// Connections held open on every slot of the TCP listener (300, past its
/// bound of 256) do not starve the probes: `/live` and `/health` answer
/// within 1 s, each on a new connection (kubelet's way). The agent polls;
/// no privilege needed beyond starting it.
#[tokio::test]
async fn held_connections_do_not_starve_the_probes() {
    let agent = Agent::start(&["--source", "poll"]).await;
    let addr = agent
        .base_url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    for path in ["/live", "/health"] {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let asked = std::time::Instant::now();
        let answer = client
            .get(format!("{}{path}", agent.base_url))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path} past 300 held connections: {e}"));
        let took = asked.elapsed();
        eprintln!(
            "{path}: {} in {took:?} past 300 held connections",
            answer.status()
        );
        assert!(answer.status().is_success(), "{path}: {}", answer.status());
        assert!(took < Duration::from_secs(1), "{path} took {took:?}");
    }
    drop(held);
}
