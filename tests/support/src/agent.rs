//! A real `memwatch run` process on a free loopback port: started, awaited
//! until `GET /ready` answers 200, then stopped (SIGTERM) or killed.
//! Blocking; async tests start it on a blocking thread.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{
    http::{free_port, http_get, status_code},
    process::wait_timeout,
};

/// How long the agent may take to attach its probe and answer `/ready`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it may take to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// `setpriv` arguments that run a command as `nobody` with no capability.
pub const UNPRIVILEGED: [&str; 6] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all",
    "--",
];

/// What dropping a running [`Agent`] does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDrop {
    /// SIGKILL: no drain, no clean shutdown (a failed test's agent).
    #[default]
    Kill,
    /// [`Agent::stop`]: SIGTERM and a bounded wait, as between benchmark rounds.
    Stop,
}

/// How to run the agent. `Options::default()`: `memwatch run` directly, a
/// state directory of its own, stderr discarded, SIGKILLed on drop.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// A command that runs `memwatch` (`setpriv … --`, to run it with fewer
    /// privileges); empty: `memwatch` itself.
    pub wrapper: Vec<String>,
    /// `--state-dir`; `None`: a fresh directory of its own, removed on drop.
    pub state_dir: Option<PathBuf>,
    /// `--node-name`.
    pub node_name: Option<String>,
    /// More arguments for `memwatch run`.
    pub args: Vec<String>,
    /// More environment (`RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Keep the agent's stderr in a log file ([`Agent::log_text`]);
    /// otherwise it goes to /dev/null.
    pub log: bool,
    pub on_drop: OnDrop,
}

pub struct Agent {
    child: Option<Child>,
    pub port: u16,
    /// The API's local socket: `<state dir>/api.sock` unless the
    /// arguments name one (never the host's /run/memwatch/api.sock, which
    /// agents of parallel tests would share).
    pub socket: PathBuf,
    log: Option<PathBuf>,
    /// The state directory made for this agent, when the caller gave none.
    own_state: Option<PathBuf>,
    on_drop: OnDrop,
}

impl Agent {
    /// Starts `memwatch run --listen 127.0.0.1:<free port> [--node-name …]
    /// --state-dir … <args>` and waits until `/ready` answers 200. An error
    /// (naming why, with the log when kept) when it cannot start, exits
    /// early, or is not ready within [`READY_TIMEOUT`].
    pub fn start(memwatch: &Path, options: &Options) -> io::Result<Agent> {
        let port = free_port();
        let tag = format!("{}-{port}", std::process::id());
        let mut agent = Agent {
            child: None,
            port,
            socket: PathBuf::new(),
            log: None,
            own_state: None,
            on_drop: options.on_drop,
        };
        let state_dir = match &options.state_dir {
            Some(dir) => dir.clone(),
            None => {
                let dir = std::env::temp_dir().join(format!("memwatch-agent-{tag}"));
                let _ = fs::remove_dir_all(&dir);
                fs::create_dir_all(&dir)?;
                agent.own_state = Some(dir.clone());
                dir
            }
        };
        agent.socket = match options.args.iter().position(|a| a == "--socket") {
            Some(i) => options
                .args
                .get(i + 1)
                .map(PathBuf::from)
                .unwrap_or_default(),
            None => state_dir.join("api.sock"),
        };
        let stderr = if options.log {
            let path = std::env::temp_dir().join(format!("memwatch-agent-{tag}.log"));
            let file = fs::File::create(&path)?;
            agent.log = Some(path);
            Stdio::from(file)
        } else {
            Stdio::null()
        };
        let mut command = match options.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(memwatch);
                c
            }
            None => Command::new(memwatch),
        };
        command
            .args(["run", "--listen", &format!("127.0.0.1:{port}")])
            .args(
                options
                    .node_name
                    .iter()
                    .flat_map(|name| ["--node-name", name.as_str()]),
            )
            .arg("--state-dir")
            .arg(&state_dir)
            .args(&options.args);
        if !options.args.iter().any(|a| a == "--socket") {
            // Through its variable, not `--socket`: the same for this build
            // (a flag and its variable rank alike above the config file),
            // and an older build that has no socket ignores it, so
            // `cargo xtask bench --baseline` can start one that old.
            command.env("MEMWATCH_SOCKET", &agent.socket);
        }
        command
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = command.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start {}: {e}", memwatch.display()),
            )
        })?;
        agent.child = Some(child);
        agent.wait_ready()?;
        Ok(agent)
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(io::Error::other(format!(
                    "memwatch run exited early ({status}){}",
                    self.log_note()
                )));
            }
            if http_get(self.port, "/ready").is_ok_and(|answer| status_code(&answer) == Some(200)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "memwatch run not ready after {READY_TIMEOUT:?}{}",
                    self.log_note()
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The agent's stderr so far ("" when it is not kept).
    pub fn log_text(&self) -> String {
        self.log
            .as_ref()
            .and_then(|path| fs::read_to_string(path).ok())
            .unwrap_or_default()
    }

    /// `; log:` and the log, for an error message (nothing when not kept).
    fn log_note(&self) -> String {
        match self.log {
            Some(_) => format!("; log:\n{}", self.log_text()),
            None => String::new(),
        }
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the agent, without waiting.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("the agent is not running"))?;
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        if unsafe { libc::kill(pid as i32, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGKILLs the agent and reaps it: no drain, no clean shutdown.
    pub fn kill(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit: its code (`None`: killed by a
    /// signal, or not running any more). An error when the agent ignored
    /// SIGTERM for [`STOP_TIMEOUT`] (it is SIGKILLed then).
    pub fn stop(&mut self) -> io::Result<Option<i32>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        match wait_timeout(&mut child, STOP_TIMEOUT)? {
            Some(status) => Ok(status.code()),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(io::Error::other(format!(
                    "agent ignored SIGTERM for {STOP_TIMEOUT:?}{}",
                    self.log_note()
                )))
            }
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        match self.on_drop {
            OnDrop::Kill => {
                let _ = self.kill();
            }
            OnDrop::Stop => {
                if let Err(e) = self.stop() {
                    eprintln!("{e}");
                }
            }
        }
        if let Some(log) = &self.log {
            let _ = fs::remove_file(log);
        }
        if let Some(state) = &self.own_state {
            let _ = fs::remove_dir_all(state);
        }
    }
}
