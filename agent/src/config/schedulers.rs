//! `[[dask]]` and `[[slurm]]`: sinks that act on a scheduler (retire a
//! worker, drain a node, requeue a job) instead of only forwarding events.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::Deserialize;

use super::{
    ConfigError, invalid,
    sinks::{Delivery, DeliveryFile, default_name, parse_url},
};

/// Workers that must stay in a Dask cluster after a retirement.
pub const DEFAULT_DASK_MIN_WORKERS: usize = 1;
/// Fraction of the Dask cluster that must stay after a retirement.
pub const DEFAULT_DASK_MIN_FRACTION: f64 = 0.5;
/// How often the Dask worker ↔ memwatch worker map is refreshed.
pub const DEFAULT_DASK_REFRESH: Duration = Duration::from_secs(2);
/// `retire_workers` moves a worker's data before answering: give it time.
pub const DEFAULT_DASK_TIMEOUT: Duration = Duration::from_secs(60);
/// Requeues of one job memwatch makes at most.
pub const DEFAULT_SLURM_MAX_REQUEUES: u32 = 3;
/// Time allowed to one `scontrol` run.
pub const DEFAULT_SLURM_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq)]
pub struct DaskConfig {
    pub name: String,
    /// The scheduler's HTTP address (its dashboard port), e.g. `http://127.0.0.1:8787`.
    pub url: reqwest::Url,
    /// A retirement never leaves fewer workers than this in the cluster.
    pub min_workers: usize,
    /// … nor less than this fraction of the workers the scheduler lists.
    pub min_fraction: f64,
    /// Period of the worker map refresh (it names Dask addresses in `oom_kill` events).
    pub refresh_interval: Duration,
    pub delivery: Delivery,
}

