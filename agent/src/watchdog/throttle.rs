//! When a worker starts being throttled at `memory.high`: the kernel's
//! `high` counter (v2 `memory.events`) grows after having been still.

use std::time::Duration;

use tokio::time::Instant;

/// `high` still this long after a `memory_high_throttled` re-arms it.
pub(crate) const REARM_AFTER: Duration = Duration::from_secs(60);

/// One worker's `high` counter over the samples.
#[derive(Debug, Default)]
pub(crate) struct HighThrottle {
    /// The last reading, and when the counter last moved (or was first read).
    last: Option<(u64, Instant)>,
    /// An increase now is a start of throttling, said once.
    armed: bool,
    /// A `memory_high_throttled` was said; re-arming then needs
    /// [`REARM_AFTER`] of stillness, not one sample.
    said: bool,
}

impl HighThrottle {
    /// A reading of `high`; `Some(increase)` when this is the start of a
    /// throttling episode: the counter grew after having been still for
    /// at least one sample (and, after an episode was said, for
    /// [`REARM_AFTER`]).
    pub(crate) fn observe(&mut self, high: u64, now: Instant) -> Option<u64> {
        let Some((last, moved_at)) = self.last else {
            // First reading: nothing known of its past yet.
            self.last = Some((high, now));
            return None;
        };
        if high < last {
            // A new cgroup under the old name: start over.
            *self = Self::default();
            self.last = Some((high, now));
            return None;
        }
        if high == last {
            if !self.said || now.duration_since(moved_at) >= REARM_AFTER {
                self.armed = true;
            }
            return None;
        }
        self.last = Some((high, now));
        if std::mem::take(&mut self.armed) {
            self.said = true;
            return Some(high - last);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn said_once_per_episode_and_re_armed_by_a_minute_of_stillness() {
        let mut t = HighThrottle::default();
        let tick = Duration::from_secs(10);
        let start = Instant::now();
        let mut at = start;
        let mut step = |t: &mut HighThrottle, high| {
            at += tick;
            t.observe(high, at)
        };
        assert_eq!(t.observe(5, start), None, "first reading: a baseline");
        assert_eq!(step(&mut t, 9), None, "moving since before we looked");
        assert_eq!(step(&mut t, 9), None, "still: armed");
        assert_eq!(step(&mut t, 12), Some(3), "starts being throttled");
        for high in [20, 30, 30, 31, 40] {
            assert_eq!(step(&mut t, high), None, "the same episode");
        }
        // Still for less than a minute, then moving again: same episode.
        for _ in 0..4 {
            assert_eq!(step(&mut t, 40), None);
        }
        assert_eq!(step(&mut t, 41), None);
        // Still for a minute: re-armed.
        for _ in 0..6 {
            assert_eq!(step(&mut t, 41), None);
        }
        assert_eq!(step(&mut t, 50), Some(9), "a new episode");
        // The counter went down: a new cgroup, a fresh start.
        assert_eq!(step(&mut t, 2), None);
        assert_eq!(step(&mut t, 2), None);
        assert_eq!(step(&mut t, 4), Some(2));
    }
}
