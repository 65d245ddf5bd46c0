//! The cluster guard: a scheduler sink never takes away the workers a
//! cluster needs to keep running (dask/distributed#5999: retiring every
//! paused worker deadlocks the cluster).
//!
//! Pure: it is told how many workers the scheduler lists and how many would
//! leave, and answers whether the retirement may go ahead.

/// Limits checked before a retirement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Guard {
    /// Workers that must remain in the cluster afterwards.
    pub min_workers: usize,
    /// Fraction of the listed workers that must remain afterwards.
    pub min_fraction: f64,
}

/// Why a retirement was refused; its `Display` is the event's reason.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "cluster guard: retiring would leave {remaining} of {listed} workers \
     (min_workers = {min_workers}, min_fraction = {min_fraction})"
)]
pub(crate) struct Blocked {
    pub remaining: usize,
    pub listed: usize,
    pub min_workers: usize,
    pub min_fraction: f64,
}

impl Guard {
    /// `listed`: workers the scheduler lists now; `leaving`: those this
    /// retirement and retirements still under way would take away.
    pub(crate) fn check(&self, listed: usize, leaving: usize) -> Result<(), Blocked> {
        let remaining = listed.saturating_sub(leaving);
        let blocked =
            remaining < self.min_workers || (remaining as f64) < self.min_fraction * listed as f64;
        if blocked {
            return Err(Blocked {
                remaining,
                listed,
                min_workers: self.min_workers,
                min_fraction: self.min_fraction,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_takes_the_last_workers() {
        let g = Guard {
            min_workers: 1,
            min_fraction: 0.0,
        };
        assert!(g.check(2, 1).is_ok());
        let e = g.check(1, 1).unwrap_err();
        assert_eq!((e.remaining, e.listed), (0, 1));
        assert!(e.to_string().contains("leave 0 of 1 workers"), "{e}");
        // A retirement under way counts as leaving.
        assert!(g.check(2, 2).is_err());
        assert!(
            g.check(0, 0).is_err(),
            "an empty cluster has nothing to spare"
        );
    }

    #[test]
    fn keeps_a_fraction_of_the_cluster() {
        let g = Guard {
            min_workers: 1,
            min_fraction: 0.5,
        };
        assert!(g.check(4, 2).is_ok());
        assert!(g.check(4, 3).is_err());
        assert!(g.check(2, 1).is_ok());
        assert!(g.check(3, 2).is_err());
    }
}
