//! One worker's health over time: the Scoot check at task start, the Dask
//! "stuck above the cap with no task growing" check, hysteresis, reset.

use serde::Serialize;
use tokio::time::Instant;

use crate::model::{
    health::Health,
    spec::{PressureRule, Settings, WorkerSpec, basis_points},
};

/// Why a worker is unhealthy (kept across restarts: its serde form is
/// part of the state directory's contract).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Cause {
    /// At a task start, memory not owned by running tasks was over the cap
    /// (leaked or leftover processes).
    Residual {
        residual: u64,
        memory: u64,
        cap: u64,
    },
    /// Above the cap for `unhealthy_after` with no task growing.
    Unmanaged { memory: u64, cap: u64, secs: u64 },
    /// PSI `some avg10` above `pressure_limit` for `pressure_after`
    /// (shares in basis points, 1/10000).
    Pressure {
        some_avg10_bp: u32,
        limit_bp: u32,
        secs: u64,
    },
}

impl Cause {
    pub(crate) fn reason(&self) -> String {
        match self {
            Self::Residual {
                residual,
                memory,
                cap,
            } => format!(
                "residual memory {} (worker {} minus its running tasks) is above the soft cap {} at task start",
                bytes(*residual),
                bytes(*memory),
                bytes(*cap)
            ),
            Self::Unmanaged { memory, cap, secs } => format!(
                "unmanaged memory: {} above the soft cap {} for {secs}s with no task growing",
                bytes(*memory),
                bytes(*cap)
            ),
            Self::Pressure {
                some_avg10_bp,
                limit_bp,
                secs,
            } => format!(
                "memory pressure: some tasks stalled on memory {} of the last 10 s \
                 (PSI some avg10), above the limit {}, for {secs}s",
                percent(*some_avg10_bp),
                percent(*limit_bp)
            ),
        }
    }
}

/// Basis points as a percentage: `12.50%`.
fn percent(bp: u32) -> String {
    format!("{:.2}%", f64::from(bp) / 100.0)
}

/// A transition the caller turns into an event.
#[derive(Debug, PartialEq)]
pub(crate) enum Transition {
    Unhealthy(Cause),
    Recovered {
        reason: String,
    },
    /// The worker's memory just went over its soft cap.
    CapExceeded {
        memory: u64,
        cap: u64,
    },
}

#[derive(Debug)]
pub(crate) struct WorkerState {
    pub spec: WorkerSpec,
    health: Health,
    cause: Option<Cause>,
    /// Degraded/unhealthy detail for humans.
    note: Option<String>,
    memory: Option<u64>,
    residual: Option<u64>,
    /// Above the cap (not clearly below) since.
    over_since: Option<Instant>,
    /// While unhealthy: clearly below the cap since.
    below_since: Option<Instant>,
    /// Above the cap since the last `soft_cap_exceeded` (re-armed when clearly below).
    over_cap: bool,
    /// The pressure rule: above the limit (not clearly below) since.
    pressure_over_since: Option<Instant>,
    /// While healthy or degraded: the pressure rule's countdown (the
    /// worker is degraded while it is set).
    pressure_note: Option<String>,
    /// The kernel's memory.high throttling, for `memory_high_throttled`.
    pub(crate) throttle: super::throttle::HighThrottle,
}

/// A worker as shown on `/health` and `/v1/status`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub(crate) struct WorkerView {
    pub name: String,
    pub status: Health,
    pub reasons: Vec<String>,
    /// The worker's memory cgroup, when it has one (`memwatch exec` puts
    /// its tasks under it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residual_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_cap_bytes: Option<u64>,
    pub running_tasks: usize,
    /// The kernel's own usage of the worker's cgroup at its last reported
    /// line (growth step or cap crossing), when the kernel follows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_usage_bytes: Option<u64>,
    /// The limit nearest to its cgroup (least headroom), whose it is.
    #[serde(flatten)]
    pub limit: crate::watchdog::predict::LimitFields,
}

impl WorkerState {
    pub(crate) fn new(spec: WorkerSpec) -> Self {
        Self {
            spec,
            health: Health::Healthy,
            cause: None,
            note: None,
            memory: None,
            residual: None,
            over_since: None,
            below_since: None,
            over_cap: false,
            pressure_over_since: None,
            pressure_note: None,
            throttle: Default::default(),
        }
    }

