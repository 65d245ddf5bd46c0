//! A real `memwatch run` process on a free loopback port.

use std::{
    fs,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use memwatch::model::event::Event;

use crate::workspace_bin;

/// How long the agent may take to attach its probe.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Agent {
    child: Option<Child>,
    pub base_url: String,
    log: PathBuf,
    client: reqwest::Client,
    /// The state directory made for this agent, when the test gave none.
    _state: Option<tempfile::TempDir>,
}

impl Agent {
    /// Starts the agent with this config file text (and the test's own
    /// `--listen` and `--node-name`), and waits until `/ready` says 200.
    pub async fn start_with_config(config: &str) -> Agent {
        let path = std::env::temp_dir().join(format!(
            "memwatch-test-{}-{}.toml",
            std::process::id(),
            free_port()
        ));
        fs::write(&path, config).expect("write the test config");
        let agent = Agent::start(&["--config", path.to_str().expect("UTF-8 temp path")]).await;
        let _ = fs::remove_file(&path);
        agent
    }

    /// Starts the agent with `extra` flags and a fresh state directory of
    /// its own, and waits until `/ready` says 200.
    pub async fn start(extra: &[&str]) -> Agent {
        let state = tempfile::tempdir().expect("state dir");
        let mut agent = Self::start_in(state.path(), extra).await;
        agent._state = Some(state);
        agent
    }

    /// Starts the agent as user `nobody` with no capability at all (through
    /// `setpriv`), with a state directory it may write.
    pub async fn start_unprivileged(extra: &[&str]) -> Agent {
        let state = tempfile::tempdir().expect("state dir");
        fs::set_permissions(
            state.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .expect("chmod state dir");
        let mut agent = Self::start_wrapped(&UNPRIVILEGED, state.path(), extra).await;
        agent._state = Some(state);
        agent
    }

    /// Starts the agent with `--state-dir state_dir` (kept by the caller,
    /// e.g. across a restart) and `extra` flags; waits until it is ready.
    pub async fn start_in(state_dir: &Path, extra: &[&str]) -> Agent {
        Self::start_wrapped(&[], state_dir, extra).await
    }

    /// Like [`Agent::start_in`], with `memwatch` run by a wrapper command
    /// (`setpriv … --`, to run it with fewer privileges).
    pub async fn start_wrapped(wrapper: &[&str], state_dir: &Path, extra: &[&str]) -> Agent {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("memwatch-test-{}-{port}.log", std::process::id()));
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(workspace_bin("memwatch"));
                c
            }
            None => Command::new(workspace_bin("memwatch")),
        };
        let child = command
            .args([
                "run",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--node-name",
                "test-node",
                "--state-dir",
            ])
            .arg(state_dir)
            .args(extra)
            .env("RUST_LOG", "memwatch=debug,info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("agent log file"))
            .spawn()
            .expect("spawn memwatch run");
        let mut agent = Agent {
            child: Some(child),
            base_url: format!("http://127.0.0.1:{port}"),
            log,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("http client"),
            _state: None,
        };
        agent.wait_ready().await;
        agent
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "memwatch run exited early ({status}); log:\n{}",
                    self.log_text()
                );
            }
            if let Ok(r) = self
                .client
                .get(format!("{}/ready", self.base_url))
                .send()
                .await
                && r.status().as_u16() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "agent not ready after {READY_TIMEOUT:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .client
            .get(format!("{}{path}", self.base_url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (r.status().as_u16(), r.text().await.expect("body"))
    }

    pub async fn post(
        &self,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self.client.post(format!("{}{path}", self.base_url));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Polls the events until one matches; panics with the agent's log
    /// after `timeout`.
    pub async fn wait_for_event(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> Event {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(event) = self.events(0).await.into_iter().find(|e| pred(e)) {
                return event;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} event within {timeout:?}; events: {:#?}\nlog:\n{}",
                self.events(0).await,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn events(&self, after: u64) -> Vec<Event> {
        let (code, body) = self
            .get(&format!("/v1/events?after={after}&limit=1000"))
            .await;
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("events JSON: {e}: {body}"))
    }

    /// Every event the agent holds, oldest first (paged by seq).
    pub async fn all_events(&self) -> Vec<Event> {
        let mut events: Vec<Event> = Vec::new();
        loop {
            let after = events.last().map_or(0, |e| e.seq);
            let page = self.events(after).await;
            if page.is_empty() {
                return events;
            }
            events.extend(page);
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the agent, without waiting.
    pub fn signal(&self, signal: i32) {
        let pid = self.pid().expect("the agent runs");
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(pid as i32, signal) },
            0,
            "kill {signal}"
        );
    }

    /// SIGKILLs the agent and reaps it: no drain, no clean shutdown.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL the agent");
            child.wait().expect("reap the agent");
        }
    }

    /// An HTTP client with the agent's timeout, for concurrent requests.
    pub fn client(&self) -> reqwest::Client {
        self.client.clone()
    }

    /// Sends SIGTERM and waits for a clean exit; returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("wait agent") {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "agent ignored SIGTERM for {STOP_TIMEOUT:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_file(&self.log);
    }
}

/// `setpriv` arguments that run a command as `nobody` with no capability.
pub const UNPRIVILEGED: [&str; 6] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all",
    "--",
];

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}
