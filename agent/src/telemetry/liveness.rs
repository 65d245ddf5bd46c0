//! Whether the agent's loops make progress. Each long-running loop holds a
//! [`Beat`] and beats at every iteration, and at least every [`IDLE_BEAT`]
//! while it waits; one that has not beaten for [`STALL_PERIODS`] of its
//! period (and at least [`MIN_STALL`]) is stalled: `/live` fails naming it,
//! so Kubernetes or systemd restarts an agent that looks alive but no
//! longer watches or ships anything (the "appearing online" failure; a
//! process answering HTTP proves nothing else). Iterations count, not
//! successes: a sink retrying a receiver that is down is making progress.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

/// How often a waiting loop beats anyway.
pub(crate) const IDLE_BEAT: Duration = Duration::from_secs(5);
/// A loop silent for this many of its periods is stalled…
pub(crate) const STALL_PERIODS: u32 = 6;
/// …and never sooner than this.
pub(crate) const MIN_STALL: Duration = Duration::from_secs(60);

struct Loop {
    /// Milliseconds since [`Liveness`]'s start at the last beat.
    last_ms: AtomicU64,
    stall_after: Duration,
}

/// Every loop's last beat.
#[derive(Clone)]
pub(crate) struct Liveness {
    start: Instant,
    loops: Arc<Mutex<BTreeMap<String, Arc<Loop>>>>,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            loops: Arc::default(),
        }
    }
}

/// One loop's handle: cheap to beat (an atomic store).
#[derive(Clone)]
pub(crate) struct Beat {
    start: Instant,
    state: Arc<Loop>,
}

impl Beat {
    pub(crate) fn beat(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.state.last_ms.store(ms, Ordering::Relaxed);
    }
}

impl Liveness {
    /// Registers the loop `name` that iterates at least every `period`
    /// (its tick, or [`IDLE_BEAT`] while it waits); it counts as having
    /// beaten now.
    pub(crate) fn register(&self, name: &str, period: Duration) -> Beat {
        let stall_after = (period.max(IDLE_BEAT) * STALL_PERIODS).max(MIN_STALL);
        let state = Arc::new(Loop {
            last_ms: AtomicU64::new(self.start.elapsed().as_millis() as u64),
            stall_after,
        });
        self.lock().insert(name.to_string(), Arc::clone(&state));
        Beat {
            start: self.start,
            state,
        }
    }

    /// The loops stalled now, with how long each has been silent.
    pub(crate) fn stalled(&self) -> Vec<(String, Duration)> {
        let now_ms = self.start.elapsed().as_millis() as u64;
        self.lock()
            .iter()
            .filter_map(|(name, l)| {
                let silent =
                    Duration::from_millis(now_ms.saturating_sub(l.last_ms.load(Ordering::Relaxed)));
                (silent >= l.stall_after).then(|| (name.clone(), silent))
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Loop>>> {
        self.loops.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_loop_silent_for_several_periods_is_stalled_until_it_beats() {
        let liveness = Liveness::default();
        let sampler = liveness.register("sampler", Duration::from_secs(1));
        let sink = liveness.register("sink webhook-1", Duration::from_secs(70));
        tokio::time::advance(MIN_STALL - Duration::from_secs(1)).await;
        assert!(liveness.stalled().is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        let stalled = liveness.stalled();
        assert_eq!(stalled.len(), 1, "{stalled:?}");
        assert_eq!(stalled[0].0, "sampler");
        sampler.beat();
        assert!(liveness.stalled().is_empty(), "progress again");
        // A loop with a long period gets as many of its periods.
        tokio::time::advance(Duration::from_secs(70) * STALL_PERIODS).await;
        assert!(
            liveness
                .stalled()
                .iter()
                .any(|(n, _)| n == "sink webhook-1")
        );
        sink.beat();
        sampler.beat();
        assert!(liveness.stalled().is_empty());
    }
}
