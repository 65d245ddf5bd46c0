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
//! shutdown, when the host-wide count says a kill went unreported, and (on
//! a kernel without that count) at a long interval; in between, only the
//! cgroups where a kill was just seen (live, from the probe or the poll
//! source) are read again, and at the long interval those accounted for. Only non-zero counters are kept: a cgroup missing from the saved
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
        oom::{grown, host_oom_kills, oom_kills, read_oom_counts},
    },
    model::event::{EventBody, EventKind},
    record::Recorder,
};

/// What the agent knows of OOM kills against what the kernel counted:
/// reported at start, checked where kills were seen and where a kill went
/// unaccounted, walked in full when something says a kill may have been
/// missed (a ring-buffer loss, the host-wide count growing past what was
/// reported) and now and then.
pub(crate) struct OomBook {
    hierarchy: MemoryHierarchy,
    /// Kills accounted for, by cgroup path: counted at start, reported live
    /// or recovered since. Non-zero only; saved.
    accounted: BTreeMap<String, u64>,
    /// Cgroups whose counter was above `accounted` at the last check, with
    /// that counter: reported at the next check if still unaccounted (a live
    /// event in flight gets one check interval to arrive).
    suspects: BTreeMap<String, u64>,
    /// Host-wide: `/proc/vmstat` `oom_kill` when the book opened, and every
    /// kill reported since (live or recovered, once each).
    host_base: Option<u64>,
    reported: u64,
    /// The host-wide count above what was reported at the last full check.
    host_suspect: Option<u64>,
    /// A full walk is owed (a loss was noticed).
    walk_owed: bool,
    /// The host-wide count was ahead of the kills reported at the last look.
    host_ahead: bool,
    /// The last save failed: save at the next chance even without a change.
    unsaved: bool,
    /// The next check also reads every cgroup accounted for ([`Self::rescan`]).
    recheck_accounted: bool,
}

/// The kernel's OOM counters read before the probe attached.
pub(crate) struct Baseline {
    hierarchy: MemoryHierarchy,
    counts: BTreeMap<String, u64>,
    host: Option<u64>,
}

/// OOM kills reported live since the last [`LiveKills::take`], by cgroup
/// (and in all, with those whose cgroup was unknown). The pipeline notes
/// them; the daemon's loop hands them to the [`OomBook`].
#[derive(Clone, Default)]
pub(crate) struct LiveKills(Arc<Mutex<(BTreeMap<PathBuf, u64>, u64)>>);

