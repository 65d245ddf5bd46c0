//! The watchdog: workers, their tasks, and every check that turns memory
//! figures into health and events. Pure: figures and a clock in, decisions
//! and event bodies out; the caller reads memory and stores events.
//!
//! Longer than 600 lines: the `Watchdog` type, every check a memory figure
//! goes through and the events it decides on; the detectors are their own
//! files (throttle.rs, imminent.rs, predict/), what stays is the state they
//! share.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::Path,
};

use tokio::time::Instant;

use super::{
    imminent::{Predictions, Reading, Target},
    task::{Crossing, TaskState, TaskView},
    worker::{Cause, Transition, WorkerState, WorkerView, bytes},
};
use crate::model::{
    FastMap,
    event::{EventBody, EventKind},
    health::Health,
    pressure::{MemoryEvents, Pressure},
    spec::{MemorySource, OnResidualOverCap, Settings, TaskOutcome, TaskRequest, WorkerSpec},
};

/// What to read: (worker name or task id, where its memory is).
pub(crate) type Sources = Vec<(String, MemorySource)>;

/// Memory figures the caller read, by worker name and by task id. A missing
/// entry means "could not be read" and skips that check.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    pub workers: FastMap<String, u64>,
    pub tasks: FastMap<String, u64>,
    /// Workers' PSI (`memory.pressure`, cgroup v2), when readable.
    pub pressure: HashMap<String, Pressure>,
    /// Workers' memory event counters, when readable.
    pub memory_events: HashMap<String, MemoryEvents>,
    /// Cgroups' unreclaimable memory and limits, for the kill predictor.
    pub readings: Vec<Reading>,
    /// Tasks' soft-cap crossings the kernel reported and no read judged
    /// (the memory was gone before one): the kernel's usage at each.
    pub kernel_crossings: HashMap<String, u64>,
}

/// The answer to a task registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    Accepted,
    /// Accepted, but the worker is unhealthy (policy `flag`).
    Flagged {
        reason: String,
    },
    /// Not accepted: place the task elsewhere.
    Rejected {
        reason: String,
    },
}

#[derive(Debug)]
pub(crate) struct Registration {
    pub admission: Admission,
    pub worker: String,
    pub events: Vec<EventBody>,
    /// A retry of a running task by its owner: nothing was changed.
    pub again: bool,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WatchdogError {
    #[error("unknown worker `{0}`")]
    UnknownWorker(String),
    #[error("no worker named: several are configured ({0}); say which")]
    WorkerRequired(String),
    #[error("unknown task `{0}`")]
    UnknownTask(String),
    #[error("worker `{worker}` already runs {limit} tasks, the most it may; end some first")]
    TooManyTasks { worker: String, limit: usize },
    #[error("task `{task_id}` was registered by `{owner}`; only it or an admin may end it")]
    NotOwner { task_id: String, owner: String },
    #[error(
        "task `{task_id}` is running, registered by `{owner}`: a task id belongs to its \
         first caller; choose another id"
    )]
    TaskTaken { task_id: String, owner: String },
}

pub(crate) struct Watchdog {
    settings: Settings,
    workers: BTreeMap<String, WorkerState>,
    tasks: BTreeMap<String, TaskState>,
    /// Recently finished tasks, newest last, bounded.
    finished: VecDeque<TaskView>,
    /// Tasks finished since the agent started (heartbeats send the ones
    /// finished since the previous heartbeat: this tells them how many).
    finished_total: u64,
    /// The kill predictor's series and hysteresis, by cgroup.
    predictions: Predictions,
    /// The cgroups the predictor follows, built again only after a task came
    /// or went (`None`): a tick copies no path (see `policy/predict.rs`).
    targets: Option<std::sync::Arc<[Target]>>,
}

/// A retried registration: the same answer, nothing new.
fn again(existing: &TaskState) -> Registration {
    Registration {
        admission: match &existing.flagged {
            Some(reason) => Admission::Flagged {
                reason: reason.clone(),
            },
            None => Admission::Accepted,
        },
        worker: existing.worker.clone(),
        events: Vec::new(),
        again: true,
    }
}

