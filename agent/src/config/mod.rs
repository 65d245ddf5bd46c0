//! Configuration: defaults, then the TOML file, then command-line flags.
//! Invalid configuration is rejected before anything touches the kernel,
//! with the offending key named.
//!
//! Longer than 600 lines: the whole file-and-flags reader in one place
//! (defaults, parse, apply, validate), because every check names the key it
//! refuses and sees the others; the sinks' keys are already elsewhere
//! (sinks/*/config.rs), and `[kubernetes]` in kubernetes.rs.

mod kubernetes;
mod token_file;

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

pub(crate) use self::kubernetes::Kubernetes;
use self::token_file::token_file;
use crate::{
    model::{
        spec::{
            DEFAULT_RECOVER_AFTER, DEFAULT_UNHEALTHY_AFTER, HOST_WORKER, MemorySource,
            OnResidualOverCap, PredictRule, PressureRule, Rule, Settings, WorkerSpec, basis_points,
        },
        units::{Size, Span},
    },
    outbox,
    sinks::{self, SinkConfig, config::InvalidKey},
    telemetry::LogFormat,
};

/// Where the outbox database lives unless told otherwise.
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/memwatch";
/// How often a heartbeat event is appended.
pub(crate) const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// Default API address: loopback only, so nothing is exposed by accident.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:9750";
/// Default local API socket: callers known by their uid, no token needed.
pub const DEFAULT_SOCKET: &str = "/run/memwatch/api.sock";

/// The agent's settings after every source is merged.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Address of the HTTP API (`/health`, `/metrics`, `/v1/...`).
    pub listen: SocketAddr,
    /// `host` on every event; the machine's hostname by default.
    pub node_name: String,
    /// Directory of the durable outbox (`outbox.sqlite`); created when missing.
    pub state_dir: PathBuf,
    /// Events kept in the outbox before the drop policy applies (and counts).
    pub outbox_capacity: usize,
    /// Bytes of event JSON kept in the outbox before the drop policy applies.
    pub outbox_max_bytes: u64,
    /// Age after which events are removed from the outbox.
    pub outbox_max_age: Duration,
    /// Period of `heartbeat` events.
    pub heartbeat_interval: Duration,
    /// Where events are shipped: `[[webhook]]`, `[[nats]]`, `[[dask]]`,
    /// `[[slurm]]` (the sink registry, sinks/mod.rs), in file order per
    /// kind; `--webhook URL` replaces the `[[webhook]]`s.
    pub sinks: Vec<SinkConfig>,
    /// Kernel BTF used to resolve struct offsets.
    pub btf_path: PathBuf,
    /// `tracing` filter used when RUST_LOG is unset.
    pub log_level: String,
    /// Text lines or JSON objects.
    pub log_format: LogFormat,
    /// How often worker and task memory is read.
    pub sample_interval: Duration,
    /// The kernel reports each time a cgroup's usage grows by this much.
    pub growth_step: u64,
    /// Benchmarks only (`--probe-floor`): an empty program on the growth hook.
    pub probe_floor: bool,
    /// Tests only (`--probe-oom-by-pid`): OOM victims found the pre-6.2 way.
    pub probe_oom_by_pid: bool,
    /// Tests only (`--probe-oom-ring-bytes`): a smaller OOM ring.
    pub probe_oom_ring_bytes: Option<u32>,
    /// The event source.
    pub source: SourceChoice,
    /// Turn on the kernel's BPF run-time statistics (program run counts and
    /// times as metrics; ~20 ns per program run).
    pub bpf_stats: bool,
    /// The eBPF programs' own log records (aya-log) in the agent's log, for
    /// field debugging (`--probe-log`): the programs' logging twins are
    /// loaded. Off, the plain ones: no logging code in the kernel.
    pub probe_log: bool,
    /// The `admin` scope's bearer token (every route), when set.
    pub api_token: Option<String>,
    /// The `task` scope's bearer token (register tasks, end its own, read).
    pub task_token: Option<String>,
    /// The `read` scope's bearer token (`/v1/status`, `/v1/events`).
    pub read_token: Option<String>,
    /// The local API socket (`None`: none, TCP only).
    pub socket: Option<PathBuf>,
    /// Watchdog knobs shared by every worker.
    pub watchdog: Settings,
    /// Configured workers; none means the whole host is one worker.
    pub workers: Vec<WorkerSpec>,
    /// Cgroups that become tasks of a worker as they appear.
    pub rules: Vec<Rule>,
    /// `[kubernetes]`: kubelet pods as tasks.
    pub kubernetes: Kubernetes,
}

