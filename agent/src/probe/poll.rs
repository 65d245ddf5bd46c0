//! The fallback source: when eBPF cannot be loaded (no privilege, no BTF,
//! an old kernel), the cgroup files give the same event stream, slower.
//!
//! Every interval it reads each memory cgroup's kernel OOM-kill counter and
//! the set of cgroups: a counter that grew becomes [`ProbeEvent::OomCounted`]
//! (the victim's pid and name are not in those files), a cgroup that
//! appeared or vanished becomes [`ProbeEvent::Cgroup`]. Memory growth needs
//! nothing here: the watchdog samples the cgroups it watches anyway.

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use chrono::Utc;
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{debug, warn};

use super::{CgroupChange, OomCount, ProbeEvent};
use crate::{
    cgroup::{MemoryHierarchy, oom},
    telemetry::liveness::Beat,
};

/// Default time between two readings.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// One reading: each memory cgroup's kill counter and directory inode.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Reading {
    pub kills: BTreeMap<String, u64>,
    pub ids: BTreeMap<String, u64>,
}

impl Reading {
    pub(crate) fn take(hierarchy: &MemoryHierarchy) -> Reading {
        let kills = oom::read_oom_counts(hierarchy);
        let ids = kills
            .keys()
            .filter_map(|p| std::fs::metadata(p).ok().map(|m| (p.clone(), m.ino())))
            .collect();
        Reading { kills, ids }
    }
}

/// What changed between two readings, as probe events.
pub(crate) fn changes(root: &Path, before: &Reading, now: &Reading) -> Vec<ProbeEvent> {
    let relative = |path: &str| {
        let rel = Path::new(path)
            .strip_prefix(root)
            .unwrap_or(Path::new(path));
        format!("/{}", rel.display())
    };
    let mut events = Vec::new();
    for (path, &id) in &now.ids {
        if !before.ids.contains_key(path) {
            events.push(ProbeEvent::Cgroup(CgroupChange {
                id,
                path: relative(path),
                level: path.matches('/').count() as u32,
                removed: false,
            }));
        }
    }
    for (cgroup, before_kills, after_kills) in oom::grown(&before.kills, &now.kills) {
        events.push(ProbeEvent::OomCounted(OomCount {
            time: Utc::now(),
            cgroup: PathBuf::from(cgroup),
            before: before_kills,
            after: after_kills,
        }));
    }
    for (path, &id) in &before.ids {
        if !now.ids.contains_key(path) {
            events.push(ProbeEvent::Cgroup(CgroupChange {
                id,
                path: relative(path),
                level: path.matches('/').count() as u32,
                removed: true,
            }));
        }
    }
    events
}

/// Reads every `interval` and sends what changed, until the receiver goes.
pub(crate) fn spawn(
    hierarchy: MemoryHierarchy,
    interval: Duration,
    tx: mpsc::Sender<ProbeEvent>,
    beat: Beat,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let h = hierarchy.clone();
        let mut last = match tokio::task::spawn_blocking(move || Reading::take(&h)).await {
            Ok(reading) => reading,
            Err(error) => {
                warn!(%error, "poll source could not take its first reading");
                return;
            }
        };
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            beat.beat();
            ticker.tick().await;
            let h = hierarchy.clone();
            let Ok(now) = tokio::task::spawn_blocking(move || Reading::take(&h)).await else {
                continue;
            };
            let events = changes(&hierarchy.root, &last, &now);
            debug!(
                changes = events.len(),
                cgroups = now.ids.len(),
                "poll reading"
            );
            for event in events {
                if tx.send(event).await.is_err() {
                    return; // the pipeline is gone: shutting down
                }
            }
            last = now;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(entries: &[(&str, u64, u64)]) -> Reading {
        Reading {
            kills: entries
                .iter()
                .map(|(p, k, _)| (p.to_string(), *k))
                .collect(),
            ids: entries
                .iter()
                .map(|(p, _, id)| (p.to_string(), *id))
                .collect(),
        }
    }

    #[test]
    fn new_cgroups_kills_and_removals_become_events_in_that_order() {
        let root = Path::new("/sys/fs/cgroup/memory");
        let before = reading(&[
            ("/sys/fs/cgroup/memory/a", 0, 10),
            ("/sys/fs/cgroup/memory/gone", 0, 11),
        ]);
        let now = reading(&[
            ("/sys/fs/cgroup/memory/a", 2, 10),
            ("/sys/fs/cgroup/memory/new", 1, 12),
        ]);
        let events = changes(root, &before, &now);
        assert_eq!(events.len(), 4, "{events:?}");
        let ProbeEvent::Cgroup(made) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(
            (made.id, made.path.as_str(), made.removed),
            (12, "/new", false)
        );
        let ProbeEvent::OomCounted(kills) = &events[1] else {
            panic!("{events:?}")
        };
        assert_eq!(
            (kills.cgroup.as_path(), kills.before, kills.after),
            (Path::new("/sys/fs/cgroup/memory/a"), 0, 2)
        );
        // The new cgroup's first kill counts too (it started at 0).
        let ProbeEvent::OomCounted(first) = &events[2] else {
            panic!("{events:?}")
        };
        assert_eq!((first.before, first.after), (0, 1));
        let ProbeEvent::Cgroup(gone) = &events[3] else {
            panic!("{events:?}")
        };
        assert_eq!((gone.id, gone.removed), (11, true));
    }

    #[test]
    fn nothing_changed_is_no_event() {
        let r = reading(&[("/x/a", 3, 1)]);
        assert!(changes(Path::new("/x"), &r, &r).is_empty());
    }
}
