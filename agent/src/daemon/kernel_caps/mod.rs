//! What the kernel watches of each memory cgroup (the probe's WATCHED
//! map): the soft caps, keyed by worker (`worker:<name>`) or task id, with
//! the usage the kernel last reported for each (a cap crossed in the
//! kernel wakes the sampling loop); and the cgroups the kill predictor
//! follows, by path, with when the kernel last said one moved.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use crate::{
    model::{ByPath, FastMap},
    probe::{GrowthLine, KernelWatch, Line, Watch},
};

#[derive(Default)]
pub(crate) struct KernelCaps {
    /// The probe's map, once it runs (never, when polling).
    watch: OnceLock<Arc<dyn KernelWatch>>,
    held: Mutex<Held>,
    /// Wakes the sampling loop at once.
    sample_now: Arc<Notify>,
}

#[derive(Default)]
struct Held {
    /// Cgroup id by key.
    ids: FastMap<String, u64>,
    /// Cgroup id of each cgroup the predictor follows.
    followed: ByPath<u64>,
    /// By id of a watched cgroup: who watches it and what the kernel said.
    watched: FastMap<u64, Watched>,
    /// When records were last found lost to a full ring buffer: any of
    /// them may have been a line of a watched cgroup.
    lost_at: Option<Instant>,
    /// The last generation handed out (see [`Watch::generation`]).
    generation: u64,
    /// By id of a watched cgroup: the kernel's last cap crossing that no
    /// read has judged yet (almost always empty).
    crossings: HashMap<u64, KernelCrossing>,
    /// By id of a watched cgroup: the kernel's line raised above its cap
    /// after a read found the crossing was page cache (see
    /// [`KernelCaps::judged`]; almost always empty).
    raised: HashMap<u64, Raise>,
}

/// A cap the kernel holds raised: the true cap, how far above the
/// kernel's usage the line was set, when, and whether it still is (one
/// lowered again is kept a while for its rate bound).
#[derive(Clone, Copy, Debug)]
struct Raise {
    cap: u64,
    margin: u64,
    at: Instant,
    active: bool,
}

/// Raises closer together than this double the margin: a page-cache
/// stream costs the sampling loop a few wake-ups a second, not one per
/// margin of growth.
const RAISE_WINDOW: Duration = Duration::from_secs(1);

/// The least a raised line sits above the kernel's usage, and the slack a
/// read must show below the cap before the kernel gets it back.
fn raise_floor(cap: u64) -> u64 {
    (cap / 32).max(1 << 20)
}

/// A cap crossing the kernel reported: its usage then (page cache
/// included), when it came, and whether the kernel has said the cgroup
/// went back below (re-armed) since, before any read judged it.
#[derive(Clone, Copy, Debug)]
struct KernelCrossing {
    usage: u64,
    at: Instant,
    closed: bool,
}

#[derive(Default)]
struct Watched {
    /// Keys whose cap it is.
    keys: usize,
    /// What the kernel holds of it.
    watch: Watch,
    /// The kernel's usage at its last cap or step line, when it came, and
    /// whether it left the cgroup above its cap.
    last: Option<(u64, Instant, bool)>,
    /// When its cap was last handed to the kernel: it says nothing of the
    /// time before.
    pushed_at: Option<Instant>,
    /// When the predictor's sample size was last handed to the kernel, and
    /// when the kernel last sent a sample.
    followed_at: Option<Instant>,
    sampled_at: Option<Instant>,
}

