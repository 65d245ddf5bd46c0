//! Decision instants as wall time.
//!
//! The watchdog decides on monotonic instants (`tokio::time::Instant`): a
//! worker turns unhealthy when `now - over_since >= unhealthy_after`. Events
//! carry wall time. Reading the wall clock when an event is stored would
//! stamp the pipeline's delay, not the decision, and two events decided 2 s
//! apart could show 1.9997 s. So every instant is converted through one
//! anchor (a monotonic and a wall reading taken together): intervals between
//! event times are exactly the intervals the policy measured.
//!
//! The anchor is taken again when the wall clock has moved more than
//! [`MAX_DRIFT`] away from it. NTP's slewing changes the rate of the
//! monotonic clock as much as the wall clock's, so the two part only when
//! the wall clock is stepped (`settimeofday`, a VM's clock set after boot):
//! then event times follow the host's clock again at once.

use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// How far the wall clock may move from the anchor before it is re-taken.
pub(crate) const MAX_DRIFT: chrono::TimeDelta = chrono::TimeDelta::milliseconds(10);

/// A monotonic instant and the wall time read with it.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    instant: Instant,
    wall: DateTime<Utc>,
}

impl Anchor {
    fn wall_of(&self, instant: Instant) -> DateTime<Utc> {
        let delta = if instant >= self.instant {
            chrono::TimeDelta::from_std(instant - self.instant)
        } else {
            chrono::TimeDelta::from_std(self.instant - instant).map(|d| -d)
        };
        self.wall + delta.unwrap_or_default()
    }
}

/// Converts instants to wall time through one anchor (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct WallClock {
    anchor: Mutex<Option<Anchor>>,
}

impl WallClock {
    /// The wall time of `instant`, with the clocks read now.
    pub(crate) fn wall_time(&self, instant: Instant) -> DateTime<Utc> {
        self.wall_time_with(instant, Instant::now(), Utc::now())
    }

    /// As [`WallClock::wall_time`], with the present readings given.
    pub(crate) fn wall_time_with(
        &self,
        instant: Instant,
        now: Instant,
        wall_now: DateTime<Utc>,
    ) -> DateTime<Utc> {
        let mut anchor = self.anchor.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = Anchor {
            instant: now,
            wall: wall_now,
        };
        let current = anchor.get_or_insert(fresh);
        if (current.wall_of(now) - wall_now).abs() > MAX_DRIFT {
            *current = fresh;
        }
        current.wall_of(instant)
    }
}

/// The process's one wall clock for decision instants.
pub(crate) fn wall_time(instant: Instant) -> DateTime<Utc> {
    static CLOCK: WallClock = WallClock {
        anchor: Mutex::new(None),
    };
    CLOCK.wall_time(instant)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn intervals_between_converted_instants_are_exact() {
        let clock = WallClock::default();
        let start = Instant::now();
        let wall = Utc::now();
        let decided = start + Duration::from_millis(123);
        let later = decided + Duration::from_secs(2);
        // The wall clock read a little off at a conversion (jitter under
        // MAX_DRIFT): the intervals still come out exact.
        let a = clock.wall_time_with(decided, start, wall);
        let b = clock.wall_time_with(
            later,
            later + Duration::from_millis(40),
            wall + chrono::TimeDelta::milliseconds(2_165),
        );
        assert_eq!((b - a).to_std().unwrap(), Duration::from_secs(2));
        assert_eq!(a, wall + chrono::TimeDelta::milliseconds(123));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_that_moved_is_followed() {
        let clock = WallClock::default();
        let start = Instant::now();
        let wall = Utc::now();
        clock.wall_time_with(start, start, wall);
        // One hour later, the wall clock was stepped 10 s forward.
        let later = start + Duration::from_secs(3600);
        let stepped = wall + chrono::TimeDelta::seconds(3610);
        assert_eq!(clock.wall_time_with(later, later, stepped), stepped);
        // Reading jitter alone does not move the anchor.
        let next = later + Duration::from_secs(1);
        let drifted = stepped + chrono::TimeDelta::milliseconds(1_004);
        assert_eq!(
            clock.wall_time_with(next, next, drifted),
            stepped + chrono::TimeDelta::seconds(1)
        );
    }
}