    /// The worse of the soft-cap checks' verdict and the pressure rule's.
    pub(crate) fn health(&self) -> Health {
        if self.pressure_note.is_some() {
            self.health.max(Health::Degraded)
        } else {
            self.health
        }
    }

    pub(crate) fn memory(&self) -> Option<u64> {
        self.memory
    }

    pub(crate) fn cause(&self) -> Option<&Cause> {
        self.cause.as_ref()
    }

    /// The Scoot check, at a task start: residual memory over the cap makes
    /// the worker unhealthy at once.
    pub(crate) fn check_residual(&mut self, memory: u64, residual: u64) -> Option<Transition> {
        self.memory = Some(memory);
        self.residual = Some(residual);
        let cap = self.spec.soft_cap?;
        if residual <= cap || self.health == Health::Unhealthy {
            return None;
        }
        Some(self.become_unhealthy(Cause::Residual {
            residual,
            memory,
            cap,
        }))
    }

    /// A periodic sample. `any_task_growing`: some running task of this
    /// worker grew over the growth window. `some_avg10`: the worker's PSI
    /// `some avg10` (a fraction), when it could be read.
    pub(crate) fn observe(
        &mut self,
        memory: u64,
        residual: u64,
        any_task_growing: bool,
        some_avg10: Option<f64>,
        now: Instant,
        settings: &Settings,
    ) -> Vec<Transition> {
        self.memory = Some(memory);
        self.residual = Some(residual);
        let mut out = Vec::new();
        if let Some(cap) = self.spec.soft_cap {
            let over = memory > cap;
            let clearly_below = (memory as f64) < cap as f64 * (1.0 - settings.hysteresis);

            if over && !self.over_cap {
                self.over_cap = true;
                out.push(Transition::CapExceeded { memory, cap });
            } else if clearly_below {
                self.over_cap = false;
            }

            let transition = match (self.health, &self.cause) {
                // The pressure rule judges its own recovery, below.
                (Health::Unhealthy, Some(Cause::Pressure { .. })) => None,
                (Health::Unhealthy, _) => {
                    self.observe_unhealthy(memory, residual, cap, now, settings)
                }
                (Health::Healthy | Health::Degraded, _) => {
                    self.observe_over_cap(memory, cap, over, clearly_below, any_task_growing, now)
                }
            };
            out.extend(transition);
        }
        if let (Some(rule), Some(avg10)) = (self.spec.pressure, some_avg10) {
            out.extend(self.observe_pressure(rule, avg10, now, settings));
        }
        out
    }

    /// The pressure rule: `some avg10` above the limit for `after` makes
    /// the worker unhealthy (degraded with the countdown before);
    /// recovered once clearly (the hysteresis) below the limit for
    /// `recover_after`, as the soft cap is.
    fn observe_pressure(
        &mut self,
        rule: PressureRule,
        avg10: f64,
        now: Instant,
        settings: &Settings,
    ) -> Option<Transition> {
        let limit = f64::from(rule.limit_bp) / 10_000.0;
        let over = avg10 > limit;
        let clearly_below = avg10 < limit * (1.0 - settings.hysteresis);
        let avg10_bp = basis_points(avg10);
        match (self.health, &self.cause) {
            (Health::Unhealthy, Some(Cause::Pressure { .. })) => {
                if clearly_below {
                    let since = *self.below_since.get_or_insert(now);
                    let below_for = now.duration_since(since);
                    if below_for >= self.spec.recover_after {
                        return Some(self.recover(format!(
                            "memory pressure (PSI some avg10 {}) below the limit {} for {}s",
                            percent(avg10_bp),
                            percent(rule.limit_bp),
                            below_for.as_secs()
                        )));
                    }
                    self.note = Some(format!(
                        "recovering: memory pressure below the limit for {}s of {}s",
                        below_for.as_secs(),
                        self.spec.recover_after.as_secs()
                    ));
                } else {
                    self.below_since = None;
                    self.note = None;
                }
                None
            }
            // Unhealthy for memory: judged by the soft-cap checks alone.
            (Health::Unhealthy, _) => None,
            (Health::Healthy | Health::Degraded, _) => {
                if clearly_below || (!over && self.pressure_over_since.is_none()) {
                    self.pressure_over_since = None;
                    self.pressure_note = None;
                    return None;
                }
                let since = *self.pressure_over_since.get_or_insert(now);
                let over_for = now.duration_since(since);
                if over_for >= rule.after {
                    self.over_since = None;
                    return Some(self.become_unhealthy(Cause::Pressure {
                        some_avg10_bp: avg10_bp,
                        limit_bp: rule.limit_bp,
                        secs: over_for.as_secs(),
                    }));
                }
                self.pressure_note = Some(format!(
                    "memory pressure (PSI some avg10 {}) above the limit {} for {}s of {}s",
                    percent(avg10_bp),
                    percent(rule.limit_bp),
                    over_for.as_secs(),
                    rule.after.as_secs()
                ));
                None
            }
        }
    }