impl Watchdog {
    /// With no workers configured, the whole host is one worker without a cap.
    pub(crate) fn new(workers: Vec<WorkerSpec>, settings: Settings) -> Self {
        let workers = if workers.is_empty() {
            vec![WorkerSpec::host()]
        } else {
            workers
        };
        Self {
            predictions: Predictions::new(settings.predict.clone()),
            settings,
            workers: workers
                .into_iter()
                .map(|spec| (spec.name.clone(), WorkerState::new(spec)))
                .collect(),
            tasks: BTreeMap::new(),
            targets: None,
            finished: VecDeque::new(),
            finished_total: 0,
        }
    }

    /// The worker a request names, or the only one there is.
    pub(crate) fn resolve_worker(&self, requested: Option<&str>) -> Result<String, WatchdogError> {
        match requested {
            Some(name) if self.workers.contains_key(name) => Ok(name.to_string()),
            Some(name) => Err(WatchdogError::UnknownWorker(name.into())),
            None if self.workers.len() == 1 => {
                Ok(self.workers.keys().next().cloned().unwrap_or_default())
            }
            None => Err(WatchdogError::WorkerRequired(
                self.workers.keys().cloned().collect::<Vec<_>>().join(", "),
            )),
        }
    }

    /// What to read for a sample: every worker.
    pub(crate) fn worker_sources(&self) -> Sources {
        self.workers
            .values()
            .map(|w| (w.spec.name.clone(), w.spec.source.clone()))
            .collect()
    }

    /// What to read for a full sample: every running task with a source.
    pub(crate) fn task_sources(&self) -> Sources {
        self.tasks
            .values()
            .filter_map(|t| t.source.clone().map(|s| (t.id.clone(), s)))
            .collect()
    }

    /// What to read for an admission on `worker` (`None`: the only one):
    /// the worker, and those of its running tasks never read yet (restored
    /// ones, before the first tick); the others count with their last figure.
    pub(crate) fn admission_sources(
        &self,
        worker: Option<&str>,
    ) -> Result<(Sources, Sources), WatchdogError> {
        let name = self.resolve_worker(worker)?;
        let spec = &self.workers[&name].spec;
        let tasks = self
            .tasks
            .values()
            .filter(|t| t.worker == name && t.memory().is_none())
            .filter_map(|t| t.source.clone().map(|s| (t.id.clone(), s)))
            .collect();
        Ok((vec![(name, spec.source.clone())], tasks))
    }

    /// The running tasks a tick between full rounds must read, given the
    /// workers' memory just read. A task read before may wait for the next
    /// full round when its worker is calm (healthy, below its soft cap:
    /// no residual check can fire) and either it has no cap, or it is
    /// below its cap and `kernel_quiet(task, last read)` (the kernel holds
    /// that cap and saw no growth step or crossing since).
    pub(crate) fn busy_tasks(
        &self,
        workers: &FastMap<String, u64>,
        kernel_quiet: impl Fn(&str, Instant) -> bool,
    ) -> Sources {
        let calm = |name: &str| {
            self.workers.get(name).is_some_and(|w| {
                w.health() == Health::Healthy
                    && workers
                        .get(name)
                        .is_some_and(|m| w.spec.soft_cap.is_none_or(|cap| *m < cap))
            })
        };
        let may_wait = |t: &TaskState| {
            let Some((read_at, memory)) = t.last_sample() else {
                return false;
            };
            calm(&t.worker)
                && t.soft_cap.is_none_or(|cap| {
                    (memory as f64) < cap as f64 * (1.0 - self.settings.hysteresis)
                        && kernel_quiet(&t.id, read_at)
                })
        };
        self.tasks
            .values()
            .filter(|t| !may_wait(t))
            .filter_map(|t| t.source.clone().map(|s| (t.id.clone(), s)))
            .collect()
    }

