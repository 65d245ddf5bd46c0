//! `[kubernetes]`: pods of the node as tasks of a worker.

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::model::spec::{HOST_WORKER, WorkerSpec};

/// `[kubernetes]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesFile {
    pub pod_tasks: Option<bool>,
    pub worker: Option<String>,
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

impl From<KubernetesFile> for Kubernetes {
    fn from(f: KubernetesFile) -> Self {
        Self {
            pod_tasks: f.pod_tasks.unwrap_or(false),
            worker: f.worker,
        }
    }
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
