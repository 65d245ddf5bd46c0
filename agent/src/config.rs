//! Configuration: defaults, then the TOML file, then command-line flags.
//! Invalid configuration is rejected before anything touches the kernel,
//! with the offending key named.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use crate::{
    shipper::outbox,
    units::{Size, Span},
    watchdog::spec::{MemorySource, OnResidualOverCap, Settings, WorkerSpec},
};

/// Default API address: loopback only, so nothing is exposed by accident.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9750";

/// Default time a worker may stay above its soft cap with no task growing.
pub const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(60);
/// Default time below the cap before an unhealthy worker is healthy again.
pub const DEFAULT_RECOVER_AFTER: Duration = Duration::from_secs(30);

/// The agent's settings after every source is merged.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Address of the HTTP API (`/health`, `/metrics`, `/v1/...`).
    pub listen: SocketAddr,
    /// `host` on every event; the machine's hostname by default.
    pub node_name: String,
    /// Events kept in the outbox before the oldest is dropped (and counted).
    pub outbox_capacity: usize,
    /// Kernel BTF used to resolve struct offsets.
    pub btf_path: PathBuf,
    /// `tracing` filter used when RUST_LOG is unset.
    pub log_level: String,
    /// How often worker and task memory is read.
    pub sample_interval: Duration,
    /// Bearer token required on mutating routes, when set.
    pub api_token: Option<String>,
    /// Watchdog knobs shared by every worker.
    pub watchdog: Settings,
    /// Configured workers; none means the whole host is one worker.
    pub workers: Vec<WorkerSpec>,
    /// Cgroups that become tasks of a worker as they appear.
    pub rules: Vec<Rule>,
}

/// Every cgroup whose path matches `pattern` is a task of `worker`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub worker: String,
    pub pattern: glob::Pattern,
    pub soft_cap: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            node_name: hostname(),
            outbox_capacity: outbox::DEFAULT_CAPACITY,
            btf_path: PathBuf::from(crate::probe::btf::VMLINUX_BTF),
            log_level: "info".into(),
            // A second: ten times faster than kubelet's eviction loop, cheap
            // (a few file reads per worker and task).
            sample_interval: Duration::from_secs(1),
            api_token: None,
            watchdog: Settings::default(),
            workers: Vec::new(),
            rules: Vec::new(),
        }
    }
}

/// The config file as written. Every key is optional; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub node_name: Option<String>,
    pub outbox_capacity: Option<usize>,
    pub btf_path: Option<PathBuf>,
    pub log_level: Option<String>,
    pub sample_interval: Option<Span>,
    pub api_token: Option<String>,
    pub api_token_file: Option<PathBuf>,
    pub on_residual_over_cap: Option<OnResidualOverCap>,
    pub growth_window: Option<Span>,
    pub growth_min: Option<Size>,
    #[serde(default)]
    pub worker: Vec<WorkerConfig>,
    #[serde(default)]
    pub rule: Vec<RuleConfig>,
}

/// `[[worker]]`: exactly one of `cgroup`, `pid`, `process`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    pub name: String,
    pub cgroup: Option<PathBuf>,
    pub pid: Option<u32>,
    pub process: Option<String>,
    /// Without one, the cgroup's own (`memory.high`, v1
    /// `memory.soft_limit_in_bytes`) is used when set.
    pub soft_cap: Option<Size>,
    pub unhealthy_after: Option<Span>,
    pub recover_after: Option<Span>,
}

/// `[[rule]]`: cgroups matching a glob become tasks of a worker.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub worker: String,
    pub cgroup: String,
    pub soft_cap: Option<Size>,
}

/// Values given on the command line; they win over the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub node_name: Option<String>,
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
    Invalid { key: &'static str, problem: String },
}