    /// Registers a task. `sample` must hold the worker's memory (and the
    /// new task's, when it has a source); a running task missing from it
    /// counts with its last figure (see [`Self::admission_sources`]).
    pub(crate) fn register(
        &mut self,
        req: TaskRequest,
        sample: &Sample,
        now: Instant,
    ) -> Result<Registration, WatchdogError> {
        let worker_name = self.resolve_worker(req.worker.as_deref())?;
        if let Some(existing) = self.tasks.get(&req.task_id) {
            // Its owner's retry answers the same; anyone else's changes
            // nothing (not the task, its kept row, nor a proof of it).
            if existing.owner != req.owner {
                return Err(WatchdogError::TaskTaken {
                    task_id: req.task_id,
                    owner: existing.owner.clone(),
                });
            }
            return Ok(again(existing));
        }
        self.check_room(&worker_name)?;
        let mut events = Vec::new();
        let residual = self.residual(&worker_name, sample, Some(&req.task_id));
        let worker = self.workers.get_mut(&worker_name).expect("resolved above");
        if let (Some(memory), Some(residual)) = (sample.workers.get(&worker_name), residual)
            && let Some(Transition::Unhealthy(cause)) = worker.check_residual(*memory, residual)
        {
            events.push(worker_unhealthy(
                &worker_name,
                &cause.reason(),
                Some(*memory),
                worker.spec.soft_cap,
            ));
        }
        let refusal = (worker.health() == Health::Unhealthy).then(|| {
            format!(
                "worker {worker_name} is unhealthy: {}",
                worker.cause().map(|c| c.reason()).unwrap_or_default()
            )
        });
        let soft_cap = req.soft_cap;
        let mut body = task_body(
            EventKind::TaskStarted,
            &req.task_id,
            &worker_name,
            req.source.as_ref(),
        );
        body.soft_cap_bytes = soft_cap;
        let admission = match (refusal, self.settings.on_residual_over_cap) {
            (None, _) => Admission::Accepted,
            (Some(reason), OnResidualOverCap::Flag) => Admission::Flagged { reason },
            (Some(reason), OnResidualOverCap::Reject) => {
                body.kind = EventKind::TaskRejected;
                body.reason = Some(reason.clone());
                events.push(body);
                return Ok(Registration {
                    admission: Admission::Rejected { reason },
                    worker: worker_name,
                    events,
                    again: false,
                });
            }
        };
        let mut task = TaskState::new(
            req.task_id.clone(),
            worker_name.clone(),
            req.source,
            soft_cap,
            now,
        );
        task.owner = req.owner;
        if let Admission::Flagged { reason } = &admission {
            task.flagged = Some(reason.clone());
            body.reason = Some(format!("flagged: {reason}"));
        }
        if let Some(&memory) = sample.tasks.get(&req.task_id) {
            task.observe(memory, now, &self.settings);
        }
        self.tasks.insert(req.task_id, task);
        self.targets = None;
        events.push(body);
        Ok(Registration {
            admission,
            worker: worker_name,
            events,
            again: false,
        })
    }

    /// Ends a task. Ending one that already ended is not an error: the
    /// answer is its final state, and no new event.
    /// A worker runs at most `max_tasks_per_worker` tasks.
    fn check_room(&self, worker: &str) -> Result<(), WatchdogError> {
        let limit = self.settings.max_tasks_per_worker;
        let running = self.tasks.values().filter(|t| t.worker == worker).count();
        if running >= limit {
            return Err(WatchdogError::TooManyTasks {
                worker: worker.to_string(),
                limit,
            });
        }
        Ok(())
    }

    /// Takes back a task a previous run admitted: no admission check, no
    /// event (it started before); its memory is read at the next sample.
    pub(crate) fn restore(&mut self, req: TaskRequest, now: Instant) -> Result<(), WatchdogError> {
        let worker = self.resolve_worker(req.worker.as_deref())?;
        let mut task = TaskState::new(req.task_id.clone(), worker, req.source, req.soft_cap, now);
        task.owner = req.owner;
        self.tasks.insert(req.task_id, task);
        self.targets = None;
        Ok(())
    }

