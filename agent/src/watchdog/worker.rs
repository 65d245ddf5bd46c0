//! One worker's health over time: the Scoot check at task start, the Dask
//! "stuck above the cap with no task growing" check, hysteresis, reset.

use serde::Serialize;
use tokio::time::Instant;

use crate::model::{
    health::Health,
    spec::{Settings, WorkerSpec},
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
        }
    }
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
        }
    }

    pub(crate) fn health(&self) -> Health {
        self.health
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
    /// worker grew over the growth window.
    pub(crate) fn observe(
        &mut self,
        memory: u64,
        residual: u64,
        any_task_growing: bool,
        now: Instant,
        settings: &Settings,
    ) -> Vec<Transition> {
        self.memory = Some(memory);
        self.residual = Some(residual);
        let mut out = Vec::new();
        let Some(cap) = self.spec.soft_cap else {
            return out;
        };
        let over = memory > cap;
        let clearly_below = (memory as f64) < cap as f64 * (1.0 - settings.hysteresis);

        if over && !self.over_cap {
            self.over_cap = true;
            out.push(Transition::CapExceeded { memory, cap });
        } else if clearly_below {
            self.over_cap = false;
        }

        let transition = match self.health {
            Health::Unhealthy => self.observe_unhealthy(memory, residual, cap, now, settings),
            Health::Healthy | Health::Degraded => {
                self.observe_over_cap(memory, cap, over, clearly_below, any_task_growing, now)
            }
        };
        out.extend(transition);
        out
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
        self.over_cap = true;
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
        self.cause = Some(cause.clone());
        Transition::Unhealthy(cause)
    }

    fn recover(&mut self, reason: String) -> Transition {
        self.set(Health::Healthy, None);
        self.cause = None;
        self.below_since = None;
        self.over_since = None;
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
        WorkerView {
            name: self.spec.name.clone(),
            status: self.health,
            reasons,
            cgroup: self.spec.source.cgroup().map(|p| p.display().to_string()),
            memory_bytes: self.memory,
            residual_bytes: self.residual,
            soft_cap_bytes: self.spec.soft_cap,
            running_tasks,
            kernel_usage_bytes: None,
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
