//! The watchdog at work: reads memory, feeds the pure policy, stores the
//! events it decides on, and keeps the per-worker metrics current. Shared
//! by the HTTP API, the sampling loop and the OOM pipeline.
//!
//! Longer than 600 lines: one type, the lock around the watchdog, and every
//! way the API, the sampler and the pipeline go through it; split, the rule
//! that nothing blocks while the lock is held would be spread over files.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{sync::Notify, time::Instant};
use tracing::{info, warn};

use crate::{
    cgroup::{CgroupResolver, MemoryHierarchy},
    daemon::{
        kernel_caps::KernelCaps,
        kernel_figures::KernelFigures,
        sampler::{self, MemoryReader},
    },
    model::{
        ByPath,
        event::{EventBody, EventKind},
        health::Health,
        spec::{AGENT_OWNER, MemorySource, Rule, Settings, TaskOutcome, TaskRequest, WorkerSpec},
    },
    probe::{CgroupChange, GrowthLine, KernelWatch},
    record::Recorder,
    watchdog::{
        policy::{Admission, Registration, Sample, Watchdog, WatchdogError},
        task::TaskView,
        worker::{Cause, WorkerView},
    },
};

/// Every task is read on one sampling round in this many; between, only
/// the busy ones.
const FULL_ROUND: u64 = 10;

/// At most one `task_rejected` event per worker this often.
const REJECTION_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) struct Monitor {
    watchdog: Mutex<Watchdog>,
    reader: Arc<dyn MemoryReader>,
    recorder: Recorder,
    rules: Vec<Rule>,
    /// Cgroup-rule tasks seen, by task id: their directory.
    rule_tasks: Mutex<HashMap<String, PathBuf>>,
    /// Memory cgroup ids → paths, for the OOM pipeline; told about every
    /// task cgroup so those resolve even once removed.
    resolver: Mutex<CgroupResolver>,
    /// The caps the kernel holds and the usage it reports.
    kernel: KernelCaps,
    /// When each worker's last `task_rejected` event was recorded.
    last_rejection: Mutex<HashMap<String, Instant>>,
    /// The kernel's PSI and memory event totals last published.
    kernel_figures: Mutex<KernelFigures>,
    /// Sampling rounds so far.
    rounds: AtomicU64,
    /// Cgroups within half of a limit at the last tick: sampled fast.
    near: Mutex<std::collections::HashSet<PathBuf>>,
    /// The last full predictor reading of each cgroup far from its limits
    /// (predict.rs: reused while its usage stays put).
    kept: Mutex<ByPath<predict::Kept>>,
    /// Held for the outbox (SQLite) writes of a decision, taken before the
    /// watchdog's lock is let go: the writes never hold the watchdog (the
    /// API, /health and the sampling loop wait on it), and those of two
    /// decisions land in the order the watchdog made them.
    writes: Mutex<()>,
}

/// A worker's health as kept in the outbox: its cause while unhealthy,
/// `None` once recovered.
type HealthChange = (String, Option<serde_json::Value>);

impl Monitor {
    /// Workers without a configured soft cap take their cgroup's own.
    pub(crate) fn new(
        mut workers: Vec<WorkerSpec>,
        settings: Settings,
        rules: Vec<Rule>,
        hierarchy: MemoryHierarchy,
        reader: Arc<dyn MemoryReader>,
        recorder: Recorder,
    ) -> Self {
        for worker in &mut workers {
            if worker.soft_cap.is_none()
                && let MemorySource::Cgroup(path) = &worker.source
            {
                worker.soft_cap = reader.cgroup_soft_cap(path);
            }
            info!(worker = %worker.name, source = ?worker.source, soft_cap = ?worker.soft_cap, "watching worker");
        }
        let monitor = Self {
            watchdog: Mutex::new(Watchdog::new(workers, settings)),
            reader,
            recorder,
            rules,
            rule_tasks: Mutex::default(),
            resolver: Mutex::new(CgroupResolver::new(hierarchy)),
            kernel: KernelCaps::default(),
            last_rejection: Mutex::default(),
            kernel_figures: Mutex::default(),
            rounds: AtomicU64::new(0),
            near: Mutex::default(),
            kept: Mutex::default(),
            writes: Mutex::default(),
        };
        monitor.publish_gauges(&monitor.lock());
        monitor
    }

