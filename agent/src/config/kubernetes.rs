//! `[kubernetes]`: pods of the node as tasks of a worker, and (with
//! `api = true`) the Kubernetes sink: a node condition, a taint under the
//! cluster guard, Events, pods by name (sinks/kubernetes).

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::{
    model::spec::{HOST_WORKER, WorkerSpec},
    sinks::SinkConfig,
};

/// The pod-task keys of `[kubernetes]`; the rest of the table is the
/// sink's, read through the sink registry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodTaskKeys {
    pod_tasks: Option<bool>,
    worker: Option<String>,
}

/// Reads the `[kubernetes]` table: its pod-task settings, and the sink
/// when its keys turn it on (`api = true`).
pub(crate) fn read(
    mut table: toml::Table,
) -> Result<(Kubernetes, Option<SinkConfig>), ConfigError> {
    let mine: toml::Table = ["pod_tasks", "worker"]
        .into_iter()
        .filter_map(|key| table.remove_entry(key))
        .collect();
    let keys = PodTaskKeys::deserialize(toml::Value::Table(mine))
        .map_err(|e| invalid("kubernetes", e.to_string().trim_end()))?;
    let settings = Kubernetes {
        pod_tasks: keys.pod_tasks.unwrap_or(false),
        worker: keys.worker,
    };
    let sink = match SinkConfig::from_single("kubernetes", table.clone()) {
        Some(sink) => sink?,
        // This build has no sink that reads the rest of the table.
        None => match table.keys().next() {
            Some(key) => {
                return Err(invalid(
                    format!("kubernetes.{key}"),
                    "this memwatch was built without its `kubernetes` sink (Cargo feature \
                     `kubernetes`, on by default): rebuild with `--features kubernetes`, or \
                     remove the key",
                ));
            }
            None => None,
        },
    };
    Ok((settings, sink))
}

/// Kubernetes settings after defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kubernetes {
    /// Every pod cgroup of the kubelet (either driver) is a task (default
    /// off: nothing else on a host should look like one, but say it).
    pub pod_tasks: bool,
    /// The worker the pods belong to: by default the only declared worker,
    /// or the whole host when none is declared.
    pub worker: Option<String>,
}

impl Kubernetes {
    /// The worker pod tasks go to, or `None` when `pod_tasks` is off.
    pub fn pod_worker(&self, workers: &[WorkerSpec]) -> Result<Option<String>, ConfigError> {
        if !self.pod_tasks {
            return Ok(None);
        }
        let declared = |name: &str| workers.iter().any(|w| w.name == name);
        match (&self.worker, workers) {
            (Some(name), []) if name == HOST_WORKER => Ok(Some(name.clone())),
            (Some(name), _) if declared(name) => Ok(Some(name.clone())),
            (Some(name), _) => Err(invalid(
                "kubernetes.worker",
                format!("`{name}` is not a declared [[worker]]"),
            )),
            (None, []) => Ok(Some(HOST_WORKER.to_string())),
            (None, [only]) => Ok(Some(only.name.clone())),
            (None, _) => Err(invalid(
                "kubernetes.worker",
                "must name the worker pods belong to when several [[worker]]s are declared",
            )),
        }
    }
}
