//! A local user against memwatch on a shared host (issue 25), played by a
//! real unprivileged uid (65534, through `setpriv`, every request made by
//! `curl` running as that uid), against the agent started as each shipped
//! form starts it: the systemd unit's (a service uid of its own with
//! ambient CAP_BPF and CAP_PERFMON, its socket in a 0755 runtime directory,
//! its state directory 0700) and the image's (uid 0 with only those
//! capabilities in its bounding set). Every forged request is refused with
//! a reason and changes nothing (no event, no task, the first task's owner
//! kept); the legitimate ones still go through.
//!
//! Proven elsewhere, against real parts: a user-made `job_<N>` cgroup
//! requeues nothing and a job exec'd on one of two slurmds is requeued
//! (schedulers/slurm.rs); probes answer within 1 s with every connection
//! slot held and the state directory frozen (delivery/frozen_disk.rs,
//! ops/socket.rs); token files open to others stop the agent
//! (ops/socket.rs); Kubernetes' allow-listed admission policy and the
//! seccomp profile against the runtimes' defaults (ops/admission.rs,
//! ops/seccomp.rs). Root only; never skipped in CI.

use std::{
    os::unix::fs::{PermissionsExt as _, chown},
    path::Path,
    process::{Child, Command, Stdio},
};

use memwatch::EventKind;
use memwatch_tests::{
    agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, ops::documented_capabilities,
};
use serde_json::{Value, json};

/// The attacker: `nobody`, no capability, no group.
const ATTACKER: u32 = 65534;
/// The systemd unit's dynamic user, here a fixed uid of its own.
const SERVICE: u32 = 61_234;

fn setpriv_caps(caps: &[String]) -> String {
    let mut list = String::from("-all");
    for cap in caps {
        list.push_str(",+");
        list.push_str(&cap.trim_start_matches("CAP_").to_lowercase());
    }
    list
}

/// A command run as the attacker.
fn as_attacker(program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command.args([
        &format!("--reuid={ATTACKER}"),
        &format!("--regid={ATTACKER}"),
        "--clear-groups",
        "--inh-caps=-all",
        "--no-new-privs",
        "--",
        program,
    ]);
    command
}