    fn lock(&self) -> MutexGuard<'_, Watchdog> {
        self.watchdog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets the watchdog go, holding the write lock instead (see
    /// [`Monitor::writes`]); the caller writes while it holds the guard.
    fn unlock_for_writes<'a>(&'a self, watchdog: MutexGuard<'a, Watchdog>) -> MutexGuard<'a, ()> {
        let writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        drop(watchdog);
        writes
    }

    fn resolver(&self) -> MutexGuard<'_, CgroupResolver> {
        self.resolver.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mount point of the memory hierarchy.
    pub(crate) fn cgroup_root(&self) -> PathBuf {
        self.resolver().hierarchy().root.clone()
    }

    /// The path of a memory cgroup id (see [`CgroupResolver`]).
    pub(crate) fn resolve_cgroup(&self, id: u64) -> Option<PathBuf> {
        self.resolver().resolve(id)
    }

    /// Hands the kernel the soft caps of every worker and task with a
    /// cgroup, now and as tasks come and go.
    pub(crate) fn attach_kernel_watch(&self, watch: Arc<dyn KernelWatch>) {
        if !self.kernel.attach(watch) {
            return;
        }
        let watchdog = self.lock();
        for w in watchdog.workers() {
            if let (Some(cgroup), Some(cap)) = (&w.cgroup, w.soft_cap_bytes) {
                self.kernel
                    .push(&format!("worker:{}", w.name), Path::new(cgroup), cap);
            }
        }
        for t in watchdog.tasks(Instant::now()) {
            if let (Some(MemorySource::Cgroup(path)), Some(cap)) = (&t.source, t.soft_cap_bytes) {
                self.kernel.push(&t.task_id, path, cap);
            }
        }
    }

    /// Notified when the kernel saw a cap crossed: sample at once.
    pub(crate) fn sample_now(&self) -> Arc<Notify> {
        self.kernel.sample_now()
    }

    /// Kernel records were lost to a full ring buffer: the next round
    /// reads every task the kernel was thought to watch, at once.
    pub(crate) fn kernel_records_lost(&self) {
        self.kernel.records_lost();
    }

    /// A line crossed in the kernel: counted; a cap crossing (up or down)
    /// wakes the sampling loop, so the checks run within milliseconds
    /// instead of at the next `sample_interval`.
    pub(crate) fn growth_line(&self, line: &GrowthLine) {
        self.recorder
            .metrics()
            .growth_lines
            .with_label_values(&[line.line.as_str()])
            .inc();
        self.kernel.line(line);
    }

    /// Registers a task after reading its worker's memory and its own. The
    /// task's soft cap defaults to its cgroup's own.
    /// A task registered by a client (`POST /v1/tasks`, `memwatch exec`):
    /// kept in the state directory while it runs, so that an agent
    /// restarted meanwhile still counts its memory as the task's.
    pub(crate) fn register(&self, req: TaskRequest) -> Result<Registration, WatchdogError> {
        self.register_as(req, true)
    }

    fn register_as(&self, mut req: TaskRequest, keep: bool) -> Result<Registration, WatchdogError> {
        if let Some(MemorySource::Cgroup(path)) = &req.source {
            self.resolver().remember(path);
            if req.soft_cap.is_none() {
                req.soft_cap = self.reader.cgroup_soft_cap(path);
            }
        }
        // The worker and the new task are read now; the worker's other
        // tasks count with their figures of the last tick (at most one
        // old), so one more task costs the same at 10 live tasks as at 5,000.
        let (worker, mut tasks) = self.lock().admission_sources(req.worker.as_deref())?;
        if let Some(source) = &req.source {
            tasks.push((req.task_id.clone(), source.clone()));
        }
        let sample = sampler::sample(self.reader.as_ref(), &worker, &tasks);
        let task_id = req.task_id.clone();
        let cap = req.soft_cap;
        let cgroup = req
            .source
            .as_ref()
            .and_then(|s| s.cgroup())
            .map(Path::to_path_buf);
        let kept = keep.then(|| req.clone());
        let mut watchdog = self.lock();
        let now = Instant::now();
        let registration = watchdog.register(req, &sample, now)?;
        // A retry keeps the row (and the kernel's cap) of the first call.
        let kept = kept.filter(|_| {
            !registration.again && !matches!(registration.admission, Admission::Rejected { .. })
        });
        let mut events = registration.events.clone();
        match (&registration.admission, cgroup, cap) {
            (Admission::Rejected { reason }, _, _) => {
                warn!(worker = %registration.worker, %reason, "task rejected");
                if self.rejection_recently_recorded(&registration.worker, now) {
                    events.retain(|e| e.kind != EventKind::TaskRejected);
                    self.recorder
                        .metrics()
                        .events_dropped
                        .with_label_values(&["rate_limited"])
                        .inc();
                }
            }
            (_, Some(cgroup), Some(cap)) if !registration.again => {
                self.kernel.push(&task_id, &cgroup, cap)
            }
            _ => {}
        }
        let health = health_changes(&watchdog, &events);
        self.publish_gauges(&watchdog);
        let _writes = self.unlock_for_writes(watchdog);
        if let Some(req) = kept {
            self.recorder.outbox().save_task(&req);
        }
        self.decided(health, events, now);
        Ok(registration)
    }

    /// Whether a `task_rejected` of `worker` was recorded less than
    /// [`REJECTION_INTERVAL`] ago (else notes this one): a loop of
    /// registrations on an unhealthy worker is answered 409 every time,
    /// but fills the outbox with one event per interval, not one per try,
    /// and cannot push real OOM kills out of it.
    fn rejection_recently_recorded(&self, worker: &str, now: Instant) -> bool {
        let mut last = self
            .last_rejection
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match last.get(worker) {
            Some(at) if now.duration_since(*at) < REJECTION_INTERVAL => true,
            _ => {
                last.insert(worker.to_string(), now);
                false
            }
        }
    }

    pub(crate) fn finish(
        &self,
        task_id: &str,
        outcome: TaskOutcome,
    ) -> Result<TaskView, WatchdogError> {
        self.finish_by(task_id, outcome, None)
    }

    /// Ends a task for a caller that may end only its own (`Some(principal)`),
    /// or any (`None`: an admin, the agent itself). The owner is checked
    /// under the same lock as the task ends: no other task of that id can
    /// come between.
    pub(crate) fn finish_by(
        &self,
        task_id: &str,
        outcome: TaskOutcome,
        principal: Option<&str>,
    ) -> Result<TaskView, WatchdogError> {
        let mut watchdog = self.lock();
        if let (Some(principal), Some(owner)) = (principal, watchdog.owner_of(task_id))
            && owner != principal
        {
            return Err(WatchdogError::NotOwner {
                task_id: task_id.into(),
                owner: owner.into(),
            });
        }
        let now = Instant::now();
        // A crossing no read judged is said before the task's end: the
        // kernel saw it, and the task left no time for a read.
        let crossed = self
            .kernel
            .take_crossing(task_id)
            .and_then(|usage| watchdog.kernel_crossing(task_id, usage));
        let (view, ended) = watchdog.finish(task_id, outcome, now)?;
        let events: Vec<EventBody> = crossed.into_iter().chain(ended).collect();
        self.kernel.remove(task_id);
        let health = health_changes(&watchdog, &events);
        self.publish_gauges(&watchdog);
        let _writes = self.unlock_for_writes(watchdog);
        self.recorder.outbox().remove_task(task_id);
        self.decided(health, events, now);
        Ok(view)
    }

    pub(crate) fn reset(&self, worker: &str) -> Result<(), WatchdogError> {
        let mut watchdog = self.lock();
        let events = watchdog.reset(worker)?;
        info!(%worker, "operator reset");
        self.decided_unlocked(watchdog, events, Instant::now());
        Ok(())
    }

    /// One sampling round: cgroup rules, then every worker, with the
    /// kernel's pressure figures and memory events, and the tasks: all of
    /// them every [`FULL_ROUND`]th round, else the busy ones (see
    /// [`Watchdog::busy_tasks`]): an idle agent's cost follows what
    /// changes, not how many tasks run.
    pub(crate) fn tick(&self) {
        self.scan_rules();
        let full = self
            .rounds
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(FULL_ROUND);
        let workers = self.lock().worker_sources();
        let mut sample: Sample = sampler::sample(self.reader.as_ref(), &workers, &[]);
        // Every task's source is cloned only on full rounds.
        let tasks = if full {
            self.lock().task_sources()
        } else {
            self.lock().busy_tasks(&sample.workers, |task, since| {
                self.kernel.quiet_since(task, since)
            })
        };
        let read_at = Instant::now();
        sample.tasks = sampler::sample(self.reader.as_ref(), &[], &tasks).tasks;
        // A crossing the kernel still holds was judged by these reads; one it
        // closed before any read is said from its own figure.
        self.kernel.judged(&sample.tasks, read_at);
        sample.kernel_crossings = self.kernel.take_unjudged();
        sampler::kernel_figures(self.reader.as_ref(), &workers, &mut sample);
        sample.readings = self.all_readings();
        let host = self.reader.host_pressure();
        self.kernel_figures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .publish(
                self.recorder.metrics(),
                host.as_ref(),
                &sample.pressure,
                &sample.memory_events,
            );
        let mut watchdog = self.lock();
        let now = Instant::now();
        let events = watchdog.observe(&sample, now);
        self.decided_unlocked(watchdog, events, now);
    }

    /// Names the task and worker of an OOM victim; stores the task's end.
    /// Returns (task_id, worker) for the `oom_kill` event, which the caller
    /// stores first, then the task's end is appended after it.
    pub(crate) fn attribute_oom(
        &self,
        cgroup: Option<&Path>,
        pid: u32,
    ) -> (Option<String>, Option<String>, Vec<EventBody>) {
        let mut watchdog = self.lock();
        let attributed = watchdog.attribute_oom(cgroup, pid, Instant::now());
        // The task ended: the kernel watches its cap no more (its cgroup
        // may live on, and the map's entries are bounded).
        if let Some(task_id) = &attributed.0 {
            self.kernel.remove(task_id);
        }
        self.publish_gauges(&watchdog);
        let _writes = self.unlock_for_writes(watchdog);
        if let Some(task_id) = &attributed.0 {
            self.recorder.outbox().remove_task(task_id);
        }
        attributed
    }

    /// Takes back the tasks the last run kept (see [`Monitor::register`])
    /// whose cgroup or process still exists, all at once and with no
    /// admission check: they were admitted already, and a restart must not
    /// turn their memory into residual. Returns how many came back.
    pub(crate) fn restore(&self) -> usize {
        let outbox = self.recorder.outbox();
        let mut watchdog = self.lock();
        let now = Instant::now();
        let mut restored = 0;
        for (worker, cause) in outbox.unhealthy_workers() {
            match serde_json::from_value::<Cause>(cause) {
                Ok(cause) if watchdog.restore_unhealthy(&worker, cause.clone()) => {
                    info!(%worker, reason = %cause.reason(), "worker still unhealthy from the last run");
                }
                Ok(_) => {
                    info!(%worker, "a worker kept as unhealthy is no longer configured: forgotten");
                    outbox.forget_unhealthy(&worker);
                }
                Err(error) => {
                    warn!(%worker, %error, "a kept worker health does not parse: forgotten");
                    outbox.forget_unhealthy(&worker);
                }
            }
        }
        for req in outbox.saved_tasks() {
            let alive = match &req.source {
                Some(MemorySource::Cgroup(path)) => path.is_dir(),
                Some(MemorySource::Pid(pid)) => Path::new(&format!("/proc/{pid}")).exists(),
                Some(MemorySource::Process(_) | MemorySource::Host) | None => true,
            };
            let task_id = req.task_id.clone();
            if let Some(MemorySource::Cgroup(path)) = &req.source {
                self.resolver().remember(path);
            }
            match alive.then(|| watchdog.restore(req, now)) {
                Some(Ok(())) => restored += 1,
                Some(Err(error)) => {
                    warn!(?task_id, %error, "a kept task cannot come back");
                    outbox.remove_task(&task_id);
                }
                None => {
                    info!(?task_id, "a kept task ended while the agent was down");
                    outbox.remove_task(&task_id);
                }
            }
        }
        self.publish_gauges(&watchdog);
        restored
    }

    /// Publishes the gauges, lets the watchdog go and records what it
    /// decided ([`Monitor::decided`]), the writes after the lock.
    fn decided_unlocked(
        &self,
        watchdog: MutexGuard<'_, Watchdog>,
        events: Vec<EventBody>,
        now: Instant,
    ) {
        let health = health_changes(&watchdog, &events);
        self.publish_gauges(&watchdog);
        let _writes = self.unlock_for_writes(watchdog);
        self.decided(health, events, now);
    }

    /// Records what the watchdog decided, and keeps the health of every
    /// worker it turned unhealthy or healthy (`health`, read under the
    /// watchdog's lock by [`health_changes`]), so that a restart neither
    /// forgets an unhealthy worker (its recovery would never be said) nor
    /// says it is unhealthy twice. Call it with the write lock held, not
    /// the watchdog's.
    fn decided(&self, health: Vec<HealthChange>, events: Vec<EventBody>, now: Instant) {
        let outbox = self.recorder.outbox();
        for (worker, cause) in health {
            match cause {
                Some(json) => outbox.keep_unhealthy(&worker, json),
                None => outbox.forget_unhealthy(&worker),
            }
        }
        self.store(events, now);
    }

    /// Records events the watchdog decided at `decided`, stamped with that
    /// instant's wall time (not the time they reach the outbox: intervals
    /// between events are the ones the policy measured).
    pub(crate) fn store(&self, events: impl IntoIterator<Item = EventBody>, decided: Instant) {
        let time = crate::model::time::wall_time(decided);
        for body in events {
            self.recorder
                .record_read(body, Some(time), Some(decided.into_std()));
        }
    }

    pub(crate) fn workers(&self) -> Vec<WorkerView> {
        let watchdog = self.lock();
        let mut workers = watchdog.workers();
        for w in &mut workers {
            w.kernel_usage_bytes = self.kernel.usage_of(&format!("worker:{}", w.name));
            if let Some(cgroup) = &w.cgroup {
                w.limit = watchdog.nearest_limit(std::path::Path::new(cgroup));
            }
        }
        workers
    }

    pub(crate) fn tasks(&self) -> Vec<TaskView> {
        let watchdog = self.lock();
        let now = Instant::now();
        let mut tasks = watchdog.tasks(now);
        for t in &mut tasks {
            t.kernel_usage_bytes = self.kernel.usage_of(&t.task_id);
            if let Some(cgroup) = t.source.as_ref().and_then(|s| s.cgroup()) {
                t.eta_seconds = watchdog.eta(cgroup, now);
                t.limit = watchdog.nearest_limit(cgroup);
            }
        }
        tasks
    }

    /// The seconds to `worker`'s soonest predicted OOM kill: of its own
    /// cgroup or of one of its tasks'; `None` when none is predicted.
    pub(crate) fn worker_eta(&self, worker: &str) -> Option<f64> {
        self.lock().worker_etas(Instant::now()).remove(worker)
    }

    /// The recently finished tasks (newest last) and how many tasks
    /// finished since the agent started, read together.
    pub(crate) fn finished(&self) -> (Vec<TaskView>, u64) {
        let watchdog = self.lock();
        (
            watchdog.finished_tasks().cloned().collect(),
            watchdog.finished_total(),
        )
    }

    /// A cgroup made or removed (from the probe): learn its path at once,
    /// and start or end the rule task it is, without waiting for a tick.
    pub(crate) fn cgroup_changed(&self, change: &CgroupChange) {
        if change.removed {
            self.kernel.cgroup_removed(change.id);
            let gone = self.resolver().known_path(change.id).map(Path::to_path_buf);
            let Some(path) = gone else { return };
            let mut known = self.rule_tasks.lock().unwrap_or_else(|e| e.into_inner());
            let ids: Vec<String> = known
                .iter()
                .filter(|(_, p)| **p == path)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                known.remove(&id);
                let _ = self.finish(&id, TaskOutcome::CgroupRemoved);
            }
            return;
        }
        let learned = self.resolver().learn(change.id, &change.path);
        if let Some(path) = learned
            && self.rules.iter().any(|r| r.pattern.matches_path(&path))
        {
            self.scan_rules();
        }
    }