    /// While unhealthy: recovered once what made it unhealthy (residual
    /// memory for the Scoot check, all memory for unmanaged memory) stayed
    /// clearly below the cap for `recover_after`.
    fn observe_unhealthy(
        &mut self,
        memory: u64,
        residual: u64,
        cap: u64,
        now: Instant,
        settings: &Settings,
    ) -> Option<Transition> {
        // Recovery is judged on what made it unhealthy: residual
        // memory for the Scoot check, all memory for unmanaged memory.
        let judged = match self.cause {
            Some(Cause::Residual { .. }) => residual,
            _ => memory,
        };
        if (judged as f64) < cap as f64 * (1.0 - settings.hysteresis) {
            let since = *self.below_since.get_or_insert(now);
            let below_for = now.duration_since(since);
            if below_for >= self.spec.recover_after {
                return Some(self.recover(format!(
                    "below the soft cap {} for {}s",
                    bytes(cap),
                    below_for.as_secs()
                )));
            } else {
                self.note = Some(format!(
                    "recovering: below the soft cap for {}s of {}s",
                    below_for.as_secs(),
                    self.spec.recover_after.as_secs()
                ));
            }
        } else {
            self.below_since = None;
            self.note = None;
        }
        None
    }

    /// While healthy or degraded: unhealthy once over the cap for
    /// `unhealthy_after` with no task growing.
    fn observe_over_cap(
        &mut self,
        memory: u64,
        cap: u64,
        over: bool,
        clearly_below: bool,
        any_task_growing: bool,
        now: Instant,
    ) -> Option<Transition> {
        if clearly_below || (!over && self.over_since.is_none()) {
            self.over_since = None;
            self.set(Health::Healthy, None);
        } else if any_task_growing {
            // Growth of a task may be legitimate work: restart the clock.
            self.over_since = Some(now);
            self.set(
                Health::Degraded,
                Some(format!(
                    "memory {} above the soft cap {}; a task is growing",
                    bytes(memory),
                    bytes(cap)
                )),
            );
        } else {
            let since = *self.over_since.get_or_insert(now);
            let over_for = now.duration_since(since);
            if over_for >= self.spec.unhealthy_after {
                return Some(self.become_unhealthy(Cause::Unmanaged {
                    memory,
                    cap,
                    secs: over_for.as_secs(),
                }));
            } else {
                self.set(
                    Health::Degraded,
                    Some(format!(
                        "memory {} above the soft cap {} for {}s of {}s with no task growing",
                        bytes(memory),
                        bytes(cap),
                        over_for.as_secs(),
                        self.spec.unhealthy_after.as_secs()
                    )),
                );
            }
        }
        None
    }

    /// Unhealthy again after an agent restart, as the last run left it, with
    /// no new transition: no second `worker_unhealthy`, and the recovery
    /// clock starts from here. Its memory counts as over the cap already
    /// (no second `soft_cap_exceeded`).
    pub(crate) fn restore_unhealthy(&mut self, cause: Cause) {
        self.health = Health::Unhealthy;
        self.note = None;
        self.below_since = None;
        self.over_since = None;
        self.pressure_over_since = None;
        self.pressure_note = None;
        // Over the cap already, unless the pressure rule made it unhealthy.
        self.over_cap = !matches!(cause, Cause::Pressure { .. });
        self.cause = Some(cause);
    }

    /// An operator cleared the worker (`POST /v1/workers/{name}/reset`).
    pub(crate) fn reset(&mut self) -> Option<Transition> {
        let was_unhealthy = self.health == Health::Unhealthy;
        self.over_cap = false;
        let recovered = self.recover("operator reset".into());
        was_unhealthy.then_some(recovered)
    }