/// Which event source `run` uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SourceChoice {
    /// eBPF, falling back to polling the cgroup files when it cannot load.
    #[default]
    Auto,
    /// eBPF only: fail when it cannot load.
    Ebpf,
    /// Polling the cgroup files only.
    Poll,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            node_name: hostname(),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            outbox_capacity: outbox::DEFAULT_CAPACITY,
            outbox_max_bytes: outbox::DEFAULT_MAX_BYTES,
            outbox_max_age: outbox::DEFAULT_MAX_AGE,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            sinks: Vec::new(),
            btf_path: PathBuf::from(crate::probe::btf::VMLINUX_BTF),
            log_level: "info".into(),
            log_format: LogFormat::Text,
            // A second: ten times faster than kubelet's eviction loop, cheap
            // (a few file reads per worker and task).
            sample_interval: Duration::from_secs(1),
            growth_step: 64 << 20,
            probe_floor: false,
            probe_oom_by_pid: false,
            probe_oom_ring_bytes: None,
            source: SourceChoice::Auto,
            bpf_stats: false,
            probe_log: false,
            api_token: None,
            task_token: None,
            read_token: None,
            socket: Some(PathBuf::from(DEFAULT_SOCKET)),
            watchdog: Settings::default(),
            workers: Vec::new(),
            rules: Vec::new(),
            kubernetes: Kubernetes::default(),
        }
    }
}

/// The smallest outbox byte budget accepted.
const MIN_OUTBOX_BYTES: u64 = 1 << 20;

/// The config file as written. Every key is optional; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub node_name: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub outbox_capacity: Option<usize>,
    pub outbox_max_bytes: Option<Size>,
    /// A duration: `7d`, `12h`, …
    pub outbox_max_age: Option<String>,
    pub heartbeat_interval: Option<String>,
    pub btf_path: Option<PathBuf>,
    pub log_level: Option<String>,
    pub log_format: Option<LogFormat>,
    pub sample_interval: Option<Span>,
    pub growth_step: Option<Size>,
    pub source: Option<SourceChoice>,
    pub bpf_stats: Option<bool>,
    pub probe_log: Option<bool>,
    pub api_token: Option<String>,
    pub api_token_file: Option<PathBuf>,
    pub task_token_file: Option<PathBuf>,
    pub read_token_file: Option<PathBuf>,
    /// `""` turns the socket off.
    pub socket: Option<PathBuf>,
    pub on_residual_over_cap: Option<OnResidualOverCap>,
    pub growth_window: Option<Span>,
    pub growth_min: Option<Size>,
    #[serde(default)]
    pub worker: Vec<WorkerConfig>,
    #[serde(default)]
    pub rule: Vec<RuleConfig>,
    /// Read by hand before the rest (config/kubernetes.rs): the table
    /// also holds a sink's delivery keys.
    #[serde(skip)]
    pub kubernetes: Option<Kubernetes>,
}

/// `[[worker]]`: exactly one of `cgroup`, `pid`, `process`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerConfig {
    pub name: String,
    pub cgroup: Option<PathBuf>,
    pub pid: Option<u32>,
    pub process: Option<String>,
    /// Without one, the cgroup's own (`memory.high`, v1
    /// `memory.soft_limit_in_bytes`) is used when set.
    pub soft_cap: Option<Size>,
    pub unhealthy_after: Option<Span>,
    pub recover_after: Option<Span>,
    /// A fraction 0–1 of PSI `some avg10` (`memory.pressure`, cgroup v2).
    pub pressure_limit: Option<f64>,
    pub pressure_after: Option<Span>,
    /// The kill predictor: on unless `false`.
    pub predict: Option<bool>,
    /// An ETA at most this far ahead is `oom_imminent`.
    pub predict_horizon: Option<Span>,
}

/// `[[rule]]`: cgroups matching a glob become tasks of a worker.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleConfig {
    pub worker: String,
    pub cgroup: String,
    pub soft_cap: Option<Size>,
}