/// `curl` as the attacker: the status and the body.
fn curl(socket: Option<&Path>, method: &str, url: &str, body: Option<&Value>) -> (u16, String) {
    let mut command = as_attacker("curl");
    command.args(["-sS", "-m", "10", "-X", method, "-w", "\n%{http_code}"]);
    if let Some(socket) = socket {
        command.arg("--unix-socket").arg(socket);
    }
    if let Some(body) = body {
        command.args([
            "-H",
            "content-type: application/json",
            "-d",
            &body.to_string(),
        ]);
    }
    let out = command.arg(url).output().expect("setpriv and curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code = code.trim().parse().unwrap_or_else(|_| {
        panic!(
            "curl {method} {url}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, body.to_string())
}

/// A `sleep` whose real uid is the attacker's (or root's), killed on drop.
struct Sleeper(Child);

impl Sleeper {
    fn attackers() -> Sleeper {
        Sleeper(
            as_attacker("sleep")
                .arg("300")
                .stdout(Stdio::null())
                .spawn()
                .expect("sleep as the attacker"),
        )
    }

    fn roots() -> Sleeper {
        Sleeper(Command::new("sleep").arg("300").spawn().expect("sleep"))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The events that are not heartbeats (those come every interval) nor
/// kills outside the test's worker: the agent watches the whole host, and
/// a test beside this one may have a real OOM kill (seen in a fresh-clone
/// CI of f4b6228); no request makes the kernel kill.
async fn changes(agent: &Agent) -> Vec<(u64, EventKind, Option<String>)> {
    agent
        .all_events()
        .await
        .into_iter()
        .filter(|e| e.body.kind != EventKind::Heartbeat)
        .filter(|e| e.body.kind != EventKind::OomKill || e.body.worker.as_deref() == Some("w1"))
        .map(|e| (e.seq, e.body.kind, e.body.task_id.clone()))
        .collect()
}

/// The running task `id` in `/v1/status`, if any.
async fn task(agent: &Agent, id: &str) -> Option<Value> {
    let (code, body) = agent.get("/v1/status").await;
    assert_eq!(code, 200, "{body}");
    let status: Value = serde_json::from_str(&body).expect("status JSON");
    status["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["task_id"] == id)
        .cloned()
}

/// A directory the attacker may traverse, owned by `uid`, mode 0755: as
/// systemd's `RuntimeDirectory=` (and the image's `/run/memwatch`) is.
fn runtime_dir(uid: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("runtime dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    chown(dir.path(), Some(uid), Some(uid)).expect("chown");
    dir
}

/// Starts the agent as `wrapper` (a shipped form's privileges) with one
/// worker, and plays every attack on it.
async fn attack(form: &str, wrapper: &[String], owner: u32) {
    let parent = TestCgroup::create(&format!("attack-{form}"));
    let worker = parent.child("worker");
    let delegated = parent.child("delegated");
    chown(delegated.path(), Some(ATTACKER), Some(ATTACKER)).expect("delegate a cgroup");
    let state = tempfile::tempdir().expect("state dir");
    chown(state.path(), Some(owner), Some(owner)).unwrap();
    let run = runtime_dir(owner);
    let socket = run.path().join("api.sock");
    let config = run.path().join("memwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\nsoft_cap = \"1GiB\"\n",
            worker.path_str()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let agent = Agent::start_wrapped(
        &wrapper,
        state.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
        ],
    )
    .await;
    let tcp = agent.base_url.trim_end_matches('/').to_string();
    let on_socket = |path: &str| format!("http://localhost{path}");
    let agent_pid = agent.pid().expect("the agent runs");
    let roots = Sleeper::roots();
    let own = Sleeper::attackers();

    // Root (admin on the socket) registers the task the attacker will
    // try to take.
    let (code, answer) = agent
        .post(
            "/v1/tasks",
            Some(json!({"task_id": "victim", "worker": "w1", "pid": roots.pid()})),
        )
        .await;
    assert_eq!(code, 201, "{form}: root registers: {answer}");
    let victim = task(&agent, "victim").await.expect("victim runs");
    let before = changes(&agent).await;

    // 1. TCP without a token only reads.
    for (method, path, body) in [
        ("POST", "/v1/workers/w1/reset", None),
        (
            "POST",
            "/v1/tasks",
            Some(json!({"task_id": "t-tcp", "worker": "w1", "pid": own.pid()})),
        ),
        ("DELETE", "/v1/tasks/victim", None),
    ] {
        let (code, body) = curl(None, method, &format!("{tcp}{path}"), body.as_ref());
        assert_eq!(code, 403, "{form}: TCP {method} {path}: {body}");
        assert!(
            body.contains("socket") || body.contains("token"),
            "{form}: the refusal says what to do: {body}"
        );
    }
    for path in ["/health", "/v1/status", "/v1/events"] {
        let (code, body) = curl(None, "GET", &format!("{tcp}{path}"), None);
        assert_eq!(code, 200, "{form}: TCP GET {path} reads: {body}");
    }

    // 2. On the socket, only what the attacker owns.
    let forged = [
        ("pid 1", json!({"pid": 1}), "pid 1"),
        ("a kernel thread", json!({"pid": 2}), "not yours"),
        ("the agent", json!({"pid": agent_pid}), "not yours"),
        ("root's process", json!({"pid": roots.pid()}), "not yours"),
        (
            "the hierarchy's root",
            json!({"cgroup": parent.path().parent().unwrap()}),
            "root",
        ),
        (
            "the worker's cgroup",
            json!({"cgroup": worker.path()}),
            "worker",
        ),
        (
            "an ancestor of the worker",
            json!({"cgroup": parent.path()}),
            "worker",
        ),
    ];
    for (i, (what, source, why)) in forged.iter().enumerate() {
        let mut body = json!({"task_id": format!("forged-{i}"), "worker": "w1"});
        body.as_object_mut()
            .unwrap()
            .extend(source.as_object().unwrap().clone());
        let (code, answer) = curl(Some(&socket), "POST", &on_socket("/v1/tasks"), Some(&body));
        assert_eq!(code, 403, "{form}: registering {what}: {answer}");
        assert!(answer.contains(why), "{form}: {what}: the reason: {answer}");
        assert!(task(&agent, &format!("forged-{i}")).await.is_none());
    }

    // 3. The victim's id is not the attacker's to take or end.
    let (code, answer) = curl(
        Some(&socket),
        "POST",
        &on_socket("/v1/tasks"),
        Some(&json!({"task_id": "victim", "worker": "w1", "pid": own.pid()})),
    );
    assert_eq!(code, 409, "{form}: taking a task id: {answer}");
    let (code, answer) = curl(
        Some(&socket),
        "DELETE",
        &on_socket("/v1/tasks/victim"),
        None,
    );
    assert_eq!(code, 403, "{form}: ending another's task: {answer}");
    let (code, answer) = curl(
        Some(&socket),
        "POST",
        &on_socket("/v1/workers/w1/reset"),
        None,
    );
    assert_eq!(code, 403, "{form}: resetting a worker: {answer}");
    assert_eq!(
        task(&agent, "victim").await,
        Some(victim.clone()),
        "{form}: nothing of the victim changed"
    );
    assert_eq!(
        changes(&agent).await,
        before,
        "{form}: no forged request made an event"
    );

    // 4. The socket is the agent's: the attacker cannot replace it.
    let out = as_attacker("rm")
        .arg("-f")
        .arg(&socket)
        .output()
        .expect("rm as the attacker");
    assert!(
        !out.status.success(),
        "{form}: the attacker removed the socket"
    );
    assert!(socket.exists());

    // 5. What the attacker owns it may register, and end.
    for (id, source) in [
        ("own-pid", json!({"pid": own.pid()})),
        ("own-cgroup", json!({"cgroup": delegated.path()})),
    ] {
        let mut body = json!({"task_id": id, "worker": "w1"});
        body.as_object_mut()
            .unwrap()
            .extend(source.as_object().unwrap().clone());
        let (code, answer) = curl(Some(&socket), "POST", &on_socket("/v1/tasks"), Some(&body));
        assert_eq!(code, 201, "{form}: registering {id}: {answer}");
        let task = task(&agent, id).await.expect("registered");
        assert_eq!(task["owner"], format!("uid:{ATTACKER}"), "{form}: {task}");
        let (code, answer) = curl(
            Some(&socket),
            "DELETE",
            &on_socket(&format!("/v1/tasks/{id}")),
            None,
        );
        assert_eq!(code, 200, "{form}: ending its own {id}: {answer}");
    }
    assert_eq!(
        task(&agent, "victim").await,
        Some(victim),
        "{form}: the victim still runs"
    );
    println!("{form}: every forged request refused, nothing changed; own tasks accepted");
    drop(agent);
    drop(delegated);
    drop(worker);
}

#[tokio::test]
async fn a_local_user_cannot_steer_the_agent_run_as_the_systemd_unit() {
    const TEST: &str = "a_local_user_cannot_steer_the_agent_run_as_the_systemd_unit";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    let caps = setpriv_caps(&documented_capabilities());
    let unit = [
        "setpriv".to_string(),
        format!("--reuid={SERVICE}"),
        format!("--regid={SERVICE}"),
        "--clear-groups".into(),
        format!("--inh-caps={caps}"),
        format!("--ambient-caps={caps}"),
        format!("--bounding-set={caps}"),
        "--no-new-privs".into(),
        "--".into(),
    ];
    attack("systemd unit", &unit, SERVICE).await;
}

#[tokio::test]
async fn a_local_user_cannot_steer_the_agent_run_as_the_image_runs_it() {
    const TEST: &str = "a_local_user_cannot_steer_the_agent_run_as_the_image_runs_it";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    let caps = setpriv_caps(&documented_capabilities());
    let image = [
        "setpriv".to_string(),
        "--inh-caps=-all".into(),
        "--ambient-caps=-all".into(),
        format!("--bounding-set={caps}"),
        "--no-new-privs".into(),
        "--".into(),
    ];
    attack("image", &image, 0).await;
}
