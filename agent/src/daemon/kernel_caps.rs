//! The soft caps the kernel holds (the probe's WATCHED map), keyed by
//! worker (`worker:<name>`) or task id, and the usage the kernel last
//! reported for each; a cap crossed in the kernel wakes the sampling loop.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
};

use tokio::{sync::Notify, time::Instant};

use crate::probe::{GrowthLine, KernelWatch, Line};

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
    ids: HashMap<String, u64>,
    /// By id of a watched cgroup: how many keys watch it, and its last line.
    watched: HashMap<u64, Watched>,
    /// When records were last found lost to a full ring buffer: any of
    /// them may have been a line of a watched cgroup.
    lost_at: Option<Instant>,
}

#[derive(Default)]
struct Watched {
    keys: usize,
    /// The kernel's usage at its last line, when it came, and whether it
    /// left the cgroup above its cap.
    last: Option<(u64, Instant, bool)>,
    /// When its cap was last handed to the kernel: it says nothing of the
    /// time before.
    pushed_at: Option<Instant>,
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
        // Held before the kernel has the cap, so that no line of it can
        // come before its cgroup is known here.
        {
            let mut held = self.held();
            if let Some(old) = held.ids.insert(key.to_string(), meta.ino()) {
                held.unwatch(old);
            }
            let watched = held.watched.entry(meta.ino()).or_default();
            watched.keys += 1;
            watched.pushed_at = Some(Instant::now());
        }
        watch.set_cap(meta.ino(), Some(cap));
    }

    /// Takes `key`'s cap back from the kernel.
    pub(crate) fn remove(&self, key: &str) {
        let id = {
            let mut held = self.held();
            let id = held.ids.remove(key);
            if let Some(id) = id {
                held.unwatch(id);
            }
            id
        };
        if let (Some(watch), Some(id)) = (self.watch.get(), id) {
            watch.set_cap(id, None);
        }
    }

    /// Notified when the kernel saw a cap crossed: sample at once.
    pub(crate) fn sample_now(&self) -> Arc<Notify> {
        self.sample_now.clone()
    }

    /// A line crossed in the kernel: its usage is kept for a watched
    /// cgroup; a cap crossing (up or down) wakes the sampling loop, so the
    /// checks run within milliseconds instead of at the next tick.
    pub(crate) fn line(&self, line: &GrowthLine) {
        if let Some(watched) = self.held().watched.get_mut(&line.memcg_id) {
            let above = match (line.line, line.cap_bytes) {
                (Line::AboveCap, _) => true,
                (Line::BelowCap, _) => false,
                (Line::Step, Some(cap)) => line.usage_bytes > cap,
                (Line::Step, None) => false,
            };
            watched.last = Some((line.usage_bytes, Instant::now(), above));
        }
        if matches!(line.line, Line::AboveCap | Line::BelowCap) {
            self.sample_now.notify_one();
        }
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

impl Held {
    fn unwatch(&mut self, id: u64) {
        if let Some(watched) = self.watched.get_mut(&id) {
            watched.keys = watched.keys.saturating_sub(1);
            if watched.keys == 0 {
                self.watched.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;

    use super::*;

    struct NoMap;

    impl KernelWatch for NoMap {
        fn set_cap(&self, _: u64, _: Option<u64>) {}
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
}