/// Values given on the command line; they win over the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    /// `--api-token-file`: wins over the file's `api_token` and `api_token_file`.
    pub api_token_file: Option<PathBuf>,
    /// `--task-token-file`: wins over the file's `task_token_file`.
    pub task_token_file: Option<PathBuf>,
    /// `--read-token-file`: wins over the file's `read_token_file`.
    pub read_token_file: Option<PathBuf>,
    /// `--socket`.
    pub socket: Option<PathBuf>,
    pub node_name: Option<String>,
    pub state_dir: Option<PathBuf>,
    /// `--webhook URL`, repeatable: when given, these replace `[[webhook]]`.
    pub webhooks: Vec<String>,
    /// `--probe-floor` (benchmarks only).
    pub probe_floor: bool,
    /// `--probe-oom-by-pid` (tests only).
    pub probe_oom_by_pid: bool,
    /// `--probe-oom-ring-bytes` (tests only).
    pub probe_oom_ring_bytes: Option<u32>,
    /// `--probe-log` (env `MEMWATCH_PROBE_LOG`): on wins over the file.
    pub probe_log: bool,
    /// `--source`.
    pub source: Option<SourceChoice>,
    /// `--log-level` (env `MEMWATCH_LOG`); `RUST_LOG` still wins.
    pub log_level: Option<String>,
    /// `--log-format` (env `MEMWATCH_LOG_FORMAT`).
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: `{key}` {problem}")]
    Invalid { key: String, problem: String },
}

impl Config {
    /// What the kernel's growth program is told at load time.
    pub fn growth_settings(&self) -> agent_common::GrowthSettings {
        agent_common::GrowthSettings {
            step_pages: self.growth_step / procfs::page_size(),
            ..agent_common::GrowthSettings::DEFAULT
        }
    }

