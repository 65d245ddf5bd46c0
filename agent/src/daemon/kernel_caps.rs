//! The soft caps the kernel holds (the probe's WATCHED map), keyed by
//! worker (`worker:<name>`) or task id, and the usage the kernel last
//! reported for each; a cap crossed in the kernel wakes the sampling loop.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
};

use tokio::sync::Notify;

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
    /// The kernel's usage of a watched cgroup at its last line, by id.
    usage: HashMap<u64, u64>,
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
        watch.set_cap(meta.ino(), Some(cap));
        self.held().ids.insert(key.to_string(), meta.ino());
    }

    /// Takes `key`'s cap back from the kernel.
    pub(crate) fn remove(&self, key: &str) {
        let id = {
            let mut held = self.held();
            let id = held.ids.remove(key);
            if let Some(id) = id {
                held.usage.remove(&id);
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
        {
            let mut held = self.held();
            if held.ids.values().any(|id| *id == line.memcg_id) {
                held.usage.insert(line.memcg_id, line.usage_bytes);
            }
        }
        if matches!(line.line, Line::AboveCap | Line::BelowCap) {
            self.sample_now.notify_one();
        }
    }

    /// The kernel's last reported usage of `key`'s cgroup.
    pub(crate) fn usage_of(&self, key: &str) -> Option<u64> {
        let held = self.held();
        let id = held.ids.get(key)?;
        held.usage.get(id).copied()
    }
}
