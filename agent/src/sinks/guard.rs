//! The cluster guard: a sink that takes capacity away (retires a Dask
//! worker, drains a Slurm node) never leaves the cluster with fewer members
//! than it needs (dask/distributed#5999: retiring every paused worker
//! deadlocks the cluster; draining every node leaves a partition with
//! nothing to run on).
//!
//! One vocabulary for every such sink: `min_remaining` members, and
//! `min_remaining_fraction` of the members the scheduler lists, must stay.
//! The figures come from the scheduler's own view, which every host's agent
//! shares: members already on their way out, for any reason and by anyone
//! (retiring, draining, drained, down), count as gone. Pure: it is told the
//! view and what one action would take, and answers whether it may go ahead.

use super::config::{InvalidKey, SinkTable};

/// Members that must stay, by default.
pub(crate) const DEFAULT_MIN_REMAINING: usize = 1;
/// Fraction of the listed members that must stay, by default.
pub(crate) const DEFAULT_MIN_REMAINING_FRACTION: f64 = 0.5;

/// Limits checked before an action that takes capacity away.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Guard {
    /// Members that must remain afterwards.
    pub min_remaining: usize,
    /// Fraction of the listed members that must remain afterwards.
    pub min_remaining_fraction: f64,
}

impl Default for Guard {
    fn default() -> Self {
        Self {
            min_remaining: DEFAULT_MIN_REMAINING,
            min_remaining_fraction: DEFAULT_MIN_REMAINING_FRACTION,
        }
    }
}

/// The scheduler's view of the members an action would take from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Capacity {
    /// Every member the scheduler lists (for Slurm: of the node's partitions).
    pub listed: usize,
    /// Those already on their way out, for any reason.
    pub leaving: usize,
    /// Of the rest, those running work (a paused Dask worker runs none).
    pub running: usize,
}

/// Why an action was refused; its `Display` is the event's reason.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "cluster guard: taking {taking} would leave {remaining} of {listed} ({running_left} running; \
     min_remaining = {min_remaining}, min_remaining_fraction = {min_remaining_fraction})"
)]
pub(crate) struct Blocked {
    pub taking: usize,
    pub remaining: usize,
    pub running_left: usize,
    pub listed: usize,
    pub min_remaining: usize,
    pub min_remaining_fraction: f64,
}

impl Guard {
    /// The guard of a sink table, from its `min_remaining` and
    /// `min_remaining_fraction` keys (each sink's own struct declares them,
    /// with the Dask sink's older names `min_workers`, `min_fraction` as
    /// aliases).
    pub(crate) fn from_keys(
        table: &SinkTable,
        min_remaining: Option<usize>,
        min_remaining_fraction: Option<f64>,
    ) -> Result<Self, InvalidKey> {
        let fraction = min_remaining_fraction.unwrap_or(DEFAULT_MIN_REMAINING_FRACTION);
        if !(0.0..=1.0).contains(&fraction) {
            return Err(table.invalid(
                "min_remaining_fraction",
                format!("must be between 0 and 1, got {fraction}"),
            ));
        }
        Ok(Self {
            min_remaining: min_remaining.unwrap_or(DEFAULT_MIN_REMAINING),
            min_remaining_fraction: fraction,
        })
    }

    /// The fewest members that must stay of `listed`.
    pub(crate) fn floor(&self, listed: usize) -> usize {
        let fraction = (self.min_remaining_fraction * listed as f64).ceil() as usize;
        self.min_remaining.max(fraction)
    }

    /// May `taking` more members go, `running_taking` of them running? No
    /// action may leave fewer members than the floor, nor take a running
    /// member when fewer running members than the floor would be left
    /// (taking a paused one costs no running capacity).
    pub(crate) fn check(
        &self,
        view: &Capacity,
        taking: usize,
        running_taking: usize,
    ) -> Result<(), Blocked> {
        let floor = self.floor(view.listed);
        let remaining = view.listed.saturating_sub(view.leaving + taking);
        let running_left = view.running.saturating_sub(running_taking);
        let blocked = remaining < floor || (running_taking > 0 && running_left < floor);
        if blocked {
            return Err(Blocked {
                taking,
                remaining,
                running_left,
                listed: view.listed,
                min_remaining: self.min_remaining,
                min_remaining_fraction: self.min_remaining_fraction,
            });
        }
        Ok(())
    }

    /// Whether the view is already below the floor (concurrent actions
    /// crossed it): the check after acting.
    pub(crate) fn crossed(&self, view: &Capacity) -> bool {
        view.listed.saturating_sub(view.leaving) < self.floor(view.listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(listed: usize, leaving: usize, running: usize) -> Capacity {
        Capacity {
            listed,
            leaving,
            running,
        }
    }

    #[test]
    fn never_takes_the_last_members() {
        let g = Guard {
            min_remaining: 1,
            min_remaining_fraction: 0.0,
        };
        assert!(g.check(&view(2, 0, 2), 1, 1).is_ok());
        let e = g.check(&view(1, 0, 1), 1, 1).unwrap_err();
        assert_eq!((e.remaining, e.listed), (0, 1));
        assert!(e.to_string().contains("would leave 0 of 1"), "{e}");
        // A member on its way out, by anyone, counts as gone.
        assert!(g.check(&view(2, 1, 1), 1, 1).is_err());
        assert!(
            g.check(&view(0, 0, 0), 0, 0).is_err(),
            "an empty cluster has nothing to spare"
        );
    }

    #[test]
    fn keeps_a_fraction_of_the_cluster() {
        let g = Guard::default();
        assert!(g.check(&view(4, 0, 4), 2, 2).is_ok());
        assert!(g.check(&view(4, 0, 4), 3, 3).is_err());
        assert!(g.check(&view(2, 0, 2), 1, 1).is_ok());
        assert!(g.check(&view(3, 0, 3), 2, 2).is_err());
        assert_eq!(g.floor(3), 2, "the fraction rounds up");
    }

    #[test]
    fn a_paused_member_may_go_when_running_capacity_is_short() {
        let g = Guard::default();
        // 4 workers, 3 paused: taking the running one is refused, taking a
        // paused one is not (the cluster is rolled back one worker at a time).
        let all_but_one_paused = view(4, 0, 1);
        assert!(g.check(&all_but_one_paused, 1, 1).is_err());
        assert!(g.check(&all_but_one_paused, 1, 0).is_ok());
        // Still never below the floor in members.
        assert!(g.check(&view(4, 2, 0), 1, 0).is_err());
    }

    #[test]
    fn concurrent_actions_that_crossed_the_floor_are_seen() {
        let g = Guard::default();
        assert!(!g.crossed(&view(2, 1, 1)));
        assert!(g.crossed(&view(2, 2, 0)));
    }
}