impl LiveKills {
    pub(crate) fn note(&self, cgroup: Option<&Path>) {
        let mut kills = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cgroup) = cgroup {
            *kills.0.entry(cgroup.to_path_buf()).or_default() += 1;
        }
        kills.1 += 1;
    }

    /// Kills noted and not taken yet.
    pub(crate) fn pending(&self) -> u64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    pub(crate) fn take(&self) -> (BTreeMap<PathBuf, u64>, u64) {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Which counters a check reads.
pub(crate) enum OomScan {
    /// Those of the cgroups where kills were seen or went unaccounted.
    Cgroups(BTreeSet<PathBuf>),
    /// Every memory cgroup's.
    Full,
}

impl OomBook {
    /// Reads the kernel's counters: the baseline. Done before the probe
    /// attaches: a kill after this reading is reported live, or found by a
    /// check (it counts above the baseline); a kill before it, while the
    /// agent was down, by [`OomBook::open`]. Read after attaching instead,
    /// a kill in between whose live record was lost would be in the
    /// baseline, and never reported.
    pub(crate) async fn baseline(hierarchy: &MemoryHierarchy) -> anyhow::Result<Baseline> {
        let h = hierarchy.clone();
        let (counts, host) =
            tokio::task::spawn_blocking(move || (read_oom_counts(&h), host_oom_kills()))
                .await
                .context("reading OOM counters")?;
        Ok(Baseline {
            hierarchy: hierarchy.clone(),
            counts,
            host,
        })
    }

    /// Reports the OOM kills the kernel counted while the agent was down
    /// (as `oom_kill` events with `recovered: true`), then saves the
    /// counters.
    pub(crate) fn open(baseline: Baseline, recorder: &Recorder) -> Self {
        let Baseline {
            hierarchy,
            counts,
            host,
        } = baseline;
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
        let accounted = nonzero(counts);
        let saved = outbox.save_oom_counts(&accounted);
        Self {
            hierarchy,
            accounted,
            suspects: BTreeMap::new(),
            host_base: host,
            reported: 0,
            host_suspect: None,
            walk_owed: false,
            host_ahead: false,
            unsaved: !saved,
            recheck_accounted: false,
        }
    }

    /// Kills reported live: accounted for.
    pub(crate) fn live(&mut self, kills: (BTreeMap<PathBuf, u64>, u64)) {
        let (by_cgroup, total) = kills;
        for (cgroup, n) in by_cgroup {
            *self
                .accounted
                .entry(cgroup.display().to_string())
                .or_default() += n;
        }
        self.reported += total;
        self.unsaved |= total > 0;
    }

    /// Something says a kill may have been missed (the ring buffer lost
    /// records): the next check walks every cgroup.
    pub(crate) fn owe_walk(&mut self) {
        tracing::debug!("OOM counters: a walk is owed");
        self.walk_owed = true;
    }

    /// The long-interval safety net. With the host-wide count
    /// (`/proc/vmstat` `oom_kill`, every kernel since 4.13) a kill no live
    /// event named already owes a walk ([`Self::watch_host`]), so only the
    /// cgroups accounted for (few: those with kills) are read again, which
    /// forgets the removed ones (a gone cgroup reads 0) without opening a
    /// file in every cgroup of the host. Without it, every cgroup is walked.
    pub(crate) fn rescan(&mut self) {
        if self.host_base.is_some() {
            self.recheck_accounted = true;
        } else {
            self.owe_walk();
        }
    }

    /// Cheap (one small file): whether the host-wide count grew past every
    /// kill reported (`pending`: those noted live and not handed over yet),
    /// in which case the next check walks every cgroup. The kernel counts a
    /// kill before it marks the victim, so a kill in flight is seen here
    /// until its live event is noted: only a count still ahead at the next
    /// look owes the walk.
    pub(crate) fn watch_host(&mut self, pending: u64) {
        let ahead = matches!(
            (self.host_base, host_oom_kills()),
            (Some(base), Some(now)) if now > base + self.reported + pending
        );
        self.walk_owed |= ahead && self.host_ahead;
        self.host_ahead = ahead;
    }

    /// The cgroups the next check reads when it does not walk them all.
    pub(crate) fn to_read(&self, seen: &BTreeMap<PathBuf, u64>) -> Option<OomScan> {
        if self.walk_owed || self.host_suspect.is_some() {
            return Some(OomScan::Full);
        }
        let mut cgroups: BTreeSet<PathBuf> = seen.keys().cloned().collect();
        cgroups.extend(self.suspects.keys().map(PathBuf::from));
        if self.recheck_accounted {
            cgroups.extend(self.accounted.keys().map(PathBuf::from));
        }
        (!cgroups.is_empty() || self.unsaved || self.recheck_accounted)
            .then_some(OomScan::Cgroups(cgroups))
    }

    /// Reads the counters `scan` names; reports as `oom_kill` (`recovered:
    /// true`) every kill counted that no event accounted for at two checks
    /// in a row; saves what it accounted for.
    pub(crate) async fn check(&mut self, recorder: &Recorder, scan: OomScan) {
        let full = matches!(scan, OomScan::Full);
        let h = self.hierarchy.clone();
        let read = tokio::task::spawn_blocking(move || {
            let counts = match &scan {
                OomScan::Full => read_oom_counts(&h),
                OomScan::Cgroups(cgroups) => cgroups
                    .iter()
                    .map(|dir| {
                        let kills = oom_kills(dir, h.version).unwrap_or(0);
                        (dir.display().to_string(), kills)
                    })
                    .collect(),
            };
            (counts, host_oom_kills())
        })
        .await;
        let Ok((counts, host)) = read else {
            return;
        };
        self.recheck_accounted = false;
        if full {
            self.walk_owed = false;
            // Cgroups gone since: their counters went with them.
            let before = self.accounted.len();
            self.accounted
                .retain(|cgroup, _| counts.contains_key(cgroup));
            self.unsaved |= self.accounted.len() != before;
        }
        for (cgroup, kills) in counts {
            let accounted = self.accounted.get(&cgroup).copied().unwrap_or(0);
            if kills < accounted {
                // A new cgroup under an old name: its counter restarted.
                set_nonzero(&mut self.accounted, &cgroup, kills);
                self.unsaved = true;
                self.suspects.remove(&cgroup);
            } else if kills == accounted {
                self.suspects.remove(&cgroup);
            } else if let Some(then) = self.suspects.remove(&cgroup)
                && then > accounted
            {
                // Only the kills the kernel had counted at the last check
                // have had their interval to arrive live; those counted
                // since (a storm has one in flight at any time) may still.
                self.report(recorder, Some(&cgroup), then - accounted, (accounted, then));
                self.accounted.insert(cgroup.clone(), then);
                self.unsaved = true;
                if kills > then {
                    self.suspects.insert(cgroup, kills);
                }
            } else {
                // New kills since the last check (or every old one was
                // seen live meanwhile): they get one interval.
                self.suspects.insert(cgroup, kills);
            }
        }
        tracing::debug!(full, suspects = ?self.suspects, accounted = self.accounted.len(), reported = self.reported, host = ?host, base = ?self.host_base, "OOM counters checked");
        if full {
            self.check_host(recorder, host);
        }
        if self.unsaved && recorder.outbox().save_oom_counts(&self.accounted) {
            self.unsaved = false;
        }
    }

    /// After a full walk: kills the host counted that no cgroup's counter
    /// explains (on cgroup v1 a removed cgroup's counter is gone with it;
    /// a kill of a task in the root cgroup has no counter of its own) are
    /// reported at host level, when still unexplained at the next walk.
    fn check_host(&mut self, recorder: &Recorder, host: Option<u64>) {
        let (Some(base), Some(now)) = (self.host_base, host) else {
            return;
        };
        let expected = base + self.reported;
        if now <= expected || !self.suspects.is_empty() {
            self.host_suspect = None;
            return;
        }
        match self.host_suspect {
            Some(_) => {
                self.report(recorder, None, now - expected, (expected, now));
                self.host_suspect = None;
            }
            None => self.host_suspect = Some(now),
        }
    }

    fn report(
        &mut self,
        recorder: &Recorder,
        cgroup: Option<&str>,
        missed: u64,
        (before, after): (u64, u64),
    ) {
        let mut body = EventBody::new(EventKind::OomKill);
        body.cgroup = cgroup.map(str::to_string);
        body.recovered = Some(true);
        let counter = if cgroup.is_some() {
            "this cgroup's OOM-kill counter"
        } else {
            "the host-wide OOM-kill count (/proc/vmstat), beyond every cgroup's"
        };
        body.reason = Some(format!(
            "recovered: {missed} OOM kill{} that no live event reported ({counter} {before} -> {after}); victim unknown",
            if missed == 1 { "" } else { "s" }
        ));
        self.reported += missed;
        let event = recorder.record(body, None);
        warn!(
            seq = event.seq,
            cgroup = cgroup.unwrap_or("(host)"),
            missed,
            "OOM kill not seen live: recovered from the kernel's counters"
        );
    }
}

fn set_nonzero(map: &mut BTreeMap<String, u64>, key: &str, value: u64) {
    if value == 0 {
        map.remove(key);
    } else {
        map.insert(key.to_string(), value);
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
mod tests;
