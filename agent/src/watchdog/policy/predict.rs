//! The watchdog's side of the kill predictor: which cgroups it follows,
//! and what it said of them.

use std::path::{Path, PathBuf};

use tokio::time::Instant;

use super::Watchdog;
use crate::watchdog::{imminent::KillReport, predict::LimitFields};

impl Watchdog {
    /// Every cgroup the predictor follows: (cgroup, worker, task).
    pub(crate) fn prediction_targets(&self) -> Vec<(PathBuf, String, Option<String>)> {
        let workers = self.workers.values().filter_map(|w| {
            let cgroup = w.spec.source.cgroup()?;
            Some((cgroup.to_path_buf(), w.spec.name.clone(), None))
        });
        let tasks = self.tasks.values().filter_map(|t| {
            let cgroup = t.source.as_ref()?.cgroup()?;
            Some((cgroup.to_path_buf(), t.worker.clone(), Some(t.id.clone())))
        });
        workers.chain(tasks).collect()
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