    pub(crate) fn finish(
        &mut self,
        task_id: &str,
        outcome: TaskOutcome,
        now: Instant,
    ) -> Result<(TaskView, Vec<EventBody>), WatchdogError> {
        let removed = self.tasks.remove(task_id);
        if removed.is_some() {
            self.targets = None;
        }
        let Some(task) = removed else {
            return self
                .finished
                .iter()
                .rev()
                .find(|t| t.task_id == task_id)
                .map(|view| (view.clone(), Vec::new()))
                .ok_or_else(|| WatchdogError::UnknownTask(task_id.into()));
        };
        let mut body = task_body(
            EventKind::TaskFinished,
            &task.id,
            &task.worker,
            task.source.as_ref(),
        );
        body.reason = Some(outcome.describe());
        body.rss_bytes = task.memory();
        body.soft_cap_bytes = task.soft_cap;
        let view = task.view(now, &self.settings, Some(outcome));
        if self.finished.len() >= self.settings.finished_tasks_kept.max(1) {
            self.finished.pop_front();
        }
        self.finished.push_back(view.clone());
        self.finished_total += 1;
        Ok((view, vec![body]))
    }

    /// `soft_cap_exceeded` for a crossing of `task_id`'s cap the kernel
    /// reported at `usage` and no read judged (see
    /// [`TaskState::kernel_crossing`]); nothing when the task is over its
    /// cap already or unknown.
    pub(crate) fn kernel_crossing(&mut self, task_id: &str, usage: u64) -> Option<EventBody> {
        let task = self.tasks.get_mut(task_id)?;
        let crossing = task.kernel_crossing(usage)?;
        Some(cap_exceeded(
            task,
            &crossing,
            Some(
                "the kernel's count at the crossing, page cache included: the memory was gone before a read",
            ),
        ))
    }

    /// A periodic sample: soft-cap crossings, stuck-high workers, recovery.
    pub(crate) fn observe(&mut self, sample: &Sample, now: Instant) -> Vec<EventBody> {
        let mut events = Vec::new();
        for (task_id, &usage) in &sample.kernel_crossings {
            events.extend(self.kernel_crossing(task_id, usage));
        }
        // The tasks read, in id order (most rounds read only the busy ones).
        let mut read: Vec<(&String, u64)> = sample.tasks.iter().map(|(id, &m)| (id, m)).collect();
        read.sort_unstable();
        for (id, memory) in read {
            let Some(task) = self.tasks.get_mut(id) else {
                continue;
            };
            if let Some(crossing) = task.observe(memory, now, &self.settings) {
                events.push(cap_exceeded(task, &crossing, None));
            }
        }
        let names: Vec<String> = self.workers.keys().cloned().collect();
        for name in names {
            let Some(&memory) = sample.workers.get(&name) else {
                continue;
            };
            let residual = self.residual(&name, sample, None).unwrap_or(memory);
            let growing = self
                .tasks
                .values()
                .any(|t| t.worker == name && t.growing(&self.settings));
            let worker = self.workers.get_mut(&name).expect("known worker");
            let cap = worker.spec.soft_cap;
            let some_avg10 = sample.pressure.get(&name).map(|p| p.some.avg10);
            for transition in
                worker.observe(memory, residual, growing, some_avg10, now, &self.settings)
            {
                events.push(match transition {
                    Transition::Unhealthy(cause) => {
                        worker_unhealthy(&name, &cause.reason(), Some(memory), cap)
                    }
                    Transition::Recovered { reason } => {
                        worker_recovered(&name, &reason, Some(memory), cap)
                    }
                    Transition::CapExceeded { memory, cap } => {
                        let mut body = EventBody::new(EventKind::SoftCapExceeded);
                        body.worker = Some(name.clone());
                        body.cgroup = worker.spec.source.cgroup().map(|p| p.display().to_string());
                        body.rss_bytes = Some(memory);
                        body.soft_cap_bytes = Some(cap);
                        body.reason = Some(format!(
                            "worker memory {} over its soft cap {}",
                            bytes(memory),
                            bytes(cap)
                        ));
                        body
                    }
                });
            }
        }
        for (name, worker) in &mut self.workers {
            let Some(&high) = sample.memory_events.get(name).and_then(|e| e.get("high")) else {
                continue;
            };
            if let Some(increase) = worker.throttle.observe(high, now) {
                let mut body = EventBody::new(EventKind::MemoryHighThrottled);
                body.worker = Some(name.clone());
                body.cgroup = worker.spec.source.cgroup().map(|p| p.display().to_string());
                body.rss_bytes = worker.memory();
                body.count = Some(increase);
                body.reason = Some(format!(
                    "the kernel throttled the worker's allocations at memory.high \
                     {increase} times since the last sample (memory.events high {high})"
                ));
                events.push(body);
            }
        }
        events.extend(self.predictions.observe(&sample.readings, now));
        events
    }

