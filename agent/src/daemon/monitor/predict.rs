//! Feeding the kill predictor: every followed cgroup on the sampler's tick,
//! and those within half of a limit ten times a second in between.
//!
//! Far from its limits a cgroup costs one small read a tick (its usage):
//! its full figures (`memory.stat`, every limit above it) are read again
//! when that usage moved by a drop's size (1 MiB, 2 %), when it comes
//! within a tenth of a limit (page cache may hide anonymous growth at a
//! pinned usage), and every [`REREAD_EVERY`] ticks; in between the last
//! figures stand. A worker's thousands of idle task cgroups so cost what
//! the sampler's own reads cost, not a `memory.stat` and a walk up the
//! hierarchy each a second. With the probe a far cgroup costs nothing
//! between reads: the kernel says when it moved, and every
//! [`REREAD_FOLLOWED`] ticks its limit files alone are read (its
//! `memory.stat` only when one of them changed).

use std::{path::Path, sync::atomic::Ordering, time::Duration};

use tokio::time::Instant;

use super::Monitor;
use crate::{
    cgroup::limits::LimitsShared,
    daemon::sampler::PredictFigures,
    watchdog::{
        imminent::{Reading, Target},
        policy::Sample,
        predict::{DROP_MIN_BYTES, Limit, LimitOwner, drop_size, near_a_limit},
    },
};

/// How often a cgroup within half of a limit is sampled.
pub(crate) const FAST_INTERVAL: Duration = Duration::from_millis(100);
/// A far cgroup whose usage stays put is read in full this often (ticks).
pub(crate) const REREAD_EVERY: u64 = 10;
/// The same, for a cgroup the kernel follows: it says when one moved, and
/// this often its limit files are read (a limit written meanwhile), and
/// the rest only when one changed.
pub(crate) const REREAD_FOLLOWED: u64 = 60;

/// Why the predictor read a cgroup in full (`memwatch_predict_reads_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadWhy {
    /// Nothing kept of it yet.
    New,
    /// The kernel sent a sample of it (or records were lost).
    Kernel,
    /// Its usage, read because the kernel does not follow it, moved.
    Usage,
    /// Within a tenth of a limit with page cache beside its anonymous
    /// memory: read at every sample.
    NearLimit,
    /// Near a limit (or on a fast tick) while the kernel does not follow
    /// it: read at every sample.
    Poll,
    /// The periodic full read.
    Reread,
}

impl ReadWhy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Kernel => "kernel",
            Self::Usage => "usage",
            Self::NearLimit => "near_limit",
            Self::Poll => "poll",
            Self::Reread => "reread",
        }
    }
}

/// A cgroup's last full reading: its figures, its usage then (read only
/// when the kernel does not follow it), the tick it was made in and when.
#[derive(Clone, Debug)]
pub(crate) struct Kept {
    figures: PredictFigures,
    usage: Option<u64>,
    round: u64,
    /// The last tick that had it among its targets.
    seen: u64,
    at: Instant,
    /// Within half of none of its limits.
    far: bool,
}

impl Kept {
    /// Within a tenth of a limit at `usage` (page cache may hide anonymous
    /// growth at a pinned usage).
    fn near_limit(&self, usage: u64) -> bool {
        self.figures
            .limits
            .iter()
            .any(|l| usage.saturating_mul(10) >= l.bytes.saturating_mul(9))
    }

    /// Whether `usage` (read now) may mean other figures: it moved by a
    /// drop's size, or sits within a tenth of a limit.
    fn moved(&self, usage: u64) -> bool {
        let Some(then) = self.usage else {
            return true;
        };
        usage.abs_diff(then) as f64 >= drop_size(then as f64) || self.near_limit(usage)
    }

    /// The usage its limits say it had (its own, else the nearest).
    fn used(&self) -> u64 {
        self.figures.limits.first().map_or(0, |l| l.used)
    }

    /// Within a tenth of a limit with a drop's worth of reclaimable memory
    /// (page cache) beside the rest: the kernel's usage may stand still
    /// while anonymous memory replaces page cache, so a sample of the
    /// usage says nothing; it is read at every sample.
    fn pinned(&self) -> bool {
        let reclaimable = self.used().saturating_sub(self.figures.unreclaimable);
        reclaimable >= DROP_MIN_BYTES
            && self
                .figures
                .limits
                .iter()
                .any(|l| l.used.saturating_mul(10) >= l.bytes.saturating_mul(9))
    }
}