    /// Defaults, then `file` (when given), then `overrides`; then validated.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let (from_file, sinks) = match file {
            Some(path) => parse_file(path)?,
            None => (FileConfig::default(), Vec::new()),
        };
        let mut config = Config::default();
        config.apply(from_file)?;
        config.sinks = sinks;
        if let Some(listen) = overrides.listen {
            config.listen = listen;
        }
        if let Some(path) = &overrides.api_token_file {
            config.api_token = api_token_from(None, Some(path.clone()))?;
        }
        if let Some(path) = &overrides.task_token_file {
            config.task_token = Some(token_file("task_token_file", path)?);
        }
        if let Some(path) = &overrides.read_token_file {
            config.read_token = Some(token_file("read_token_file", path)?);
        }
        if let Some(path) = &overrides.socket {
            config.socket = Some(path.clone());
        }
        config.probe_floor = overrides.probe_floor;
        config.probe_oom_by_pid = overrides.probe_oom_by_pid;
        config.probe_oom_ring_bytes = overrides.probe_oom_ring_bytes;
        config.probe_log |= overrides.probe_log;
        if let Some(source) = overrides.source {
            config.source = source;
        }
        if let Some(level) = &overrides.log_level {
            config.log_level = level.clone();
        }
        if let Some(format) = overrides.log_format {
            config.log_format = format;
        }
        if let Some(name) = &overrides.node_name {
            config.node_name = name.clone();
        }
        if let Some(dir) = &overrides.state_dir {
            config.state_dir = dir.clone();
        }
        sinks::apply_flags(&mut config.sinks, &overrides.webhooks)?;
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, file: FileConfig) -> Result<(), ConfigError> {
        let FileConfig {
            listen,
            node_name,
            state_dir,
            outbox_capacity,
            outbox_max_bytes,
            outbox_max_age,
            heartbeat_interval,
            btf_path,
            log_level,
            log_format,
            sample_interval,
            growth_step,
            source,
            bpf_stats,
            probe_log,
            api_token,
            api_token_file,
            task_token_file,
            read_token_file,
            socket,
            on_residual_over_cap,
            growth_window,
            growth_min,
            worker,
            rule,
            kubernetes,
        } = file;
        self.kubernetes = kubernetes.unwrap_or_default();
        if let Some(v) = state_dir {
            self.state_dir = v;
        }
        if let Some(v) = outbox_max_age {
            self.outbox_max_age = duration("outbox_max_age", &v)?;
        }
        if let Some(v) = heartbeat_interval {
            self.heartbeat_interval = duration("heartbeat_interval", &v)?;
        }
        set(&mut self.listen, listen);
        set(&mut self.node_name, node_name);
        set(&mut self.outbox_capacity, outbox_capacity);
        if let Some(Size(bytes)) = outbox_max_bytes {
            self.outbox_max_bytes = bytes;
        }
        set(&mut self.btf_path, btf_path);
        set(&mut self.log_level, log_level);
        set(&mut self.log_format, log_format);
        set(&mut self.sample_interval, sample_interval.map(|s| s.0));
        set(&mut self.growth_step, growth_step.map(|s| s.0));
        set(&mut self.source, source);
        set(&mut self.bpf_stats, bpf_stats);
        set(&mut self.probe_log, probe_log);
        set(
            &mut self.watchdog.on_residual_over_cap,
            on_residual_over_cap,
        );
        set(&mut self.watchdog.growth_window, growth_window.map(|s| s.0));
        set(&mut self.watchdog.growth_min_bytes, growth_min.map(|s| s.0));
        self.api_token = api_token_from(api_token, api_token_file)?;
        if let Some(path) = task_token_file {
            self.task_token = Some(token_file("task_token_file", &path)?);
        }
        if let Some(path) = read_token_file {
            self.read_token = Some(token_file("read_token_file", &path)?);
        }
        if let Some(path) = socket {
            self.socket = (!path.as_os_str().is_empty()).then_some(path);
        }
        self.watchdog.predict.workers = worker
            .iter()
            .enumerate()
            .map(|(i, w)| Ok((w.name.clone(), predict_rule(i, w)?)))
            .collect::<Result<_, ConfigError>>()?;
        self.workers = worker
            .into_iter()
            .enumerate()
            .map(|(i, w)| worker_spec(i, w))
            .collect::<Result<_, _>>()?;
        self.rules = rule.into_iter().map(rule_of).collect::<Result<_, _>>()?;
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.node_name.trim().is_empty() {
            return Err(invalid("node_name", "must not be empty"));
        }
        if self.outbox_capacity == 0 {
            return Err(invalid("outbox_capacity", "must be at least 1"));
        }
        if self.outbox_max_bytes < MIN_OUTBOX_BYTES {
            return Err(invalid(
                "outbox_max_bytes",
                format!("must be at least 1MiB, got {} bytes", self.outbox_max_bytes),
            ));
        }
        if self.state_dir.as_os_str().is_empty() {
            return Err(invalid("state_dir", "must not be empty"));
        }
        if self.outbox_max_age.is_zero() {
            return Err(invalid("outbox_max_age", "must be more than 0"));
        }
        if self.heartbeat_interval < Duration::from_secs(1) {
            return Err(invalid("heartbeat_interval", "must be at least 1s"));
        }
        let mut names = std::collections::BTreeSet::new();
        for name in self.sinks.iter().map(SinkConfig::name) {
            if name.is_empty() || !names.insert(name) {
                return Err(invalid(
                    "name",
                    format!("of a sink must be unique and not empty: {name:?}"),
                ));
            }
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            return Err(invalid("log_level", format!("is not a valid filter: {e}")));
        }
        if self.growth_step != 0 && self.growth_step < (1 << 20) {
            return Err(invalid("growth_step", "must be 0 (off) or at least 1MiB"));
        }
        if self.sample_interval < Duration::from_millis(10) {
            return Err(invalid("sample_interval", "must be at least 10ms"));
        }
        self.validate_tokens()?;
        if let Some(socket) = &self.socket
            && !socket.is_absolute()
        {
            return Err(invalid(
                "socket",
                format!("must be an absolute path, got {}", socket.display()),
            ));
        }
        self.validate_workers()
    }

    /// No token is empty, each scope has its own, and an API beyond
    /// loopback has one at least.
    fn validate_tokens(&self) -> Result<(), ConfigError> {
        let tokens = [
            ("api_token", &self.api_token),
            ("task_token_file", &self.task_token),
            ("read_token_file", &self.read_token),
        ];
        for (i, (key, token)) in tokens.iter().enumerate() {
            let Some(token) = token else { continue };
            if token.is_empty() {
                return Err(invalid(*key, "must not be empty"));
            }
            if let Some((other, _)) = tokens[..i]
                .iter()
                .find(|(_, t)| t.as_deref() == Some(token.as_str()))
            {
                return Err(invalid(
                    *key,
                    format!("holds the same token as `{other}`: give each scope its own"),
                ));
            }
        }
        if !self.listen.ip().is_loopback() && tokens.iter().all(|(_, t)| t.is_none()) {
            return Err(invalid(
                "listen",
                format!(
                    "is {}, beyond loopback, and no token is set: anyone who reaches it could \
                     steer failover. Set `api_token_file` (or `--api-token-file`; a \
                     `task_token_file` or `read_token_file` will do too), or listen on 127.0.0.1",
                    self.listen
                ),
            ));
        }
        Ok(())
    }

    /// Worker names are unique; rules, `[kubernetes]` and the sinks (Slurm's `nodes`)
    /// name declared workers.
    fn validate_workers(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        for w in &self.workers {
            if !names.insert(w.name.as_str()) {
                return Err(invalid(
                    "worker.name",
                    format!("`{}` is declared twice", w.name),
                ));
            }
        }
        self.kubernetes.pod_worker(&self.workers)?;
        for r in &self.rules {
            if !names.contains(r.worker.as_str()) {
                return Err(invalid(
                    "rule.worker",
                    format!("`{}` is not a declared [[worker]]", r.worker),
                ));
            }
        }
        // With no [[worker]], the host is the one worker, named `host`.
        let declared = |w: &str| names.contains(w) || names.is_empty() && w == HOST_WORKER;
        sinks::check_workers(&self.sinks, &declared)?;
        Ok(())
    }
}