    /// Names the task and worker of an OOM victim (by its memory cgroup, or
    /// its pid); the task ends as OOM-killed.
    pub(crate) fn attribute_oom(
        &mut self,
        cgroup: Option<&Path>,
        pid: u32,
        now: Instant,
    ) -> (Option<String>, Option<String>, Vec<EventBody>) {
        let in_cgroup = |source: &MemorySource| match (source, cgroup) {
            (MemorySource::Cgroup(dir), Some(victim)) => victim.starts_with(dir),
            (MemorySource::Pid(p), _) => *p == pid,
            _ => false,
        };
        let task = self
            .tasks
            .values()
            .filter(|t| t.source.as_ref().is_some_and(in_cgroup))
            // The innermost cgroup wins when tasks nest.
            .max_by_key(|t| {
                t.source
                    .as_ref()
                    .and_then(|s| s.cgroup())
                    .map_or(0, |p| p.as_os_str().len())
            })
            .map(|t| (t.id.clone(), t.worker.clone()));
        if let Some((task_id, worker)) = task {
            let events = self
                .finish(&task_id, TaskOutcome::OomKilled, now)
                .map(|(_, events)| events)
                .unwrap_or_default();
            return (Some(task_id), Some(worker), events);
        }
        // The client may have ended the task (`memwatch exec` saw the kill)
        // before this record was read: name it, end nothing twice.
        if let Some(view) = self
            .finished
            .iter()
            .rev()
            .find(|t| t.source.as_ref().is_some_and(in_cgroup))
        {
            return (
                Some(view.task_id.clone()),
                Some(view.worker.clone()),
                Vec::new(),
            );
        }
        let worker = self
            .workers
            .values()
            .find(|w| in_cgroup(&w.spec.source))
            .map(|w| w.spec.name.clone());
        (None, worker, Vec::new())
    }

    /// Why `worker` is unhealthy now (`None`: it is not, or is unknown).
    pub(crate) fn unhealthy_cause(&self, worker: &str) -> Option<Cause> {
        let state = self.workers.get(worker)?;
        (state.health() == Health::Unhealthy)
            .then(|| state.cause().cloned())
            .flatten()
    }

    /// Makes `worker` unhealthy as the last run left it (see
    /// [`WorkerState::restore_unhealthy`]); false when no such worker is
    /// configured any more.
    pub(crate) fn restore_unhealthy(&mut self, worker: &str, cause: Cause) -> bool {
        match self.workers.get_mut(worker) {
            Some(state) => {
                state.restore_unhealthy(cause);
                true
            }
            None => false,
        }
    }

    /// An operator clears a worker.
    pub(crate) fn reset(&mut self, worker: &str) -> Result<Vec<EventBody>, WatchdogError> {
        let state = self
            .workers
            .get_mut(worker)
            .ok_or_else(|| WatchdogError::UnknownWorker(worker.into()))?;
        let memory = state.memory();
        Ok(match state.reset() {
            Some(Transition::Recovered { reason }) => {
                vec![worker_recovered(
                    worker,
                    &reason,
                    memory,
                    state.spec.soft_cap,
                )]
            }
            _ => Vec::new(),
        })
    }

