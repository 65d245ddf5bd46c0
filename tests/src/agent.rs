//! A real `memwatch run` process on a free loopback port (the support
//! crate's [`support::Agent`]), with an HTTP client and memwatch's events.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use memwatch::Event;
use memwatch_test_support::{
    agent::{self as support, OnDrop, Options, UNPRIVILEGED},
    http::free_port,
    wait::POLL,
};

use crate::workspace_bin;

pub struct Agent {
    process: support::Agent,
    pub base_url: String,
    client: reqwest::Client,
    /// The same, connected to the agent's local socket: the test's uid
    /// (root: admin) is the caller, no token needed.
    socket_client: reqwest::Client,
    /// Sent as a bearer token on [`Agent::get`] and [`Agent::post`] when
    /// set (an agent with tokens reads `/v1/status` and `/v1/events` only
    /// with one).
    token: Option<String>,
    /// A state directory made here for this agent (dropped after it).
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
        Self::launch(&[], None, extra).await
    }

    /// Like [`Agent::start`], with more environment variables
    /// (`NOTIFY_SOCKET`, `WATCHDOG_USEC`: as systemd runs it).
    pub async fn start_with_env(env: &[(&str, &str)], extra: &[&str]) -> Agent {
        Self::launch_with(&[], None, env, extra).await
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
        let mut agent = Self::launch(&UNPRIVILEGED, Some(state.path()), extra).await;
        agent._state = Some(state);
        agent
    }

    /// Starts the agent with `--state-dir state_dir` (kept by the caller,
    /// e.g. across a restart) and `extra` flags; waits until it is ready.
    pub async fn start_in(state_dir: &Path, extra: &[&str]) -> Agent {
        Self::launch(&[], Some(state_dir), extra).await
    }

    /// Like [`Agent::start_in`], with `memwatch` run by a wrapper command
    /// (`setpriv … --`, to run it with fewer privileges).
    pub async fn start_wrapped(wrapper: &[&str], state_dir: &Path, extra: &[&str]) -> Agent {
        Self::launch(wrapper, Some(state_dir), extra).await
    }

    /// Starts the agent (node name `test-node`, debug log kept, SIGKILLed
    /// on drop) on a blocking thread, and panics with why (and its log)
    /// when it does not come up.
    async fn launch(wrapper: &[&str], state_dir: Option<&Path>, extra: &[&str]) -> Agent {
        Self::launch_with(wrapper, state_dir, &[], extra).await
    }

    async fn launch_with(
        wrapper: &[&str],
        state_dir: Option<&Path>,
        more_env: &[(&str, &str)],
        extra: &[&str],
    ) -> Agent {
        let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
        let mut env = vec![("RUST_LOG".to_string(), "memwatch=debug,info".to_string())];
        env.extend(more_env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let options = Options {
            wrapper: strings(wrapper),
            state_dir: state_dir.map(Path::to_path_buf),
            node_name: Some("test-node".into()),
            args: strings(extra),
            env,
            log: true,
            on_drop: OnDrop::Kill,
        };
        let memwatch = workspace_bin("memwatch");
        let started =
            tokio::task::spawn_blocking(move || support::Agent::start(&memwatch, &options))
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let process = started.unwrap_or_else(|e| panic!("{e}"));
        // Generous: an agent on a loaded 2-core machine (a Dask cluster
        // and builds beside it) once took over 5 s to answer.
        let builder = || reqwest::Client::builder().timeout(Duration::from_secs(30));
        Agent {
            base_url: process.base_url(),
            client: builder().build().expect("http client"),
            socket_client: builder()
                .unix_socket(process.socket.clone())
                .build()
                .expect("http client on the socket"),
            process,
            token: None,
            _state: None,
        }
    }

    /// The token [`Agent::get`] and [`Agent::post`] send from now on.
    pub fn set_token(&mut self, token: &str) {
        self.token = Some(token.to_string());
    }

    /// The agent's local API socket (in its state directory).
    pub fn socket(&self) -> &Path {
        &self.process.socket
    }

    fn with_token(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .with_token(self.client.get(format!("{}{path}", self.base_url)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (r.status().as_u16(), r.text().await.expect("body"))
    }

    /// POST over TCP with the token set by [`Agent::set_token`], or
    /// without one over the agent's local socket, as the test's uid (root:
    /// admin): over TCP, a caller with no token only reads.
    pub async fn post(
        &self,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let client = match self.token {
            Some(_) => &self.client,
            None => &self.socket_client,
        };
        self.post_with(client, path, body).await
    }

    /// POST over TCP with no token (anonymous, even after
    /// [`Agent::set_token`]).
    pub async fn post_tcp(
        &self,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let req = self.client.post(format!("{}{path}", self.base_url));
        Self::send(req, path, body).await
    }

    async fn post_with(
        &self,
        client: &reqwest::Client,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let req = self.with_token(client.post(format!("{}{path}", self.base_url)));
        Self::send(req, path, body).await
    }

    async fn send(
        mut req: reqwest::RequestBuilder,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
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

    /// Polls the events every `every`, reading on from the last one seen,
    /// until one matches `pred`: that event and the wall-clock time it was
    /// first seen. `None` after `timeout`.
    pub async fn poll_event(
        &self,
        timeout: Duration,
        every: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> Option<(Event, chrono::DateTime<chrono::Utc>)> {
        let deadline = Instant::now() + timeout;
        let mut after = 0;
        loop {
            for event in self.events(after).await {
                after = event.seq;
                if pred(&event) {
                    return Some((event, chrono::Utc::now()));
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Polls the events until one matches; panics naming `what`, with the
    /// events and the agent's log, after `timeout`.
    pub async fn wait_for_event(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Event) -> bool,
    ) -> Event {
        match self.poll_event(timeout, POLL, pred).await {
            Some((event, _)) => event,
            None => panic!(
                "no {what} event within {timeout:?}; events: {:#?}\nthe kernel side's \
                 counters:\n{}\nlog:\n{}",
                self.events(0).await,
                self.probe_metrics().await,
                self.log_text()
            ),
        }
    }

    /// The probe's lines of `/metrics` (lines crossed in the kernel, its
    /// counters, records lost): what a missing kernel-driven event needs.
    async fn probe_metrics(&self) -> String {
        let (_, metrics) = self.get("/metrics").await;
        metrics
            .lines()
            .filter(|l| {
                [
                    "memwatch_growth_lines",
                    "memwatch_probe_",
                    "memwatch_events_dropped",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            })
            .collect::<Vec<_>>()
            .join("\n")
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
        self.process.log_text()
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the agent, without waiting.
    pub fn signal(&self, signal: i32) {
        self.process
            .signal(signal)
            .unwrap_or_else(|e| panic!("kill {signal}: {e}"));
    }

    /// SIGKILLs the agent and reaps it: no drain, no clean shutdown.
    pub fn kill(&mut self) {
        self.process.kill().expect("SIGKILL and reap the agent");
    }

    /// An HTTP client with the agent's timeout, for concurrent requests:
    /// connected to the agent's local socket whatever the URL's host (the
    /// test's uid is the caller: root is admin, no token needed).
    pub fn client(&self) -> reqwest::Client {
        self.socket_client.clone()
    }

    /// Sends SIGTERM and waits for a clean exit; returns the exit code.
    /// Panics, with the log, when the agent ignores SIGTERM.
    pub fn stop(&mut self) -> Option<i32> {
        self.process.stop().unwrap_or_else(|e| panic!("{e}"))
    }
}
