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

    /// The tasks of `keys` were read, the reads starting at `read_at`: a
    /// crossing of theirs the kernel reported before that and still holds
    /// (no below-cap line since) was judged by the read, which saw the
    /// memory over the cap, or page cache that the sampler does not count.
    pub(crate) fn judged<'a>(&self, keys: impl IntoIterator<Item = &'a str>, read_at: Instant) {
        let mut held = self.held();
        if held.crossings.is_empty() {
            return;
        }
        for key in keys {
            let Some(&id) = held.ids.get(key) else {
                continue;
            };
            if held
                .crossings
                .get(&id)
                .is_some_and(|c| c.at <= read_at && !c.closed)
            {
                held.crossings.remove(&id);
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
mod tests {
    use std::time::Duration;

    use chrono::Utc;

    use super::*;

    fn moved(caps: &KernelCaps, cgroup: &Path, since: Instant) -> Option<bool> {
        caps.moved_since_each([Some((cgroup, since))])
            .pop()
            .flatten()
    }

    struct NoMap;

    impl KernelWatch for NoMap {
        fn set(&self, _: u64, _: Option<Watch>) {}
    }

    /// The map as the kernel would hold it.
    #[derive(Default)]
    struct Map(Mutex<HashMap<u64, Watch>>);

    impl KernelWatch for Map {
        fn set(&self, id: u64, watch: Option<Watch>) {
            let mut map = self.0.lock().unwrap();
            match watch {
                Some(w) => map.insert(id, w),
                None => map.remove(&id),
            };
        }
    }

    impl Map {
        fn get(&self, id: u64) -> Option<Watch> {
            self.0.lock().unwrap().get(&id).copied()
        }
    }

    fn line(memcg_id: u64, line: Line, usage_bytes: u64) -> GrowthLine {
        GrowthLine {
            time: Utc::now(),
            memcg_id,
            line,
            usage_bytes,
            cap_bytes: Some(100),
        }
    }

    /// Quiet since a moment: the kernel holds the cap and sent no line
    /// after it, and its last line left the cgroup below the cap.
    #[tokio::test(start_paused = true)]
    async fn quiet_means_no_line_since_and_below_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let caps = KernelCaps::default();
        caps.push("t", dir.path(), 100);
        assert!(
            !caps.quiet_since("t", Instant::now()),
            "no probe: never quiet"
        );
        caps.attach(Arc::new(NoMap));
        caps.push("t", dir.path(), 100);
        let id = std::fs::metadata(dir.path()).unwrap().ino();
        let read = Instant::now();
        assert!(caps.quiet_since("t", read), "held, nothing said yet");
        assert!(!caps.quiet_since("other", read), "not held");
        tokio::time::advance(Duration::from_millis(5)).await;
        caps.line(&line(id, Line::Step, 50));
        assert!(!caps.quiet_since("t", read), "a step after the last read");
        assert!(caps.quiet_since("t", Instant::now()), "read again after it");
        caps.line(&line(id, Line::AboveCap, 120));
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(!caps.quiet_since("t", Instant::now()), "above its cap");
        caps.line(&line(id, Line::BelowCap, 90));
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(caps.quiet_since("t", Instant::now()));
        assert_eq!(caps.usage_of("t"), Some(90));
        caps.remove("t");
        assert!(!caps.quiet_since("t", Instant::now()), "taken back");
        assert_eq!(caps.usage_of("t"), None);
    }

    /// A read before the kernel got the cap, or before records were lost
    /// to a full ring buffer, proves nothing: the task is read again, and a
    /// loss wakes the sampling loop.
    #[tokio::test(start_paused = true)]
    async fn a_read_before_the_cap_was_pushed_or_records_were_lost_is_not_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let caps = KernelCaps::default();
        caps.attach(Arc::new(NoMap));
        let read = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        caps.push("t", dir.path(), 100);
        assert!(!caps.quiet_since("t", read), "read before the push");
        assert!(caps.quiet_since("t", Instant::now()));

        let woken = caps.sample_now();
        let read = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        caps.records_lost();
        assert!(!caps.quiet_since("t", read), "read before the loss");
        tokio::time::timeout(Duration::from_millis(1), woken.notified())
            .await
            .expect("a loss wakes the sampling loop");
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(caps.quiet_since("t", Instant::now()), "read after the loss");
    }

    /// The predictor follows a cgroup: the kernel gets its sample size
    /// beside any cap, and a sample after a read marks it moved; a cgroup
    /// it does not follow, or any before the probe runs, is unknown (the
    /// predictor reads it). A cap taken back leaves the samples, and the
    /// last of both removes the entry.
    #[tokio::test(start_paused = true)]
    async fn a_followed_cgroup_moved_when_a_sample_came_after_the_read() {
        let dir = tempfile::tempdir().unwrap();
        let cgroup = dir.path();
        let id = std::fs::metadata(cgroup).unwrap().ino();
        let caps = KernelCaps::default();
        assert!(!caps.follow(cgroup, 1 << 20), "no probe yet");
        assert_eq!(moved(&caps, cgroup, Instant::now()), None);
        let map = Arc::new(Map::default());
        caps.attach(map.clone());
        assert!(!caps.follow(&dir.path().join("gone"), 1 << 20));

        assert!(caps.follow(cgroup, 1 << 20));
        let held = map.get(id).expect("in the map");
        assert_eq!((held.cap_bytes, held.sample_bytes), (None, Some(1 << 20)));
        let before = Instant::now() - Duration::from_millis(1);
        assert_eq!(moved(&caps, cgroup, before), Some(true), "followed after");
        tokio::time::advance(Duration::from_millis(5)).await;
        let read = Instant::now();
        assert_eq!(moved(&caps, cgroup, read), Some(false));
        assert_eq!(moved(&caps, &dir.path().join("other"), read), None);

        // A cap on the same cgroup: one entry with both; the cap's lines
        // do not count as samples, and a sample is no cap line.
        caps.push("t", cgroup, 100);
        let held = map.get(id).unwrap();
        assert_eq!(
            (held.cap_bytes, held.sample_bytes),
            (Some(100), Some(1 << 20))
        );
        let generation = held.generation;
        tokio::time::advance(Duration::from_millis(5)).await;
        caps.line(&line(id, Line::Step, 50));
        assert_eq!(moved(&caps, cgroup, read), Some(false), "a step");
        let quiet = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        caps.line(&GrowthLine {
            cap_bytes: None,
            ..line(id, Line::Sample, 70)
        });
        assert_eq!(moved(&caps, cgroup, read), Some(true), "a sample");
        assert!(caps.quiet_since("t", quiet), "a sample moves no cap line");
        assert_eq!(caps.usage_of("t"), Some(50));
        let read = Instant::now();
        assert_eq!(moved(&caps, cgroup, read), Some(false));

        // The same sample size again writes nothing; another one does, and
        // keeps the cap's generation (the kernel does not re-arm its cap).
        assert!(caps.follow(cgroup, 1 << 20));
        assert_eq!(moved(&caps, cgroup, read), Some(false));
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(caps.follow(cgroup, 4 << 20));
        let held = map.get(id).unwrap();
        assert_eq!(
            (held.generation, held.sample_bytes),
            (generation, Some(4 << 20))
        );
        assert_eq!(moved(&caps, cgroup, read), Some(true), "new size");

        // Lost records: every followed cgroup may have moved.
        tokio::time::advance(Duration::from_millis(5)).await;
        let read = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        caps.records_lost();
        assert_eq!(moved(&caps, cgroup, read), Some(true), "records lost");

        // The cap goes, the samples stay; then they go too.
        caps.remove("t");
        let held = map.get(id).expect("still followed");
        assert_eq!((held.cap_bytes, held.sample_bytes), (None, Some(4 << 20)));
        assert!(held.generation > generation, "the kernel drops the cap");
        caps.unfollow(cgroup);
        assert_eq!(map.get(id), None);
        assert_eq!(moved(&caps, cgroup, read), None);

        // Removed: the path stands for that id no more.
        assert!(caps.follow(cgroup, 1 << 20));
        caps.cgroup_removed(id + 1);
        assert!(map.get(id).is_some(), "another cgroup");
        caps.cgroup_removed(id);
        assert_eq!(map.get(id), None);
        assert_eq!(moved(&caps, cgroup, read), None);

        // Two keys on one cgroup: the cap stays until the last goes.
        caps.push("a", cgroup, 100);
        caps.push("b", cgroup, 200);
        caps.push("b", cgroup, 200);
        caps.remove("a");
        assert_eq!(map.get(id).unwrap().cap_bytes, Some(200));
        caps.remove("b");
        assert_eq!(map.get(id), None);
    }
}