    pub(crate) fn workers(&self) -> Vec<WorkerView> {
        self.workers
            .values()
            .map(|w| {
                w.view(
                    self.tasks
                        .values()
                        .filter(|t| t.worker == w.spec.name)
                        .count(),
                )
            })
            .collect()
    }

    pub(crate) fn tasks(&self, now: Instant) -> Vec<TaskView> {
        self.tasks
            .values()
            .map(|t| t.view(now, &self.settings, None))
            .collect()
    }

    /// Who registered the task (running, else recently finished).
    pub(crate) fn owner_of(&self, task_id: &str) -> Option<&str> {
        match self.tasks.get(task_id) {
            Some(task) => Some(&task.owner),
            None => self
                .finished
                .iter()
                .rev()
                .find(|t| t.task_id == task_id)
                .map(|t| t.owner.as_str()),
        }
    }

    pub(crate) fn finished_tasks(&self) -> impl Iterator<Item = &TaskView> {
        self.finished.iter()
    }

    /// Tasks finished since the agent started.
    pub(crate) fn finished_total(&self) -> u64 {
        self.finished_total
    }

    /// Worker memory minus its running tasks' (and `also`'s), floored at 0.
    /// A task missing from `sample` (not read this time, or unreadable)
    /// counts with its last figure.
    fn residual(&self, worker: &str, sample: &Sample, also: Option<&str>) -> Option<u64> {
        let memory = *sample.workers.get(worker)?;
        let tasks: u64 = self
            .tasks
            .values()
            .filter(|t| t.worker == worker && Some(t.id.as_str()) != also)
            .filter_map(|t| sample.tasks.get(&t.id).copied().or_else(|| t.memory()))
            .chain(also.and_then(|id| sample.tasks.get(id).copied()))
            .sum();
        Some(memory.saturating_sub(tasks))
    }
}

/// `soft_cap_exceeded` of `task` at `crossing`; `how` says where a figure
/// not read by the sampler came from.
fn cap_exceeded(task: &TaskState, crossing: &Crossing, how: Option<&str>) -> EventBody {
    let mut body = task_body(
        EventKind::SoftCapExceeded,
        &task.id,
        &task.worker,
        task.source.as_ref(),
    );
    body.rss_bytes = Some(crossing.memory);
    body.soft_cap_bytes = Some(crossing.cap);
    body.growth_bytes_per_sec = Some(crossing.growth_rate);
    let how = how.map(|h| format!(" ({h})")).unwrap_or_default();
    body.reason = Some(format!(
        "task memory {} over its soft cap {}{how}",
        bytes(crossing.memory),
        bytes(crossing.cap)
    ));
    body
}

fn task_body(
    kind: EventKind,
    task_id: &str,
    worker: &str,
    source: Option<&MemorySource>,
) -> EventBody {
    let mut body = EventBody::new(kind);
    body.task_id = Some(task_id.into());
    body.worker = Some(worker.into());
    match source {
        Some(MemorySource::Cgroup(path)) => body.cgroup = Some(path.display().to_string()),
        Some(MemorySource::Pid(pid)) => body.pid = Some(*pid),
        _ => {}
    }
    body
}

fn worker_unhealthy(
    worker: &str,
    reason: &str,
    memory: Option<u64>,
    cap: Option<u64>,
) -> EventBody {
    let mut body = EventBody::new(EventKind::WorkerUnhealthy);
    body.worker = Some(worker.into());
    body.reason = Some(reason.into());
    body.rss_bytes = memory;
    body.soft_cap_bytes = cap;
    body
}

fn worker_recovered(
    worker: &str,
    reason: &str,
    memory: Option<u64>,
    cap: Option<u64>,
) -> EventBody {
    let mut body = worker_unhealthy(worker, reason, memory, cap);
    body.kind = EventKind::WorkerRecovered;
    body
}

mod predict;
#[cfg(test)]
mod tests;