impl KernelCaps {
    /// Sets the probe's map; false when one was set already.
    pub(crate) fn attach(&self, watch: Arc<dyn KernelWatch>) -> bool {
        self.watch.set(watch).is_ok()
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the kernel `cgroup`'s cap (nothing before the probe runs).
    pub(crate) fn push(&self, key: &str, cgroup: &Path, cap: u64) {
        let (Some(watch), Ok(meta)) = (self.watch.get(), std::fs::metadata(cgroup)) else {
            return;
        };
        let id = meta.ino();
        // Held before the kernel has the cap, so that no line of it can
        // come before its cgroup is known here; the map is written under
        // the same lock, so two writes of one id land in the order made.
        let mut held = self.held();
        let old = held.ids.insert(key.to_string(), id);
        if let Some(old) = old.filter(|&old| old != id) {
            held.unwatch(old, watch.as_ref());
        }
        held.generation += 1;
        let generation = held.generation;
        let watched = held.watched.entry(id).or_default();
        if old != Some(id) {
            watched.keys += 1;
        }
        watched.pushed_at = Some(Instant::now());
        watched.watch.cap_bytes = Some(cap);
        watched.watch.generation = generation;
        watch.set(id, Some(watched.watch));
        held.raised.remove(&id);
    }

    /// Takes `key`'s cap back from the kernel.
    pub(crate) fn remove(&self, key: &str) {
        let Some(watch) = self.watch.get() else {
            return;
        };
        let mut held = self.held();
        if let Some(id) = held.ids.remove(key) {
            held.unwatch(id, watch.as_ref());
        }
    }

    /// Asks the kernel for a sample of `cgroup` each time its usage moves
    /// by `sample_bytes` (the predictor follows it). False when the kernel
    /// cannot (no probe, or the cgroup is gone): the predictor reads it.
    pub(crate) fn follow(&self, cgroup: &Path, sample_bytes: u64) -> bool {
        let Some(watch) = self.watch.get() else {
            return false;
        };
        let known = self.held().followed.get(cgroup.as_os_str()).copied();
        let id = match known {
            Some(id) => id,
            None => match std::fs::metadata(cgroup) {
                Ok(meta) => meta.ino(),
                Err(_) => return false,
            },
        };
        let mut held = self.held();
        held.followed.insert(cgroup.as_os_str().to_owned(), id);
        let watched = held.watched.entry(id).or_default();
        if watched.watch.sample_bytes == Some(sample_bytes) {
            return true;
        }
        watched.watch.sample_bytes = Some(sample_bytes);
        watched.followed_at = Some(Instant::now());
        watch.set(id, Some(watched.watch));
        true
    }

    /// The predictor no longer follows `cgroup`: no more samples of it.
    pub(crate) fn unfollow(&self, cgroup: &Path) {
        let Some(watch) = self.watch.get() else {
            return;
        };
        let mut held = self.held();
        let Some(id) = held.followed.remove(cgroup.as_os_str()) else {
            return;
        };
        held.stop_samples(id, watch.as_ref());
    }

    /// A cgroup was removed: no path the predictor follows stands for its
    /// id any more (one made again at the same path has another id, and is
    /// followed afresh when next read).
    pub(crate) fn cgroup_removed(&self, id: u64) {
        let Some(watch) = self.watch.get() else {
            return;
        };
        let mut held = self.held();
        let before = held.followed.len();
        held.followed.retain(|_, followed| *followed != id);
        if held.followed.len() < before {
            held.stop_samples(id, watch.as_ref());
        }
    }

    /// For each query `(cgroup, since)`, under one lock (the predictor asks
    /// of every followed cgroup each tick): whether the kernel said it moved
    /// since then; `None` when it does not follow it (the caller reads it to
    /// know) or for a `None` query. It moved when a sample came after
    /// `since`, when its sample size was handed to the kernel after it (the
    /// kernel's account starts there), or when records were lost after it.
    pub(crate) fn moved_since_each<'a>(
        &self,
        queries: impl IntoIterator<Item = Option<(&'a Path, Instant)>>,
    ) -> Vec<Option<bool>> {
        let queries = queries.into_iter();
        if self.watch.get().is_none() {
            return queries.map(|_| None).collect();
        }
        let held = self.held();
        queries
            .map(|query| {
                let (cgroup, since) = query?;
                let watched = held.watched.get(held.followed.get(cgroup.as_os_str())?)?;
                watched.watch.sample_bytes?;
                let after = |at: Option<Instant>| at.is_some_and(|at| at > since);
                Some(after(held.lost_at) || after(watched.followed_at) || after(watched.sampled_at))
            })
            .collect()
    }

    /// Notified when the kernel saw a cap crossed: sample at once.
    pub(crate) fn sample_now(&self) -> Arc<Notify> {
        self.sample_now.clone()
    }

    /// A line crossed in the kernel. A sample marks its cgroup moved for
    /// the predictor. A cap or step line's usage is kept for a watched
    /// cgroup; a cap crossing (up or down) wakes the sampling loop, so the
    /// checks run within milliseconds instead of at the next tick.
    pub(crate) fn line(&self, line: &GrowthLine) {
        let mut held = self.held();
        let held = &mut *held;
        if let Some(watched) = held.watched.get_mut(&line.memcg_id) {
            let above = match (line.line, line.cap_bytes) {
                (Line::Sample, _) => {
                    watched.sampled_at = Some(Instant::now());
                    return;
                }
                (Line::AboveCap, _) => {
                    above_line(&mut held.crossings, line.memcg_id, line.usage_bytes);
                    true
                }
                (Line::BelowCap, _) => {
                    if let Some(c) = held.crossings.get_mut(&line.memcg_id) {
                        c.closed = true;
                    }
                    if let Some(watch) = self.watch.get() {
                        lower(
                            watched,
                            &mut held.raised,
                            &mut held.generation,
                            line.memcg_id,
                            watch.as_ref(),
                        );
                    }
                    false
                }
                (Line::Step, Some(cap)) => line.usage_bytes > cap,
                (Line::Step, None) => false,
            };
            watched.last = Some((line.usage_bytes, Instant::now(), above));
        }
        if matches!(line.line, Line::AboveCap | Line::BelowCap) {
            self.sample_now.notify_one();
        }
    }

    /// The tasks of `figures` were read (their working sets), the reads
    /// starting at `read_at`: a crossing of theirs the kernel reported
    /// before that and still holds (no below-cap line since) was judged by
    /// the read, which saw the memory over the cap, or page cache that the
    /// sampler does not count.
    ///
    /// Page cache: the kernel's line stays crossed, so it would say
    /// nothing more until the usage fell back below, and a working set
    /// that then grew past the cap would wait for the sampler's tick. So
    /// the kernel's line is raised above its usage by the room the read
    /// left below the cap (at least [`raise_floor`]): the next line comes
    /// by the time the working set can have reached the cap. When the last
    /// raise was less than [`RAISE_WINDOW`] ago and the working set did not
    /// come halfway up its margin (page cache streams in), the margin is
    /// doubled instead. The true cap
    /// goes back to the kernel when it says the usage fell below the
    /// raised line, or when a read finds the working set below the cap by
    /// more than the margin and the floor.
    pub(crate) fn judged(&self, figures: &FastMap<String, u64>, read_at: Instant) {
        let mut held = self.held();
        if held.crossings.is_empty() && held.raised.is_empty() {
            return;
        }
        let Some(watch) = self.watch.get() else {
            return;
        };
        let held = &mut *held;
        let now = Instant::now();
        held.raised
            .retain(|_, r| r.active || now.duration_since(r.at) < RAISE_WINDOW);
        for (key, &figure) in figures {
            let Some(&id) = held.ids.get(key.as_str()) else {
                continue;
            };
            let Some(watched) = held.watched.get_mut(&id) else {
                continue;
            };
            let raised = held.raised.get(&id).filter(|r| r.active).copied();
            let open = held
                .crossings
                .get(&id)
                .filter(|c| c.at <= read_at && !c.closed)
                .copied();
            if let Some(crossing) = open {
                held.crossings.remove(&id);
                let cap = raised.map(|r| r.cap).or(watched.watch.cap_bytes);
                if let Some(cap) = cap.filter(|&cap| figure <= cap) {
                    let room = (cap - figure).max(raise_floor(cap));
                    let margin = match held.raised.get(&id) {
                        // The working set came more than halfway up the
                        // last margin: it grows toward the cap, and the
                        // line follows it.
                        Some(r) if room.saturating_mul(2) <= r.margin => room,
                        Some(r) if now.duration_since(r.at) < RAISE_WINDOW => {
                            room.max(r.margin.saturating_mul(2))
                        }
                        _ => room,
                    };
                    held.generation += 1;
                    let line = crossing.usage.max(cap).saturating_add(margin);
                    watched.watch.cap_bytes = Some(line);
                    watched.watch.generation = held.generation;
                    watched.pushed_at = Some(now);
                    let raise = Raise {
                        cap,
                        margin,
                        at: now,
                        active: true,
                    };
                    held.raised.insert(id, raise);
                    watch.set(id, Some(watched.watch));
                }
            } else if let Some(r) = raised
                && figure
                    .saturating_add(r.margin)
                    .saturating_add(raise_floor(r.cap))
                    <= r.cap
            {
                if let Some(last) = watched.last.as_mut() {
                    // The read found it well below: quiet until the kernel
                    // says otherwise.
                    *last = (last.0, now, false);
                }
                lower(
                    watched,
                    &mut held.raised,
                    &mut held.generation,
                    id,
                    watch.as_ref(),
                );
            }
        }
    }

    /// The crossings no read judged and the kernel has closed (the cgroup
    /// went back below its cap first), by key, with the kernel's usage at
    /// each: taken, each is said once.
    pub(crate) fn take_unjudged(&self) -> HashMap<String, u64> {
        let mut held = self.held();
        if !held.crossings.values().any(|c| c.closed) {
            return HashMap::new();
        }
        let held = &mut *held;
        let closed: HashMap<u64, u64> = held
            .crossings
            .iter()
            .filter(|(_, c)| c.closed)
            .map(|(&id, c)| (id, c.usage))
            .collect();
        held.crossings.retain(|_, c| !c.closed);
        held.ids
            .iter()
            .filter_map(|(key, id)| closed.get(id).map(|&usage| (key.clone(), usage)))
            .collect()
    }

    /// `key`'s crossing that no read judged, open or closed, taken: its
    /// task ends, and this was the last chance to say it.
    pub(crate) fn take_crossing(&self, key: &str) -> Option<u64> {
        let mut held = self.held();
        let id = *held.ids.get(key)?;
        held.crossings.remove(&id).map(|c| c.usage)
    }

    /// Records were lost to a full ring buffer (the probe's counter grew):
    /// a cap crossing may be among them, so no cgroup counts as quiet for
    /// reads before now, and the sampling loop runs at once.
    pub(crate) fn records_lost(&self) {
        self.held().lost_at = Some(Instant::now());
        self.sample_now.notify_one();
    }

    /// The kernel's last reported usage of `key`'s cgroup.
    pub(crate) fn usage_of(&self, key: &str) -> Option<u64> {
        let held = self.held();
        let id = held.ids.get(key)?;
        held.watched.get(id)?.last.map(|(usage, _, _)| usage)
    }

    /// Whether the kernel holds `key`'s cap and has said nothing of its
    /// cgroup since `since` but that it is below the cap: its memory
    /// moved less than a growth step and crossed no cap meanwhile. Not
    /// quiet when the kernel got the cap after `since`, or records were
    /// lost after it.
    pub(crate) fn quiet_since(&self, key: &str, since: Instant) -> bool {
        if self.watch.get().is_none() {
            return false;
        }
        let held = self.held();
        if held.lost_at.is_some_and(|lost| lost > since) {
            return false;
        }
        let Some(watched) = held.ids.get(key).and_then(|id| held.watched.get(id)) else {
            return false;
        };
        if watched.pushed_at.is_some_and(|pushed| pushed > since) {
            return false;
        }
        match watched.last {
            None => true,
            Some((_, at, above)) => at <= since && !above,
        }
    }
}

/// Hands the kernel `id`'s true cap again when its line was raised (a new
/// generation: the kernel says at once if the usage is above it).
fn lower(
    watched: &mut Watched,
    raised: &mut HashMap<u64, Raise>,
    generation: &mut u64,
    id: u64,
    watch: &dyn KernelWatch,
) {
    let Some(raise) = raised.get_mut(&id).filter(|r| r.active) else {
        return;
    };
    raise.active = false;
    *generation += 1;
    watched.watch.cap_bytes = Some(raise.cap);
    watched.watch.generation = *generation;
    watched.pushed_at = Some(Instant::now());
    watch.set(id, Some(watched.watch));
}

/// An above-cap line of `id` at `usage`: a crossing to judge. One the
/// kernel closed that no read judged yet stays, with the larger usage.
fn above_line(crossings: &mut HashMap<u64, KernelCrossing>, id: u64, usage: u64) {
    let now = Instant::now();
    let crossing = crossings.entry(id).or_insert(KernelCrossing {
        usage,
        at: now,
        closed: false,
    });
    crossing.usage = crossing.usage.max(usage);
    crossing.closed = false;
}

impl Held {
    /// One key less watches `id`'s cap: the last one takes the cap back.
    fn unwatch(&mut self, id: u64, watch: &dyn KernelWatch) {
        let Some(watched) = self.watched.get_mut(&id) else {
            return;
        };
        watched.keys = watched.keys.saturating_sub(1);
        if watched.keys == 0 {
            self.generation += 1;
            watched.watch.cap_bytes = None;
            watched.watch.generation = self.generation;
            watched.last = None;
            watched.pushed_at = None;
            self.crossings.remove(&id);
            self.raised.remove(&id);
        }
        self.forget_if_unwatched(id, watch);
    }

    /// No more samples of `id`.
    fn stop_samples(&mut self, id: u64, watch: &dyn KernelWatch) {
        if let Some(watched) = self.watched.get_mut(&id) {
            watched.watch.sample_bytes = None;
            watched.followed_at = None;
            watched.sampled_at = None;
        }
        self.forget_if_unwatched(id, watch);
    }

    /// Hands the kernel what is left of `id`'s watch, or removes it when
    /// nothing is.
    fn forget_if_unwatched(&mut self, id: u64, watch: &dyn KernelWatch) {
        let Some(watched) = self.watched.get(&id) else {
            return;
        };
        if watched.keys == 0 && watched.watch.sample_bytes.is_none() {
            self.watched.remove(&id);
            watch.set(id, None);
        } else {
            watch.set(id, Some(watched.watch));
        }
    }
}

#[cfg(test)]
mod tests;