/// The sample size the kernel is asked for: near a limit, every move it
/// checks (a page: at most one sample per `sample_ns`); far, a drop's size
/// rounded up to a power of two (so it is handed again only when the
/// usage changed by half or more).
fn sample_bytes(kept: &Kept) -> u64 {
    if kept.far {
        (drop_size(kept.used() as f64) as u64).next_power_of_two()
    } else {
        1
    }
}

impl Monitor {
    /// Each target's figures, read in full or kept from the last read.
    ///
    /// Read: a cgroup new here or within a tenth of a limit; one the kernel
    /// said moved since its last read; near ones every tick; far ones when
    /// a limit file of theirs or an ancestor's changed, looked at every
    /// [`REREAD_FOLLOWED`] ticks (only the limit files are read for that).
    /// Where the kernel does not follow a cgroup (no probe), a fast tick
    /// reads all (all are near a limit), and
    /// a full tick a far one whose usage moved or that was last read
    /// [`REREAD_EVERY`] ticks ago.
    fn figures(&self, targets: &[&Path], all: bool) -> Vec<Option<PredictFigures>> {
        let round = self.rounds.load(Ordering::Relaxed);
        let root = self.cgroup_root();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let mut shared = LimitsShared::default();
        // Each target is marked seen this round (a full tick forgets the
        // rest below) and asked of the kernel, all under one lock of its.
        let since: Vec<Option<(&Path, Instant)>> = targets
            .iter()
            .map(|c| {
                let k = kept.get_mut(c.as_os_str())?;
                k.seen = round;
                Some((*c, k.at))
            })
            .collect();
        let moved = self.kernel.moved_since_each(since);
        // Far cgroups whose limits were found standing: checked again
        // [`REREAD_FOLLOWED`] ticks from now.
        let mut stood = Vec::new();
        let mut fresh = |c: &Path, moved: Option<bool>| -> Result<PredictFigures, ReadWhy> {
            let k = kept.get(c.as_os_str()).ok_or(ReadWhy::New)?;
            let age = round.saturating_sub(k.round);
            match moved {
                Some(true) => Err(ReadWhy::Kernel),
                Some(false) if k.pinned() => Err(ReadWhy::NearLimit),
                // Far and still (the kernel would have said): only a limit
                // written meanwhile can change its figures.
                Some(false) if all && k.far && age >= REREAD_FOLLOWED => {
                    if self.reader.limits_stand(c, &k.figures, &root, &mut shared) {
                        stood.push(c.to_path_buf());
                        Ok(k.figures.clone())
                    } else {
                        Err(ReadWhy::Reread)
                    }
                }
                Some(false) if all && !k.far && age >= 1 => Err(ReadWhy::Reread),
                Some(false) => Ok(k.figures.clone()),
                None if !all || !k.far => Err(ReadWhy::Poll),
                None if age >= REREAD_EVERY => Err(ReadWhy::Reread),
                None => {
                    let usage = self.reader.cgroup_usage(c).ok_or(ReadWhy::New)?;
                    if k.moved(usage) {
                        Err(ReadWhy::Usage)
                    } else {
                        Ok(k.figures.clone())
                    }
                }
            }
        };
        let mut figures: Vec<Result<Option<PredictFigures>, ReadWhy>> = targets
            .iter()
            .zip(moved)
            .map(|(c, moved)| fresh(c, moved).map(Some))
            .collect();
        for c in stood {
            if let Some(k) = kept.get_mut(c.as_os_str()) {
                k.round = round;
            }
        }
        let metrics = self.recorder.metrics();
        let stale: Vec<&Path> = targets
            .iter()
            .zip(&figures)
            .filter_map(|(c, f)| f.as_ref().err().map(|why| (*c, *why)))
            .map(|(c, why)| {
                metrics
                    .predict_reads
                    .with_label_values(&[why.as_str()])
                    .inc();
                c
            })
            .collect();
        let mut read = self.reader.predict_figures_all(&stale, &root).into_iter();
        for (c, f) in targets.iter().zip(figures.iter_mut()) {
            if f.is_ok() {
                continue;
            }
            let got = read.next().flatten();
            let Some(g) = got.as_ref() else {
                kept.remove(c.as_os_str());
                self.kernel.unfollow(c);
                *f = Ok(None);
                continue;
            };
            let far = !g.limits.iter().any(|l| l.used.saturating_mul(2) >= l.bytes);
            let mut k = Kept {
                figures: g.clone(),
                usage: None,
                round,
                seen: round,
                at: Instant::now(),
                far,
            };
            if !self.kernel.follow(c, sample_bytes(&k)) && far {
                k.usage = self.reader.cgroup_usage(c);
            }
            // After the kernel has the sample size: a new one says nothing
            // of the time before, and this read covers it.
            k.at = Instant::now();
            kept.insert(c.as_os_str().to_owned(), k);
            *f = Ok(got);
        }
        if all {
            kept.retain(|c, k| {
                let keep = k.seen == round;
                if !keep {
                    self.kernel.unfollow(Path::new(c));
                }
                keep
            });
        }
        figures.into_iter().map(|f| f.ok().flatten()).collect()
    }