impl Config {
    /// Defaults, then `file` (when given), then `overrides`; then validated.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let from_file = match file {
            Some(path) => parse_file(path)?,
            None => FileConfig::default(),
        };
        let mut config = Config::default();
        config.apply(from_file)?;
        if let Some(listen) = overrides.listen {
            config.listen = listen;
        }
        if let Some(name) = &overrides.node_name {
            config.node_name = name.clone();
        }
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, file: FileConfig) -> Result<(), ConfigError> {
        let FileConfig {
            listen,
            node_name,
            outbox_capacity,
            btf_path,
            log_level,
            sample_interval,
            api_token,
            api_token_file,
            on_residual_over_cap,
            growth_window,
            growth_min,
            worker,
            rule,
        } = file;
        set(&mut self.listen, listen);
        set(&mut self.node_name, node_name);
        set(&mut self.outbox_capacity, outbox_capacity);
        set(&mut self.btf_path, btf_path);
        set(&mut self.log_level, log_level);
        set(&mut self.sample_interval, sample_interval.map(|s| s.0));
        set(
            &mut self.watchdog.on_residual_over_cap,
            on_residual_over_cap,
        );
        set(&mut self.watchdog.growth_window, growth_window.map(|s| s.0));
        set(&mut self.watchdog.growth_min_bytes, growth_min.map(|s| s.0));
        self.api_token = match (api_token, api_token_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "api_token",
                    "and `api_token_file` are both set; keep one",
                ));
            }
            (Some(token), None) => Some(token),
            (None, Some(path)) => Some(
                fs::read_to_string(&path)
                    .map_err(|e| {
                        invalid(
                            "api_token_file",
                            format!("cannot be read ({}): {e}", path.display()),
                        )
                    })?
                    .trim()
                    .to_string(),
            ),
            (None, None) => None,
        };
        self.workers = worker
            .into_iter()
            .enumerate()
            .map(|(i, w)| worker_spec(i, w))
            .collect::<Result<_, _>>()?;
        self.rules = rule
            .into_iter()
            .map(|r| {
                Ok(Rule {
                    pattern: glob::Pattern::new(&r.cgroup).map_err(|e| {
                        invalid("rule.cgroup", format!("`{}` is not a glob: {e}", r.cgroup))
                    })?,
                    worker: r.worker,
                    soft_cap: r.soft_cap.map(|s| s.0),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.node_name.trim().is_empty() {
            return Err(invalid("node_name", "must not be empty"));
        }
        if self.outbox_capacity == 0 {
            return Err(invalid("outbox_capacity", "must be at least 1"));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            return Err(invalid("log_level", format!("is not a valid filter: {e}")));
        }
        if self.sample_interval < Duration::from_millis(10) {
            return Err(invalid("sample_interval", "must be at least 10ms"));
        }
        if self.api_token.as_deref().is_some_and(|t| t.is_empty()) {
            return Err(invalid("api_token", "must not be empty"));
        }
        let mut names = std::collections::HashSet::new();
        for w in &self.workers {
            if !names.insert(w.name.as_str()) {
                return Err(invalid(
                    "worker.name",
                    format!("`{}` is declared twice", w.name),
                ));
            }
        }
        for r in &self.rules {
            if !names.contains(r.worker.as_str()) {
                return Err(invalid(
                    "rule.worker",
                    format!("`{}` is not a declared [[worker]]", r.worker),
                ));
            }
        }
        Ok(())
    }
}

fn parse_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        message: e.to_string().trim_end().to_string(),
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
    Ok(WorkerSpec {
        name: w.name.clone(),
        source,
        soft_cap: w.soft_cap.map(|s| s.0),
        unhealthy_after: w.unhealthy_after.map_or(DEFAULT_UNHEALTHY_AFTER, |s| s.0),
        recover_after: w.recover_after.map_or(DEFAULT_RECOVER_AFTER, |s| s.0),
    })
}

fn invalid(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        problem: problem.into(),
    }
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
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn defaults_listen_on_loopback() {
        let c = Config::load(None, &Overrides::default()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:9750".parse().unwrap());
        assert!(!c.node_name.is_empty());
    }

    #[test]
    fn flags_win_over_file() {
        let f =
            file("listen = \"127.0.0.1:1111\"\nnode_name = \"from-file\"\noutbox_capacity = 5\n");
        let flags = Overrides {
            listen: Some("127.0.0.1:2222".parse().unwrap()),
            node_name: None,
        };
        let c = Config::load(Some(f.path()), &flags).unwrap();
        assert_eq!(c.listen.port(), 2222);
        assert_eq!(c.node_name, "from-file");
        assert_eq!(c.outbox_capacity, 5);
    }

    #[test]
    fn unknown_key_is_named() {
        let f = file("listen = \"127.0.0.1:1\"\nlisten_addr = \"x\"\n");
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `listen_addr`"),
            "{err}"
        );
    }

    #[test]
    fn bad_value_is_named() {
        let f = file("outbox_capacity = 0\n");
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: `outbox_capacity` must be at least 1"
        );
        let f = file("listen = \"not an address\"\n");
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("listen"), "{err}");
    }

    #[test]
    fn workers_and_rules_parse_with_units() {
        let f = file(
            r#"
sample_interval = "500ms"
on_residual_over_cap = "flag"
[[worker]]
name = "w1"
cgroup = "/sys/fs/cgroup/memory/w1"
soft_cap = "1GiB"
unhealthy_after = "90s"
recover_after = "2m"
[[worker]]
name = "dask"
process = "dask worker"
[[rule]]
worker = "w1"
cgroup = "/sys/fs/cgroup/memory/w1/job_*"
soft_cap = "512MiB"
"#,
        );
        let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
        assert_eq!(c.sample_interval, Duration::from_millis(500));
        assert_eq!(c.watchdog.on_residual_over_cap, OnResidualOverCap::Flag);
        assert_eq!(c.workers.len(), 2);
        let w1 = &c.workers[0];
        assert_eq!(
            w1.source,
            MemorySource::Cgroup("/sys/fs/cgroup/memory/w1".into())
        );
        assert_eq!(w1.soft_cap, Some(1 << 30));
        assert_eq!(w1.unhealthy_after, Duration::from_secs(90));
        assert_eq!(w1.recover_after, Duration::from_secs(120));
        assert_eq!(
            c.workers[1].source,
            MemorySource::Process("dask worker".into())
        );
        assert_eq!(c.workers[1].unhealthy_after, DEFAULT_UNHEALTHY_AFTER);
        assert!(c.rules[0].pattern.matches("/sys/fs/cgroup/memory/w1/job_7"));
        assert_eq!(c.rules[0].soft_cap, Some(512 << 20));
    }

    #[test]
    fn worker_mistakes_are_named() {
        for (text, expected) in [
            (
                "[[worker]]\nname = \"a\"\n",
                "needs one of `cgroup`, `pid` or `process`",
            ),
            (
                "[[worker]]\nname = \"a\"\npid = 1\nprocess = \"x\"\n",
                "give only one of",
            ),
            (
                "[[worker]]\nname = \"a\"\ncgroup = \"rel\"\n",
                "must be an absolute path",
            ),
            (
                "[[worker]]\nname = \"a\"\npid = 1\n[[worker]]\nname = \"a\"\npid = 2\n",
                "`worker.name` `a` is declared twice",
            ),
            (
                "[[worker]]\nname = \"a\"\npid = 1\nsoft_cap = \"lots\"\n",
                "`lots` is not a size",
            ),
            (
                "[[worker]]\nname = \"a\"\npid = 1\nunhealthy_after = \"soon\"\n",
                "`soon` is not a duration",
            ),
            (
                "[[worker]]\nname = \"a\"\npid = 1\ncolour = 1\n",
                "unknown field `colour`",
            ),
            (
                "[[rule]]\nworker = \"b\"\ncgroup = \"/x/*\"\n",
                "`rule.worker` `b` is not a declared [[worker]]",
            ),
        ] {
            let f = file(text);
            let err = Config::load(Some(f.path()), &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn missing_file_says_which() {
        let err = Config::load(
            Some(Path::new("/nonexistent/memwatch.toml")),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read config file /nonexistent/memwatch.toml")
        );
    }
}
