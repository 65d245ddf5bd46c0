//! What one workload of `bench predict` left behind: its cgroup's files as
//! a poller read them every [`POLL`], its memory pressure, the
//! workload's own allocation log, and the kill (the kernel's stamp); and
//! what a watcher said about it ([`Warnings`]). Times are Unix seconds
//! (f64) on the wall clock the agent's events are stamped in.

use std::time::Duration;

/// How often the trace poller reads each cgroup.
pub(crate) const POLL: Duration = Duration::from_millis(25);

/// One read of a cgroup's files (v1's names below; v2's are
/// `memory.current` and `memory.stat`'s `inactive_file`, `active_file`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Sample {
    pub(crate) t: f64,
    /// `memory.usage_in_bytes`.
    pub(crate) usage: u64,
    /// `memory.stat`'s `total_inactive_file` and `total_active_file`.
    pub(crate) inactive_file: u64,
    pub(crate) active_file: u64,
}

impl Sample {
    /// Usage less the inactive file cache: the kubelet's and Ray's
    /// "working set".
    pub(crate) fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }
}

/// One workload's run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trace {
    pub(crate) limit: u64,
    pub(crate) start: f64,
    pub(crate) end: f64,
    pub(crate) samples: Vec<Sample>,
    /// Memory pressure, `some avg10` (%), over the run: the cgroup's own
    /// `memory.pressure` on v2, the host's `/proc/pressure/memory` on v1.
    pub(crate) psi: Vec<(f64, f64)>,
    /// The workload's allocation log: (time, bytes held).
    pub(crate) held: Vec<(f64, u64)>,
    /// When the kernel OOM-killed it.
    pub(crate) kill: Option<f64>,
    /// Before this, nothing threatened the limit (the plateaus of
    /// `steps`): an alarm that started earlier is a false one.
    pub(crate) calm_until: Option<f64>,
}

/// What a watcher said about one run: each warning with the ETA it gave
/// (if it gives one), and its episodes, from the first warning to the
/// moment it took the warning back (`None`: still warning at the end).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Warnings {
    pub(crate) said: Vec<(f64, Option<f64>)>,
    pub(crate) episodes: Vec<(f64, Option<f64>)>,
}

impl Warnings {
    /// Builds the episodes from a watcher's verdict at each of its looks:
    /// `(time, Some(eta or none))` while it warns, `(time, None)` while not.
    pub(crate) fn from_looks(looks: impl IntoIterator<Item = (f64, Option<Option<f64>>)>) -> Self {
        let mut w = Warnings::default();
        let mut open = false;
        for (t, verdict) in looks {
            match verdict {
                Some(eta) => {
                    if !open {
                        w.episodes.push((t, None));
                        open = true;
                    }
                    w.said.push((t, eta));
                }
                None if open => {
                    if let Some(last) = w.episodes.last_mut() {
                        last.1 = Some(t);
                    }
                    open = false;
                }
                None => {}
            }
        }
        w
    }

    /// The episode still open at `kill`: the warning that came before it.
    pub(crate) fn open_at(&self, kill: f64) -> Option<(f64, Option<f64>)> {
        self.episodes
            .iter()
            .rev()
            .find(|(start, end)| *start <= kill && end.is_none_or(|e| e >= kill))
            .copied()
    }

    /// Episodes that ended before `kill` (or ever, without a kill): alarms
    /// taken back, i.e. false ones.
    pub(crate) fn taken_back(&self, kill: Option<f64>) -> usize {
        self.episodes
            .iter()
            .filter(|(start, end)| match kill {
                Some(kill) => end.is_some_and(|e| e < kill) || *start > kill,
                None => true,
            })
            .count()
    }

    /// The time left a reader believed at `at`: the last ETA said at or
    /// before it, in the episode open at `kill`, counted down.
    pub(crate) fn believed(&self, kill: f64, at: f64) -> Option<f64> {
        let (start, _) = self.open_at(kill)?;
        self.said
            .iter()
            .rev()
            .find(|(t, eta)| *t <= at && *t >= start && eta.is_some())
            .and_then(|(t, eta)| eta.map(|eta| eta - (at - t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_make_episodes_and_the_open_one_is_found() {
        let w = Warnings::from_looks([
            (1.0, None),
            (2.0, Some(Some(9.0))),
            (3.0, None),
            (5.0, Some(Some(6.0))),
            (6.0, Some(Some(4.0))),
        ]);
        assert_eq!(w.episodes, vec![(2.0, Some(3.0)), (5.0, None)]);
        assert_eq!(w.open_at(9.0), Some((5.0, None)));
        assert_eq!(w.taken_back(Some(9.0)), 1);
        assert_eq!(w.taken_back(None), 2);
        // At 7 the reader holds the ETA said at 6 (4 s), one second on.
        assert_eq!(w.believed(9.0, 7.0), Some(3.0));
        // Before the open episode there is nothing to believe.
        assert_eq!(w.believed(9.0, 4.0), None);
    }

    #[test]
    fn an_episode_taken_back_before_the_kill_warns_of_nothing() {
        let w = Warnings::from_looks([(2.0, Some(None)), (3.0, None)]);
        assert_eq!(w.open_at(10.0), None);
        assert_eq!(w.believed(10.0, 5.0), None);
    }
}
