//! A watcher's figures over the runs of one cell: lead time before each
//! kill, the ETA a reader believed 2, 5 and 10 s before it, recall, and
//! the alarms taken back (false alarms) per hour of workload.

use memwatch_test_support::stats::quantile;

use super::trace::{Trace, Warnings};

/// The true times left at which the ETA's error is measured.
pub(crate) const LEFT: [f64; 3] = [2.0, 5.0, 10.0];
/// A kill counts as warned of (recall) this long ahead.
pub(crate) const RECALL_S: f64 = 5.0;

#[derive(Clone, Debug, Default)]
pub(crate) struct Score {
    pub(crate) runs: usize,
    pub(crate) kills: usize,
    /// Kill time less the start of the warning open at it, per kill warned.
    pub(crate) leads: Vec<f64>,
    /// Kills warned at least [`RECALL_S`] ahead.
    pub(crate) recalled: usize,
    /// Per [`LEFT`]: |believed − left| / left, per kill with a belief then.
    pub(crate) errors: [Vec<f64>; 3],
    /// Alarms taken back before a kill, or on a run that was not killed.
    pub(crate) false_alarms: usize,
    /// Hours of workload watched.
    pub(crate) hours: f64,
}

impl Score {
    /// Adds one run: its trace and what the watcher said of it.
    pub(crate) fn add(&mut self, trace: &Trace, said: &Warnings) {
        self.runs += 1;
        self.hours += (trace.kill.unwrap_or(trace.end) - trace.start).max(0.0) / 3600.0;
        self.false_alarms += said.taken_back(trace.kill);
        if let Some(calm) = trace.calm_until {
            // Alarms raised on a plateau and still open at the kill.
            self.false_alarms += said
                .episodes
                .iter()
                .filter(|(start, end)| {
                    *start < calm && trace.kill.is_some_and(|k| end.is_none_or(|e| e >= k))
                })
                .count();
        }
        let Some(kill) = trace.kill else {
            return;
        };
        self.kills += 1;
        // An alarm raised on a plateau is counted false above, and gives
        // the kill no lead: the warning that counts came after the calm.
        let warned = said
            .open_at(kill)
            .filter(|(start, _)| trace.calm_until.is_none_or(|calm| *start >= calm));
        if let Some((start, _)) = warned {
            let lead = kill - start;
            self.leads.push(lead);
            self.recalled += usize::from(lead >= RECALL_S);
        }
        for (errors, left) in self.errors.iter_mut().zip(LEFT) {
            if let Some(believed) = said.believed(kill, kill - left) {
                errors.push((believed - left).abs() / left);
            }
        }
    }

    /// The lead's quantile `q` (NaN without a warned kill).
    pub(crate) fn lead(&self, q: f64) -> f64 {
        quantile(&mut self.leads.clone(), q)
    }

    /// The 90th percentile of the relative ETA error at `LEFT[i]` (NaN
    /// without one), and how many kills it is over.
    pub(crate) fn error_p90(&self, i: usize) -> (f64, usize) {
        (
            quantile(&mut self.errors[i].clone(), 0.9),
            self.errors[i].len(),
        )
    }

    pub(crate) fn false_per_hour(&self) -> f64 {
        if self.hours > 0.0 {
            self.false_alarms as f64 / self.hours
        } else {
            f64::NAN
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_warned_early_counts_its_lead_error_and_recall() {
        let trace = Trace {
            start: 0.0,
            end: 40.0,
            kill: Some(30.0),
            ..Trace::default()
        };
        // Warned at 10 with an ETA of 22 s (2 s late), taken back once at 5.
        let said = Warnings::from_looks([
            (2.0, Some(Some(50.0))),
            (5.0, None),
            (10.0, Some(Some(22.0))),
        ]);
        let mut score = Score::default();
        score.add(&trace, &said);
        assert_eq!((score.kills, score.recalled, score.false_alarms), (1, 1, 1));
        assert_eq!(score.leads, vec![20.0]);
        // At kill − 5 (25) the reader believes 22 − 15 = 7: 40 % off.
        let (p90, n) = score.error_p90(1);
        assert!((p90 - 0.4).abs() < 1e-9 && n == 1, "{p90}");
    }

    #[test]
    fn an_alarm_raised_on_a_plateau_and_open_at_the_kill_is_false_and_no_lead() {
        // Steps: calm until 40, killed at 45; the alarm from 20 never closed.
        let trace = Trace {
            start: 0.0,
            end: 45.0,
            kill: Some(45.0),
            calm_until: Some(40.0),
            ..Trace::default()
        };
        let said = Warnings::from_looks([(10.0, None), (20.0, Some(Some(30.0)))]);
        let mut score = Score::default();
        score.add(&trace, &said);
        assert_eq!((score.kills, score.recalled, score.false_alarms), (1, 0, 1));
        assert!(score.leads.is_empty(), "{:?}", score.leads);
    }

    #[test]
    fn every_alarm_on_a_survivor_is_false() {
        let trace = Trace {
            start: 0.0,
            end: 1800.0,
            ..Trace::default()
        };
        let said = Warnings::from_looks([(2.0, Some(None)), (3.0, None), (9.0, Some(None))]);
        let mut score = Score::default();
        score.add(&trace, &said);
        assert_eq!(score.false_alarms, 2);
        assert!((score.false_per_hour() - 4.0).abs() < 1e-9);
        assert!(score.lead(0.5).is_nan());
    }
}