    /// New cgroups matching a rule become tasks; vanished ones end.
    fn scan_rules(&self) {
        if self.rules.is_empty() {
            return;
        }
        let root = self.resolver().hierarchy().root.clone();
        let mut seen = HashMap::new();
        for rule in &self.rules {
            let Ok(paths) = glob::glob(rule.pattern.as_str()) else {
                continue;
            };
            for path in paths.flatten().filter(|p| p.is_dir()) {
                let id = path
                    .strip_prefix(&root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                seen.insert(id, (path, rule));
            }
        }
        let mut known = self.rule_tasks.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<String> = known
            .keys()
            .filter(|id| !seen.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            known.remove(&id);
            // Already ended (OOM-killed) is fine: finish is idempotent.
            let _ = self.finish(&id, TaskOutcome::CgroupRemoved);
        }
        for (id, (path, rule)) in seen {
            if known.contains_key(&id) {
                continue;
            }
            known.insert(id.clone(), path.clone());
            let req = TaskRequest {
                task_id: id,
                worker: Some(rule.worker.clone()),
                source: Some(MemorySource::Cgroup(path)),
                soft_cap: rule.soft_cap,
                owner: AGENT_OWNER.into(),
            };
            // Found again by the next scan after a restart: not kept.
            if let Err(error) = self.register_as(req, false) {
                warn!(%error, "cgroup rule task not registered");
            }
        }
    }

    fn publish_gauges(&self, watchdog: &Watchdog) {
        let etas = watchdog.worker_etas(Instant::now());
        for w in watchdog.workers() {
            let eta = &self.recorder.metrics().worker_oom_eta;
            match etas.get(&w.name) {
                Some(seconds) => eta.with_label_values(&[w.name.as_str()]).set(*seconds),
                None => {
                    let _ = eta.remove_label_values(&[w.name.as_str()]);
                }
            }
        }
        for w in watchdog.workers() {
            let name = w.name.as_str();
            let set = |gauge: &prometheus::IntGaugeVec, value: Option<u64>| {
                if let Some(v) = value {
                    gauge
                        .with_label_values(&[name])
                        .set(i64::try_from(v).unwrap_or(i64::MAX));
                }
            };
            set(&self.recorder.metrics().worker_memory, w.memory_bytes);
            set(&self.recorder.metrics().worker_residual, w.residual_bytes);
            set(&self.recorder.metrics().worker_soft_cap, w.soft_cap_bytes);
            set(
                &self.recorder.metrics().tasks_running,
                Some(w.running_tasks as u64),
            );
            for (state, health) in [
                ("healthy", Health::Healthy),
                ("degraded", Health::Degraded),
                ("unhealthy", Health::Unhealthy),
            ] {
                self.recorder
                    .metrics()
                    .worker_health
                    .with_label_values(&[name, state])
                    .set(i64::from(w.status == health));
            }
        }
    }
}

mod predict;
pub(crate) use predict::FAST_INTERVAL;

/// The workers `events` turn unhealthy (with their cause) or healthy.
fn health_changes(watchdog: &Watchdog, events: &[EventBody]) -> Vec<HealthChange> {
    events
        .iter()
        .filter_map(|body| {
            let worker = body.worker.as_deref()?;
            match body.kind {
                EventKind::WorkerUnhealthy => {
                    let cause = watchdog.unhealthy_cause(worker)?;
                    let json = serde_json::to_value(&cause).ok()?;
                    Some((worker.to_string(), Some(json)))
                }
                EventKind::WorkerRecovered => Some((worker.to_string(), None)),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