/// Reads the file: the sink tables through the sink registry, the rest as
/// [`FileConfig`] (unknown keys are errors that name them).
fn parse_file(path: &Path) -> Result<(FileConfig, Vec<SinkConfig>), ConfigError> {
    let text = fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let parse_error = |message: String| ConfigError::Parse {
        path: path.display().to_string(),
        message: message.trim_end().replace('\n', "; "),
    };
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        message: e.to_string().trim_end().to_string(),
    })?;
    refuse_left_out(&table, sinks::LEFT_OUT)?;
    let mut sinks = Vec::new();
    for kind in sinks::TABLES {
        let Some(value) = table.remove(*kind) else {
            continue;
        };
        let toml::Value::Array(items) = value else {
            return Err(invalid(*kind, format!("must be written [[{kind}]]")));
        };
        for (index, item) in items.into_iter().enumerate() {
            let toml::Value::Table(item) = item else {
                return Err(invalid(format!("{kind}[{index}]"), "must be a table"));
            };
            if let Some(sink) = SinkConfig::from_table(kind, index, item) {
                sinks.push(sink?);
            }
        }
    }
    let kubernetes = match table.remove("kubernetes") {
        Some(toml::Value::Table(k)) => {
            let (settings, sink) = kubernetes::read(k)?;
            sinks.extend(sink);
            Some(settings)
        }
        Some(_) => return Err(invalid("kubernetes", "must be a table: [kubernetes]")),
        None => None,
    };
    let mut file = FileConfig::deserialize(toml::Value::Table(table))
        .map_err(|e| parse_error(e.to_string()))?;
    file.kubernetes = kubernetes;
    Ok((file, sinks))
}

/// A sink table whose sink this build leaves out (`left_out`: table,
/// Cargo feature) is an error that says so.
fn refuse_left_out(table: &toml::Table, left_out: &[(&str, &str)]) -> Result<(), ConfigError> {
    match left_out.iter().find(|(t, _)| table.contains_key(*t)) {
        Some((t, feature)) => Err(invalid(
            *t,
            format!(
                "this memwatch was built without its `{feature}` sink (Cargo feature `{feature}`, \
                 on by default): rebuild with `--features {feature}`, or remove the table"
            ),
        )),
        None => Ok(()),
    }
}

impl From<InvalidKey> for ConfigError {
    fn from(e: InvalidKey) -> Self {
        ConfigError::Invalid {
            key: e.key,
            problem: e.problem,
        }
    }
}

