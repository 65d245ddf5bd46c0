//! Configuration: defaults, then the TOML file, then command-line flags.
//! Invalid configuration is rejected before anything touches the kernel,
//! with the offending key named.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::shipper::outbox;

/// Default API address: loopback only, so nothing is exposed by accident.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9750";

/// The agent's settings after every source is merged.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            node_name: hostname(),
            outbox_capacity: outbox::DEFAULT_CAPACITY,
            btf_path: PathBuf::from(crate::probe::btf::VMLINUX_BTF),
            log_level: "info".into(),
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
        config.apply(from_file);
        if let Some(listen) = overrides.listen {
            config.listen = listen;
        }
        if let Some(name) = &overrides.node_name {
            config.node_name = name.clone();
        }
        config.validate()?;
        Ok(config)
    }

    fn apply(&mut self, file: FileConfig) {
        let FileConfig {
            listen,
            node_name,
            outbox_capacity,
            btf_path,
            log_level,
        } = file;
        if let Some(v) = listen {
            self.listen = v;
        }
        if let Some(v) = node_name {
            self.node_name = v;
        }
        if let Some(v) = outbox_capacity {
            self.outbox_capacity = v;
        }
        if let Some(v) = btf_path {
            self.btf_path = v;
        }
        if let Some(v) = log_level {
            self.log_level = v;
        }
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
