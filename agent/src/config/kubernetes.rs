//! `[kubernetes]`: pods of the node as tasks of a worker, and (with
//! `api = true`) the Kubernetes sink: a node condition, a taint under the
//! cluster guard, Events, pods by name (sinks/kubernetes).

use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::{
    model::spec::{HOST_WORKER, WorkerSpec},
    sinks::{
        config::{Delivery, SinkTable},
        kubernetes::{ApiKeys, KubernetesSinkConfig},
    },
};

/// `[kubernetes]` as written, but for the delivery keys (taken out first).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KubernetesFile {
    pub(crate) pod_tasks: Option<bool>,
    pub(crate) worker: Option<String>,
    pub(crate) api: Option<bool>,
    pub(crate) api_server: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) condition: Option<bool>,
    pub(crate) taint: Option<bool>,
    pub(crate) events: Option<bool>,
    pub(crate) pod_names: Option<bool>,
    pub(crate) min_remaining: Option<usize>,
    pub(crate) min_remaining_fraction: Option<f64>,
}

/// Reads the `[kubernetes]` table: its pod-task settings, and the sink
/// when `api = true`. A key of the API written while `api` is off is an
/// error naming it (it would do nothing).
pub(crate) fn read(
    table: toml::Table,
) -> Result<(Kubernetes, Option<KubernetesSinkConfig>), ConfigError> {
    let mut table = SinkTable::single("kubernetes", table);
    let delivery = table.delivery(Delivery::default(), true)?;
    let written_delivery = delivery != Delivery::default();
    let file: KubernetesFile = table.rest()?;
    let settings = Kubernetes {
        pod_tasks: file.pod_tasks.unwrap_or(false),
        worker: file.worker,
    };
    let keys = ApiKeys {
        api_server: file.api_server,
        token_file: file.token_file,
        ca_file: file.ca_file,
        condition: file.condition,
        taint: file.taint,
        events: file.events,
        pod_names: file.pod_names,
        min_remaining: file.min_remaining,
        min_remaining_fraction: file.min_remaining_fraction,
    };
    if !file.api.unwrap_or(false) {
        if let Some(key) = keys
            .written()
            .first()
            .copied()
            .or(written_delivery.then_some("timeout"))
        {
            return Err(invalid(
                format!("kubernetes.{key}"),
                "needs `api = true` (the agent talks to the Kubernetes API only then)",
            ));
        }
        return Ok((settings, None));
    }
    let sink = KubernetesSinkConfig::from_keys(&table, delivery, keys)?;
    Ok((settings, Some(sink)))
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