/// `api_token` or the first line of `api_token_file`; not both.
fn api_token_from(
    token: Option<String>,
    file: Option<PathBuf>,
) -> Result<Option<String>, ConfigError> {
    match (token, file) {
        (Some(_), Some(_)) => Err(invalid(
            "api_token",
            "and `api_token_file` are both set; keep one",
        )),
        (Some(token), None) => Ok(Some(token)),
        (None, Some(path)) => token_file("api_token_file", &path).map(Some),
        (None, None) => Ok(None),
    }
}

fn rule_of(r: RuleConfig) -> Result<Rule, ConfigError> {
    Ok(Rule {
        pattern: glob::Pattern::new(&r.cgroup)
            .map_err(|e| invalid("rule.cgroup", format!("`{}` is not a glob: {e}", r.cgroup)))?,
        worker: r.worker,
        soft_cap: r.soft_cap.map(|s| s.0),
    })
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

fn worker_spec(index: usize, w: WorkerConfig) -> Result<WorkerSpec, ConfigError> {
    let at = |problem: String| {
        invalid(
            "worker",
            format!("#{} (`{}`): {problem}", index + 1, w.name),
        )
    };
    if w.name.trim().is_empty() {
        return Err(at("`name` must not be empty".into()));
    }
    let source = match (&w.cgroup, w.pid, &w.process) {
        (Some(path), None, None) if path.is_absolute() => MemorySource::Cgroup(path.clone()),
        (Some(path), None, None) => {
            return Err(at(format!(
                "`cgroup` must be an absolute path, got {}",
                path.display()
            )));
        }
        (None, Some(pid), None) => MemorySource::Pid(pid),
        (None, None, Some(text)) if !text.trim().is_empty() => MemorySource::Process(text.clone()),
        (None, None, None) => return Err(at("needs one of `cgroup`, `pid` or `process`".into())),
        _ => return Err(at("give only one of `cgroup`, `pid` or `process`".into())),
    };
    let unhealthy_after = w.unhealthy_after.map_or(DEFAULT_UNHEALTHY_AFTER, |s| s.0);
    let pressure = match (w.pressure_limit, w.pressure_after) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(invalid(
                "worker.pressure_after",
                format!(
                    "#{} (`{}`): needs `pressure_limit` (the rule is off without it)",
                    index + 1,
                    w.name
                ),
            ));
        }
        (Some(limit), after) => {
            if !(limit > 0.0 && limit < 1.0) {
                return Err(invalid(
                    "worker.pressure_limit",
                    format!(
                        "#{} (`{}`): must be a fraction between 0 and 1 (0.2: some task \
                         stalled on memory for a fifth of the last 10 s), got {limit}",
                        index + 1,
                        w.name
                    ),
                ));
            }
            Some(PressureRule {
                limit_bp: basis_points(limit),
                after: after.map_or(unhealthy_after, |s| s.0),
            })
        }
    };
    Ok(WorkerSpec {
        name: w.name.clone(),
        source,
        soft_cap: w.soft_cap.map(|s| s.0),
        unhealthy_after,
        recover_after: w.recover_after.map_or(DEFAULT_RECOVER_AFTER, |s| s.0),
        pressure,
    })
}

/// The worker's `predict` and `predict_horizon` (defaults: on, a minute).
fn predict_rule(index: usize, w: &WorkerConfig) -> Result<PredictRule, ConfigError> {
    let default = PredictRule::default();
    let horizon = w.predict_horizon.map_or(default.horizon, |s| s.0);
    if horizon < Duration::from_secs(1) || horizon > Duration::from_secs(3600) {
        return Err(invalid(
            "worker.predict_horizon",
            format!(
                "#{} (`{}`): must be between 1s and 1h (how far ahead a kill is \
                 called imminent), got {}",
                index + 1,
                w.name,
                humantime::format_duration(horizon)
            ),
        ));
    }
    Ok(PredictRule {
        enabled: w.predict.unwrap_or(default.enabled),
        horizon,
    })
}

fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

/// A human duration (`90s`, `2m`, `7d`) for `key`.
fn duration(key: impl Into<String>, text: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(text).map_err(|e| {
        invalid(
            key,
            format!("is not a duration like \"30s\" ({e}): {text:?}"),
        )
    })
}

/// The kernel's hostname, or `localhost` if it cannot be read.
fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests;
