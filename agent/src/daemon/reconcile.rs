//! OOM kills that happened while the agent was not running, and the
//! bookkeeping of the counters that find them ([`OomBook`]).
//!
//! The kernel counts OOM kills per memory cgroup (v1 `memory.oom_control`,
//! v2 `memory.events.local` or `memory.events`: the line `oom_kill N`).
//! The agent saves those counters in its state directory while it runs;
//! at start it compares them with the kernel's and reports each cgroup
//! whose counter grew as an `oom_kill` event whose `reason` says it was
//! recovered after the fact (the victim's pid and name are not known).
//!
//! Reading every counter means opening a file in every memory cgroup, which
//! on a host with 10,000 cgroups costs a good part of a core for a moment.
//! So the saved copy ([`OomCounters`]) is walked in full only at start, at
//! shutdown and at a long interval; in between, only the cgroups where a
//! kill was just seen (live, from the probe or the poll source) are read
//! again. Only non-zero counters are kept: a cgroup missing from the saved
//! copy counts as 0, so the result is the same.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use tracing::warn;

use crate::{
    cgroup::{
        MemoryHierarchy,
        oom::{grown, oom_kills, read_oom_counts},
    },
    model::event::{EventBody, EventKind},
    outbox::Outbox,
    record::Recorder,
};

/// The OOM counters the agent keeps and saves: reported at start, read
/// again where kills were seen, walked in full now and then.
pub(crate) struct OomBook {
    counters: OomCounters,
    /// The last save failed: save at the next chance even without a change.
    unsaved: bool,
}

/// Cgroups with an OOM kill since the last [`KilledCgroups::take`]: the
/// only OOM counters the agent needs to read again before saving them.
/// The pipeline notes them; the daemon's loop takes them.
#[derive(Clone, Default)]
pub(crate) struct KilledCgroups(Arc<Mutex<BTreeSet<PathBuf>>>);

impl KilledCgroups {
    pub(crate) fn note(&self, cgroup: &Path) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cgroup.to_path_buf());
    }

    pub(crate) fn take(&self) -> BTreeSet<PathBuf> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Which OOM counters to read before saving.
pub(crate) enum OomScan {
    /// Those of the cgroups where kills were seen.
    Cgroups(BTreeSet<PathBuf>),
    /// Every memory cgroup's.
    Full,
}

impl OomBook {
    /// Reports the OOM kills the kernel counted while the agent was down
    /// (as `oom_kill` events with a `recovered` reason), then saves the
    /// counters.
    pub(crate) async fn open(
        hierarchy: &MemoryHierarchy,
        recorder: &Recorder,
    ) -> anyhow::Result<Self> {
        let h = hierarchy.clone();
        let counts = tokio::task::spawn_blocking(move || read_oom_counts(&h))
            .await
            .context("reading OOM counters")?;
        let outbox = recorder.outbox();
        let saved = outbox.saved_oom_counts();
        for body in recovered_kills(saved.as_ref(), &counts) {
            let event = recorder.record(body, None);
            warn!(
                seq = event.seq,
                cgroup = event.body.cgroup.as_deref().unwrap_or("?"),
                reason = event.body.reason.as_deref().unwrap_or(""),
                "OOM kill while the agent was not running"
            );
        }
        let counters = OomCounters::new(hierarchy.clone(), counts);
        let saved = outbox.save_oom_counts(counters.counts());
        Ok(Self {
            counters,
            unsaved: !saved,
        })
    }

    /// True when a save is owed even without new kills.
    pub(crate) fn unsaved(&self) -> bool {
        self.unsaved
    }

    /// Reads the OOM counters `scan` names and saves them when they changed
    /// (or an earlier save failed).
    pub(crate) async fn save(&mut self, outbox: &Outbox, scan: OomScan) {
        let mut copy = self.counters.clone();
        let read = tokio::task::spawn_blocking(move || {
            let changed = match &scan {
                OomScan::Cgroups(cgroups) => copy.refresh(cgroups),
                OomScan::Full => copy.rescan(),
            };
            (copy, changed)
        })
        .await;
        let Ok((copy, changed)) = read else {
            return;
        };
        self.counters = copy;
        self.unsaved |= changed;
        if self.unsaved && outbox.save_oom_counts(self.counters.counts()) {
            self.unsaved = false;
        }
    }
}

/// The agent's copy of the kernel's OOM-kill counters, the one it saves:
/// non-zero counters only, by cgroup path.
#[derive(Clone, Debug)]
pub(crate) struct OomCounters {
    hierarchy: MemoryHierarchy,
    counts: BTreeMap<String, u64>,
}

impl OomCounters {
    /// A copy of `counts` (a full reading), without the zeros.
    pub(crate) fn new(hierarchy: MemoryHierarchy, counts: BTreeMap<String, u64>) -> Self {
        Self {
            hierarchy,
            counts: nonzero(counts),
        }
    }

    /// What to save.
    pub(crate) fn counts(&self) -> &BTreeMap<String, u64> {
        &self.counts
    }

