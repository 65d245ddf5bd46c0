//! From predictions to events: `oom_imminent` when a cgroup's ETA falls
//! within its worker's horizon, said again only when the ETA moves
//! materially; `oom_averted` once it has stayed out for a hold time; and,
//! when the kill comes, how early it was said and how wrong the ETA was.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::time::Instant;

use super::predict::{Limit, LimitFields, LimitOwner, Prediction, Series, nearest};
use crate::model::{
    FastMap,
    event::{EventBody, EventKind, OomConstraint},
    spec::PredictSettings,
};

/// `oom_imminent` is said again when the ETA differs from what the last
/// one said (counted down since) by more than this share...
pub(crate) const RESAY_CHANGE: f64 = 0.3;
/// ...and by at least this much (near the end, a second is noise).
pub(crate) const RESAY_MIN: Duration = Duration::from_secs(2);
/// Out of the horizon (or not growing) this long after an `oom_imminent`:
/// `oom_averted`. Shorter dips are the same episode.
pub(crate) const AVERT_HOLD: Duration = Duration::from_secs(10);
/// A cgroup not read for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(120);
/// Cgroups followed at most (the oldest-read one goes first).
pub(crate) const MAX_CGROUPS: usize = 10_000;

/// A cgroup the predictor follows, and whose it is: shared between ticks
/// (a reading costs no copy of its path or names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub cgroup: Arc<Path>,
    pub worker: Arc<str>,
    pub task_id: Option<Arc<str>>,
}

/// One cgroup's figures, read by the caller.
#[derive(Clone, Debug)]
pub(crate) struct Reading {
    pub cgroup: Arc<Path>,
    pub worker: Arc<str>,
    pub task_id: Option<Arc<str>>,
    /// Usage minus what reclaim frees first (`cgroup::memory::unreclaimable`).
    pub unreclaimable: u64,
    /// Every limit above it: its own, memsw, its ancestors', the host's.
    pub limits: Vec<Limit>,
    /// Its `memory.high`, when below its own limit.
    pub high: Option<u64>,
}

/// What a predicted kill tells of the predictor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct KillReport {
    /// From the first `oom_imminent` to the kill.
    pub lead: Duration,
    /// The kill's time minus the time the last `oom_imminent` said,
    /// seconds (positive: later than said).
    pub eta_error_seconds: f64,
}

/// The last `oom_imminent` said of an episode.
#[derive(Clone, Copy, Debug)]
struct Said {
    first_at: Instant,
    /// When it said the limit would be reached.
    deadline: Instant,
}

/// One cgroup's hysteresis.
#[derive(Debug, Default)]
pub(crate) struct Imminence {
    said: Option<Said>,
    /// Out of the horizon since, while an episode is open.
    calm_since: Option<Instant>,
}

/// What [`Imminence::observe`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Say {
    Imminent,
    Averted,
}

impl Imminence {
    /// The prediction of this sample (`None`: no growth); what to say.
    pub(crate) fn observe(
        &mut self,
        prediction: Option<&Prediction>,
        horizon: Duration,
        now: Instant,
    ) -> Option<Say> {
        match prediction.filter(|p| p.eta <= horizon) {
            Some(p) => {
                self.calm_since = None;
                let deadline = now + p.eta;
                match &mut self.said {
                    None => {
                        self.said = Some(Said {
                            first_at: now,
                            deadline,
                        });
                        Some(Say::Imminent)
                    }
                    Some(said) => {
                        let expected = said.deadline.saturating_duration_since(now);
                        let moved = p.eta.abs_diff(expected);
                        let material = moved > RESAY_MIN
                            && moved.as_secs_f64() > RESAY_CHANGE * expected.as_secs_f64();
                        material.then(|| {
                            said.deadline = deadline;
                            Say::Imminent
                        })
                    }
                }
            }
            None => {
                self.said?;
                let calm = *self.calm_since.get_or_insert(now);
                (now.duration_since(calm) >= AVERT_HOLD).then(|| {
                    *self = Self::default();
                    Say::Averted
                })
            }
        }
    }

    /// The kill came: how it was predicted, if it was. Ends the episode.
    pub(crate) fn killed(&mut self, at: Instant) -> Option<KillReport> {
        let said = std::mem::take(self).said?;
        let error = if at >= said.deadline {
            at.duration_since(said.deadline).as_secs_f64()
        } else {
            -said.deadline.duration_since(at).as_secs_f64()
        };
        Some(KillReport {
            lead: at.duration_since(said.first_at),
            eta_error_seconds: error,
        })
    }

    /// Seconds left by the last `oom_imminent`, while an episode is open.
    pub(crate) fn eta(&self, now: Instant) -> Option<f64> {
        self.said
            .map(|s| s.deadline.saturating_duration_since(now).as_secs_f64())
    }
}

/// One followed cgroup.
#[derive(Debug, Default)]
struct Followed {
    series: Series,
    imminence: Imminence,
    read_at: Option<Instant>,
    /// The worker it belongs to (itself or one of its tasks).
    worker: String,
    /// The limit with the least headroom at the last reading.
    nearest: Option<Limit>,
}

/// Every followed cgroup's series and hysteresis.
#[derive(Debug, Default)]
pub(crate) struct Predictions {
    rules: PredictSettings,
    cgroups: FastMap<PathBuf, Followed>,
}

impl Predictions {
    pub(crate) fn new(rules: PredictSettings) -> Self {
        Self {
            rules,
            cgroups: FastMap::default(),
        }
    }

