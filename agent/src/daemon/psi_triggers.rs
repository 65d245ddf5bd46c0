//! PSI triggers on the workers that have a pressure rule: rather than wait
//! for the sampler's next tick, the kernel wakes the agent when a worker's
//! tasks have stalled on memory for the rule's share of a one-second
//! window, and the sampler reads at once. The rule itself still judges the
//! `some avg10` figure it reads, through the same hysteresis; the trigger
//! only says when to look. Arming one writes to the cgroup's
//! `memory.pressure`: where cgroupfs is read-only (the DaemonSet mounts it
//! so) or the cgroup is v1, the worker is read on the tick alone, and the
//! log says so once.

use std::{fs::File, path::PathBuf, sync::Arc};

use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::Notify,
    task::JoinSet,
};
use tracing::{info, warn};

use crate::{
    cgroup::pressure,
    model::spec::{MemorySource, WorkerSpec},
};

/// The window a trigger measures over. The kernel takes 0.5–10 s (and,
/// from unprivileged writers since Linux 6.5, only multiples of 2 s: the
/// agent writes as root or not at all).
const WINDOW_US: u64 = 1_000_000;

/// The stall within [`WINDOW_US`] that wakes the agent for a rule whose
/// limit is `limit_bp` basis points of the time (at least 1 µs).
fn stall_us(limit_bp: u32) -> u64 {
    (u64::from(limit_bp) * WINDOW_US / 10_000).max(1)
}

/// Arms a trigger for each cgroup worker with a pressure rule; those it
/// cannot arm are named in the log and read on the tick.
pub(crate) fn arm(workers: &[WorkerSpec]) -> Vec<(String, File)> {
    let mut armed = Vec::new();
    for worker in workers {
        let (MemorySource::Cgroup(cgroup), Some(rule)) = (&worker.source, &worker.pressure) else {
            continue;
        };
        match pressure::memory_trigger(cgroup, stall_us(rule.limit_bp), WINDOW_US) {
            Ok(file) => {
                info!(worker = %worker.name, stall_us = stall_us(rule.limit_bp), "PSI trigger armed: pressure is read when the kernel reports a stall");
                armed.push((worker.name.clone(), file));
            }
            Err(error) => info!(
                worker = %worker.name,
                cgroup = %PathBuf::from(cgroup).display(),
                %error,
                "PSI trigger unavailable: pressure is read every sample_interval"
            ),
        }
    }
    armed
}

/// Starts a task per armed trigger that asks for a sample at once each
/// time the kernel signals; the tasks end with the returned set.
pub(crate) fn spawn(armed: Vec<(String, File)>, sample_now: Arc<Notify>) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for (worker, file) in armed {
        let sample_now = sample_now.clone();
        set.spawn(async move {
            // SAFETY: the File owns its descriptor, open and the same until
            // the File (moved into the AsyncFd) is dropped with it.
            let fd = match unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) } {
                Ok(fd) => fd,
                Err(error) => {
                    warn!(%worker, %error, "cannot wait on the PSI trigger; pressure read on the tick");
                    return;
                }
            };
            loop {
                let mut ready = match fd.ready(Interest::PRIORITY).await {
                    Ok(ready) => ready,
                    Err(error) => {
                        warn!(%worker, %error, "PSI trigger wait failed; pressure read on the tick");
                        return;
                    }
                };
                if ready.ready().is_error() {
                    // The cgroup is gone: its trigger with it.
                    info!(%worker, "PSI trigger closed by the kernel; pressure read on the tick");
                    return;
                }
                ready.clear_ready();
                sample_now.notify_one();
            }
        });
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_the_rules_share_of_the_window() {
        assert_eq!(stall_us(2000), 200_000);
        assert_eq!(stall_us(100), 10_000);
        assert_eq!(stall_us(0), 1);
    }
}