    /// Reads the counters of `cgroups` again (where kills were just seen);
    /// a cgroup gone since is dropped. True when anything changed.
    pub(crate) fn refresh(&mut self, cgroups: &BTreeSet<PathBuf>) -> bool {
        let mut changed = false;
        for dir in cgroups {
            let key = dir.display().to_string();
            let now = oom_kills(dir, self.hierarchy.version).filter(|&k| k > 0);
            let was = match now {
                Some(kills) => self.counts.insert(key, kills),
                None => self.counts.remove(&key),
            };
            changed |= was != now;
        }
        changed
    }

    /// Walks the whole hierarchy (kills no live event named, cgroups
    /// removed since). True when anything changed.
    pub(crate) fn rescan(&mut self) -> bool {
        let now = nonzero(read_oom_counts(&self.hierarchy));
        let changed = now != self.counts;
        self.counts = now;
        changed
    }
}

fn nonzero(mut counts: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    counts.retain(|_, kills| *kills > 0);
    counts
}

/// The events for kills counted since `saved`. Nothing without a saved
/// baseline: on a first run, no one knows when the kernel's counts grew.
pub(crate) fn recovered_kills(
    saved: Option<&BTreeMap<String, u64>>,
    now: &BTreeMap<String, u64>,
) -> Vec<EventBody> {
    let Some(saved) = saved else {
        return Vec::new();
    };
    grown(saved, now)
        .into_iter()
        .map(|(cgroup, before, kills)| {
            let missed = kills - before;
            let mut body = EventBody::new(EventKind::OomKill);
            body.cgroup = Some(cgroup.to_string());
            body.recovered = Some(true);
            body.reason = Some(format!(
                "recovered after the fact: {missed} OOM kill{} in this cgroup while the agent was \
                 not running (kernel counter {before} -> {kills}); victim unknown",
                if missed == 1 { "" } else { "s" }
            ));
            body
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use super::*;
    use crate::cgroup::CgroupVersion;
    use crate::cgroup::temp_hierarchy as hierarchy;

    #[test]
    fn counters_are_kept_current_from_the_cgroups_named_and_by_a_rescan() {
        let (dir, h) = hierarchy(CgroupVersion::V1);
        let control = |path: &Path, kills: u64| {
            fs::create_dir_all(path).unwrap();
            fs::write(
                path.join("memory.oom_control"),
                format!("oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"),
            )
            .unwrap();
        };
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        control(dir.path(), 0);
        control(&a, 1);
        control(&b, 0);
        let mut counters = OomCounters::new(h.clone(), read_oom_counts(&h));
        let key = |p: &Path| p.display().to_string();
        assert_eq!(
            counters.counts(),
            &BTreeMap::from([(key(&a), 1)]),
            "zeros are not kept"
        );

        control(&a, 3);
        control(&b, 2);
        control(&c, 5);
        assert!(counters.refresh(&BTreeSet::from([b.clone()])));
        assert_eq!(
            counters.counts(),
            &BTreeMap::from([(key(&a), 1), (key(&b), 2)]),
            "only the cgroups named are read"
        );
        assert!(!counters.refresh(&BTreeSet::from([b.clone()])), "unchanged");

        fs::remove_file(b.join("memory.oom_control")).unwrap();
        fs::remove_dir(&b).unwrap();
        assert!(counters.refresh(&BTreeSet::from([b.clone()])));
        assert_eq!(
            counters.counts(),
            &BTreeMap::from([(key(&a), 1)]),
            "b is gone"
        );

        assert!(counters.rescan());
        assert_eq!(
            counters.counts(),
            &BTreeMap::from([(key(&a), 3), (key(&c), 5)]),
            "the rescan finds what no event named"
        );
        assert!(!counters.rescan());
        assert!(
            recovered_kills(Some(counters.counts()), &read_oom_counts(&h)).is_empty(),
            "nothing to recover from an up-to-date copy"
        );
    }

    #[test]
    fn kills_since_the_saved_counts_become_events() {
        let now = BTreeMap::from([
            ("/cg/a".to_string(), 3),
            ("/cg/b".to_string(), 1),
            ("/cg/new".to_string(), 2),
            ("/cg/reused".to_string(), 1),
        ]);
        assert!(
            recovered_kills(None, &now).is_empty(),
            "first run: no baseline"
        );
        let saved = BTreeMap::from([
            ("/cg/a".to_string(), 1),
            ("/cg/b".to_string(), 1),
            ("/cg/reused".to_string(), 9),
        ]);
        let events = recovered_kills(Some(&saved), &now);
        let summary: Vec<(&str, &str)> = events
            .iter()
            .map(|e| (e.cgroup.as_deref().unwrap(), e.reason.as_deref().unwrap()))
            .collect();
        assert_eq!(summary.len(), 3, "{summary:?}");
        assert!(events.iter().all(|e| e.kind == EventKind::OomKill));
        assert_eq!(summary[0].0, "/cg/a");
        assert!(
            summary[0]
                .1
                .starts_with("recovered after the fact: 2 OOM kills")
        );
        assert!(summary[0].1.contains("1 -> 3"));
        assert_eq!(summary[1].0, "/cg/new");
        assert_eq!(summary[2].0, "/cg/reused");
        assert!(summary[2].1.contains("1 OOM kill in"), "{}", summary[2].1);
    }
}