/// What to do with a Slurm job whose process was OOM-killed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequeuePolicy {
    /// Leave it to Slurm (the job fails or continues as its script decides).
    Never,
    /// `scontrol requeue`, start it at once, and keep it off the node that killed it.
    #[default]
    OtherNode,
    /// `scontrol requeue`, start it at once, on any node.
    AnyNode,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmConfig {
    pub name: String,
    /// The `scontrol` program (on PATH by default).
    pub scontrol: PathBuf,
    /// memwatch worker name → Slurm node name; a worker not listed is the
    /// node named like the agent's `node_name`.
    pub nodes: BTreeMap<String, String>,
    /// Drain the node of an unhealthy worker, resume it on recovery.
    pub drain: bool,
    pub requeue: RequeuePolicy,
    pub max_requeues: u32,
    /// `timeout` is the time allowed to one `scontrol` run.
    pub delivery: Delivery,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaskFile {
    pub url: String,
    pub name: Option<String>,
    pub min_workers: Option<usize>,
    pub min_fraction: Option<f64>,
    pub refresh_interval: Option<String>,
    pub batch_size: Option<usize>,
    pub connect_timeout: Option<String>,
    pub timeout: Option<String>,
    pub retry_initial: Option<String>,
    pub retry_max: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmFile {
    pub name: Option<String>,
    pub scontrol: Option<PathBuf>,
    #[serde(default)]
    pub nodes: BTreeMap<String, String>,
    pub drain: Option<bool>,
    pub requeue: Option<RequeuePolicy>,
    pub max_requeues: Option<u32>,
    pub batch_size: Option<usize>,
    pub timeout: Option<String>,
    pub retry_initial: Option<String>,
    pub retry_max: Option<String>,
}

impl DaskFile {
    pub fn resolve(self, index: usize) -> Result<DaskConfig, ConfigError> {
        let key = |k: &str| format!("dask[{index}].{k}");
        let delivery =
            DeliveryFile {
                batch_size: self.batch_size,
                connect_timeout: self.connect_timeout,
                timeout: Some(self.timeout.unwrap_or_else(|| {
                    humantime::format_duration(DEFAULT_DASK_TIMEOUT).to_string()
                })),
                retry_initial: self.retry_initial,
                retry_max: self.retry_max,
            }
            .resolve(&key(""))?;
        let min_fraction = self.min_fraction.unwrap_or(DEFAULT_DASK_MIN_FRACTION);
        if !(0.0..=1.0).contains(&min_fraction) {
            return Err(invalid(
                key("min_fraction"),
                format!("must be between 0 and 1, got {min_fraction}"),
            ));
        }
        let refresh_interval = match self.refresh_interval {
            Some(text) => super::duration(key("refresh_interval"), &text)?,
            None => DEFAULT_DASK_REFRESH,
        };
        if refresh_interval < Duration::from_millis(100) {
            return Err(invalid(key("refresh_interval"), "must be at least 100ms"));
        }
        Ok(DaskConfig {
            name: self.name.unwrap_or_else(|| default_name("dask", index)),
            url: parse_url(&key("url"), &self.url)?,
            min_workers: self.min_workers.unwrap_or(DEFAULT_DASK_MIN_WORKERS),
            min_fraction,
            refresh_interval,
            delivery,
        })
    }
}

impl SlurmFile {
    pub fn resolve(self, index: usize) -> Result<SlurmConfig, ConfigError> {
        let key = |k: &str| format!("slurm[{index}].{k}");
        let delivery =
            DeliveryFile {
                batch_size: self.batch_size,
                connect_timeout: None,
                timeout: Some(self.timeout.unwrap_or_else(|| {
                    humantime::format_duration(DEFAULT_SLURM_TIMEOUT).to_string()
                })),
                retry_initial: self.retry_initial,
                retry_max: self.retry_max,
            }
            .resolve(&key(""))?;
        let scontrol = self.scontrol.unwrap_or_else(|| PathBuf::from("scontrol"));
        if scontrol.as_os_str().is_empty() {
            return Err(invalid(key("scontrol"), "must not be empty"));
        }
        for (worker, node) in &self.nodes {
            // The node name goes into `NodeName=<node>`: no room for a second argument.
            if node.is_empty() || node.contains(|c: char| c.is_whitespace() || c == '=') {
                return Err(invalid(
                    key(&format!("nodes.{worker}")),
                    format!("is not a Slurm node name: {node:?}"),
                ));
            }
        }
        Ok(SlurmConfig {
            name: self.name.unwrap_or_else(|| default_name("slurm", index)),
            scontrol,
            nodes: self.nodes,
            drain: self.drain.unwrap_or(true),
            requeue: self.requeue.unwrap_or_default(),
            max_requeues: self.max_requeues.unwrap_or(DEFAULT_SLURM_MAX_REQUEUES),
            delivery,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dask(text: &str) -> Result<DaskConfig, ConfigError> {
        toml::from_str::<DaskFile>(text).unwrap().resolve(0)
    }

    fn slurm(text: &str) -> Result<SlurmConfig, ConfigError> {
        toml::from_str::<SlurmFile>(text).unwrap().resolve(0)
    }

    #[test]
    fn dask_defaults_and_bad_values_name_the_key() {
        let d = dask("url = \"http://127.0.0.1:8787\"").unwrap();
        assert_eq!(d.name, "dask-1");
        assert_eq!(d.min_workers, 1);
        assert_eq!(d.min_fraction, 0.5);
        assert_eq!(d.delivery.timeout, DEFAULT_DASK_TIMEOUT);
        let e = dask("url = \"http://x\"\nmin_fraction = 1.5").unwrap_err();
        assert!(e.to_string().contains("dask[0].min_fraction"), "{e}");
        let e = dask("url = \"tcp://x:8786\"").unwrap_err();
        assert!(e.to_string().contains("dask[0].url"), "{e}");
        let e = dask("url = \"http://x\"\nrefresh_interval = \"1ms\"").unwrap_err();
        assert!(e.to_string().contains("dask[0].refresh_interval"), "{e}");
    }

    #[test]
    fn slurm_defaults_and_bad_values_name_the_key() {
        let s = slurm("nodes = { w1 = \"n1\" }").unwrap();
        assert_eq!(s.name, "slurm-1");
        assert!(s.drain);
        assert_eq!(s.requeue, RequeuePolicy::OtherNode);
        assert_eq!(s.delivery.timeout, DEFAULT_SLURM_TIMEOUT);
        let e = slurm("nodes = { w1 = \"n1 State=DOWN\" }").unwrap_err();
        assert!(e.to_string().contains("slurm[0].nodes.w1"), "{e}");
        let e = slurm("timeout = \"soon\"").unwrap_err();
        assert!(e.to_string().contains("slurm[0].timeout"), "{e}");
        assert!(toml::from_str::<SlurmFile>("requeue = \"sometimes\"").is_err());
    }
}
