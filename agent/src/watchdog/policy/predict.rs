//! The watchdog's side of the kill predictor: which cgroups it follows,
//! and what it said of them.

use std::{path::Path, sync::Arc};

use tokio::time::Instant;

use super::Watchdog;
use crate::watchdog::{
    imminent::{KillReport, Target},
    predict::LimitFields,
};

impl Watchdog {
    /// Every cgroup the predictor follows: (cgroup, worker, task), shared:
    /// built again only after a task came or went.
    pub(crate) fn prediction_targets(&mut self) -> Arc<[Target]> {
        if let Some(targets) = &self.targets {
            return targets.clone();
        }
        let workers = self.workers.values().filter_map(|w| {
            let cgroup = w.spec.source.cgroup()?;
            Some(Target {
                cgroup: cgroup.into(),
                worker: w.spec.name.as_str().into(),
                task_id: None,
            })
        });
        let tasks = self.tasks.values().filter_map(|t| {
            let cgroup = t.source.as_ref()?.cgroup()?;
            Some(Target {
                cgroup: cgroup.into(),
                worker: t.worker.as_str().into(),
                task_id: Some(t.id.as_str().into()),
            })
        });
        let targets: Arc<[Target]> = workers.chain(tasks).collect();
        self.targets = Some(targets.clone());
        targets
    }

    /// The ETA said for `cgroup`, while its kill is imminent.
    pub(crate) fn eta(&self, cgroup: &Path, now: Instant) -> Option<f64> {
        self.predictions.eta(cgroup, now)
    }

    /// The limit nearest to `cgroup` (least headroom) at its last reading.
    pub(crate) fn nearest_limit(&self, cgroup: &Path) -> LimitFields {
        self.predictions.nearest_limit(cgroup)
    }

    /// Each worker's soonest predicted kill: seconds left, over its own
    /// cgroup and its tasks'.
    pub(crate) fn worker_etas(&self, now: Instant) -> std::collections::BTreeMap<String, f64> {
        self.predictions.soonest_by_worker(now)
    }

    /// A kill in `cgroup` at `at`: how early and how well it was predicted.
    pub(crate) fn predicted_kill(&mut self, cgroup: &Path, at: Instant) -> Option<KillReport> {
        self.predictions.killed(cgroup, at)
    }
}