    fn become_unhealthy(&mut self, cause: Cause) -> Transition {
        self.health = Health::Unhealthy;
        self.note = None;
        self.below_since = None;
        self.pressure_over_since = None;
        self.pressure_note = None;
        self.cause = Some(cause.clone());
        Transition::Unhealthy(cause)
    }

    fn recover(&mut self, reason: String) -> Transition {
        self.set(Health::Healthy, None);
        self.cause = None;
        self.below_since = None;
        self.over_since = None;
        self.pressure_over_since = None;
        self.pressure_note = None;
        Transition::Recovered { reason }
    }

    fn set(&mut self, health: Health, note: Option<String>) {
        self.health = health;
        self.note = note;
    }

    pub(crate) fn view(&self, running_tasks: usize) -> WorkerView {
        let mut reasons = Vec::new();
        if let Some(cause) = &self.cause {
            reasons.push(cause.reason());
        }
        if let Some(note) = &self.note {
            reasons.push(note.clone());
        }
        if let Some(note) = &self.pressure_note {
            reasons.push(note.clone());
        }
        WorkerView {
            name: self.spec.name.clone(),
            status: self.health(),
            reasons,
            cgroup: self.spec.source.cgroup().map(|p| p.display().to_string()),
            memory_bytes: self.memory,
            residual_bytes: self.residual,
            soft_cap_bytes: self.spec.soft_cap,
            running_tasks,
            kernel_usage_bytes: None,
            limit: Default::default(),
        }
    }
}

/// `300.0 MiB`
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state directory keeps causes as JSON: those written by builds
    /// before the pressure rule still parse, and the new one round-trips.
    #[test]
    fn kept_causes_of_every_build_parse() {
        let old = [
            (
                r#"{"kind":"residual","residual":3,"memory":5,"cap":2}"#,
                Cause::Residual {
                    residual: 3,
                    memory: 5,
                    cap: 2,
                },
            ),
            (
                r#"{"kind":"unmanaged","memory":5,"cap":2,"secs":61}"#,
                Cause::Unmanaged {
                    memory: 5,
                    cap: 2,
                    secs: 61,
                },
            ),
        ];
        for (json, cause) in old {
            assert_eq!(serde_json::from_str::<Cause>(json).unwrap(), cause);
        }
        let pressure = Cause::Pressure {
            some_avg10_bp: 3050,
            limit_bp: 2000,
            secs: 60,
        };
        let json = serde_json::to_value(&pressure).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "pressure", "some_avg10_bp": 3050, "limit_bp": 2000, "secs": 60})
        );
        assert_eq!(serde_json::from_value::<Cause>(json).unwrap(), pressure);
        assert!(
            pressure.reason().contains("30.50%"),
            "{}",
            pressure.reason()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_cap_and_under_pressure_at_once_gives_both_reasons() {
        let mut spec = WorkerSpec::host();
        spec.soft_cap = Some(100);
        spec.pressure = Some(PressureRule {
            limit_bp: 1000,
            after: std::time::Duration::from_secs(30),
        });
        let mut w = WorkerState::new(spec);
        let settings = Settings::default();
        let now = Instant::now();
        let out = w.observe(150, 150, false, Some(0.5), now, &settings);
        assert_eq!(
            out,
            [Transition::CapExceeded {
                memory: 150,
                cap: 100
            }]
        );
        let view = w.view(0);
        assert_eq!(view.status, Health::Degraded);
        assert_eq!(view.reasons.len(), 2, "{:?}", view.reasons);
        // The pressure rule's delay is the shorter: it decides.
        let later = now + std::time::Duration::from_secs(30);
        let out = w.observe(150, 150, false, Some(0.5), later, &settings);
        assert!(
            matches!(
                out[..],
                [Transition::Unhealthy(Cause::Pressure {
                    limit_bp: 1000,
                    ..
                })]
            ),
            "{out:?}"
        );
        // Below the cap, pressure gone: the soft cap does not judge a
        // pressure verdict; the pressure rule does, after recover_after.
        let out = w.observe(10, 10, false, Some(0.0), later, &settings);
        assert!(out.is_empty(), "{out:?}");
        let done = later + w.spec.recover_after;
        let out = w.observe(10, 10, false, Some(0.0), done, &settings);
        assert!(matches!(out[..], [Transition::Recovered { .. }]), "{out:?}");
        assert_eq!(w.health(), Health::Healthy);
    }
}