    /// This sample's readings; the events they call for.
    pub(crate) fn observe(&mut self, readings: &[Reading], now: Instant) -> Vec<EventBody> {
        let mut events = Vec::new();
        for r in readings {
            let rule = self.rules.rule(&r.worker);
            // Every tick reads every followed cgroup: one lookup and no
            // allocation for one already known whose nearest limit stayed
            // the same.
            let f = match self.cgroups.get_mut(&*r.cgroup) {
                Some(f) => f,
                None => {
                    if self.cgroups.len() >= MAX_CGROUPS {
                        forget_oldest(&mut self.cgroups);
                    }
                    self.cgroups.entry(r.cgroup.to_path_buf()).or_default()
                }
            };
            f.read_at = Some(now);
            let near = nearest(&r.limits);
            if f.nearest.as_ref() != near {
                f.nearest = near.cloned();
            }
            if *f.worker != *r.worker {
                f.worker = r.worker.to_string();
            }
            // With prediction off its limit is still shown, nothing judged.
            if !rule.enabled {
                continue;
            }
            f.series.push(now, r.unreclaimable);
            let prediction = f.series.predict(&r.limits, r.high);
            match f.imminence.observe(prediction.as_ref(), rule.horizon, now) {
                Some(Say::Imminent) => {
                    events.push(imminent(
                        r,
                        prediction.as_ref().expect("said on a prediction"),
                    ));
                }
                Some(Say::Averted) => events.push(averted(r, rule.horizon)),
                None => {}
            }
        }
        self.cgroups.retain(|_, f| {
            f.read_at
                .is_some_and(|t| now.duration_since(t) < FORGET_AFTER)
        });
        events
    }

    /// The kill of a process in `cgroup` at `at`: how early and how well it
    /// was predicted (`None`: it was not).
    pub(crate) fn killed(&mut self, cgroup: &Path, at: Instant) -> Option<KillReport> {
        self.cgroups.get_mut(cgroup)?.imminence.killed(at)
    }

    /// The ETA said for `cgroup`, while a kill is imminent.
    pub(crate) fn eta(&self, cgroup: &Path, now: Instant) -> Option<f64> {
        self.cgroups.get(cgroup)?.imminence.eta(now)
    }

    /// The limit nearest to `cgroup` at its last reading, as `/v1/status`
    /// shows it (empty for a cgroup not followed).
    pub(crate) fn nearest_limit(&self, cgroup: &Path) -> LimitFields {
        self.cgroups
            .get(cgroup)
            .and_then(|f| f.nearest.as_ref())
            .map(|l| LimitFields::of(l, cgroup))
            .unwrap_or_default()
    }

    /// Each worker's soonest ETA, over the cgroups whose kill is imminent.
    pub(crate) fn soonest_by_worker(&self, now: Instant) -> BTreeMap<String, f64> {
        let mut soonest: BTreeMap<String, f64> = BTreeMap::new();
        for f in self.cgroups.values() {
            if let Some(eta) = f.imminence.eta(now) {
                soonest
                    .entry(f.worker.clone())
                    .and_modify(|e| *e = e.min(eta))
                    .or_insert(eta);
            }
        }
        soonest
    }
}

fn forget_oldest(cgroups: &mut FastMap<PathBuf, Followed>) {
    let oldest = cgroups
        .iter()
        .min_by_key(|(_, f)| f.read_at)
        .map(|(path, _)| path.clone());
    if let Some(path) = oldest {
        cgroups.remove(&path);
    }
}

fn body(kind: EventKind, r: &Reading) -> EventBody {
    let mut body = EventBody::new(kind);
    body.worker = Some(r.worker.to_string());
    body.task_id = r.task_id.as_deref().map(str::to_owned);
    body.cgroup = Some(r.cgroup.display().to_string());
    body.rss_bytes = Some(r.unreclaimable);
    body
}

fn imminent(r: &Reading, p: &Prediction) -> EventBody {
    let mut body = body(EventKind::OomImminent, r);
    body.eta_seconds = Some((p.eta.as_secs_f64() * 10.0).round() / 10.0);
    body.growth_bytes_per_sec = Some(p.rate_bytes_per_second.round() as i64);
    body.limit_bytes = Some(p.limit.bytes);
    let (constraint, whose) = match &p.limit.owner {
        LimitOwner::Own => (OomConstraint::Cgroup, Some(r.cgroup.to_path_buf())),
        LimitOwner::Ancestor(path) => (OomConstraint::Cgroup, Some(path.clone())),
        LimitOwner::Host => (OomConstraint::Global, None),
    };
    body.constraint = Some(constraint);
    body.limit_cgroup = whose.map(|p| p.display().to_string());
    body.confidence = Some((p.confidence * 100.0).round() / 100.0);
    body.throttled = Some(p.throttled);
    body.reason = Some(format!(
        "unreclaimable memory grows {:.1} MiB/s{}: {} in {:.1} s",
        p.rate_bytes_per_second / f64::from(1 << 20),
        if p.throttled {
            " (throttled at memory.high)"
        } else {
            ""
        },
        match &p.limit.owner {
            LimitOwner::Own => "its own limit".to_string(),
            LimitOwner::Ancestor(path) => format!("the limit of {}", path.display()),
            LimitOwner::Host => "the host's memory".to_string(),
        },
        p.eta.as_secs_f64()
    ));
    body
}

fn averted(r: &Reading, horizon: Duration) -> EventBody {
    let mut body = body(EventKind::OomAverted, r);
    body.reason = Some(format!(
        "no limit within {} s for {} s: the growth stopped or slowed",
        horizon.as_secs(),
        AVERT_HOLD.as_secs()
    ));
    body
}

#[cfg(test)]
mod tests;