    /// Readings of `targets` (cgroup, worker, task); remembers which are near
    /// a limit when `all` (a full tick), for [`Monitor::fast_tick`].
    fn readings<'a>(
        &self,
        targets: impl IntoIterator<Item = &'a Target>,
        all: bool,
    ) -> Vec<Reading> {
        let mut near = Vec::new();
        let targets: Vec<&Target> = targets.into_iter().collect();
        let paths: Vec<&Path> = targets.iter().map(|t| &*t.cgroup).collect();
        let figures = self.figures(&paths, all);
        let readings: Vec<Reading> = targets
            .into_iter()
            .zip(figures)
            .filter_map(|(target, f)| {
                let f = f?;
                let cgroup = &*target.cgroup;
                let host = f.host.map(|(bytes, used)| Limit {
                    owner: LimitOwner::Host,
                    bytes,
                    used,
                });
                let cgroups = f.limits.into_iter().map(|l| Limit {
                    owner: if l.cgroup == cgroup {
                        LimitOwner::Own
                    } else {
                        LimitOwner::Ancestor(l.cgroup)
                    },
                    bytes: l.bytes,
                    used: l.used,
                });
                let limits: Vec<Limit> = cgroups.chain(host).collect();
                if near_a_limit(&limits) {
                    near.push(cgroup.to_path_buf());
                }
                Some(Reading {
                    cgroup: target.cgroup.clone(),
                    worker: target.worker.clone(),
                    task_id: target.task_id.clone(),
                    unreclaimable: f.unreclaimable,
                    limits,
                    high: f.high,
                })
            })
            .collect();
        let mut fast = self.near.lock().unwrap_or_else(|e| e.into_inner());
        if all {
            *fast = near.into_iter().collect();
        } else {
            fast.retain(|c| near.contains(c));
        }
        readings
    }

    /// Every followed cgroup's readings, for a full tick.
    pub(super) fn all_readings(&self) -> Vec<Reading> {
        let targets = self.lock().prediction_targets();
        self.readings(targets.iter(), true)
    }

    /// Whether any cgroup is within half of a limit (worth a fast tick).
    pub(crate) fn any_near_a_limit(&self) -> bool {
        !self
            .near
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Samples only the cgroups within half of a limit and runs the
    /// predictor on them: far from every limit, nothing is read.
    pub(crate) fn fast_tick(&self) {
        let near = self.near.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if near.is_empty() {
            return;
        }
        let targets = self.lock().prediction_targets();
        let targets = targets.iter().filter(|t| near.contains(&*t.cgroup));
        let sample = Sample {
            readings: self.readings(targets, false),
            ..Sample::default()
        };
        let mut watchdog = self.lock();
        let now = Instant::now();
        let events = watchdog.observe(&sample, now);
        let health = super::health_changes(&watchdog, &events);
        let _writes = self.unlock_for_writes(watchdog);
        self.decided(health, events, now);
    }

    /// A kill in `cgroup` now: (lead seconds, ETA error seconds) when it was
    /// predicted; the histograms count both.
    pub(crate) fn predicted_kill(&self, cgroup: &std::path::Path) -> Option<(f64, f64)> {
        let report = self.lock().predicted_kill(cgroup, Instant::now())?;
        let lead = report.lead.as_secs_f64();
        let metrics = self.recorder.metrics();
        metrics.predict_lead.observe(lead);
        metrics
            .predict_eta_error
            .observe(report.eta_error_seconds.abs());
        Some((lead, report.eta_error_seconds))
    }
}

#[cfg(test)]
mod tests;
