//! The one action protocol: how a sink takes capacity away from a scheduler
//! (retires Dask workers, drains a Slurm node, taints a Kubernetes node)
//! without acting on the past and without emptying the cluster.
//!
//! The sequence, for each worker that is unhealthy and not acted on yet in
//! its episode, runs here and nowhere else:
//!
//! 1. **stale**: the worker is not unhealthy now (the event was replayed
//!    after an outage): nothing done, `action_skipped`.
//! 2. **gate**: the agent lost its stored state at start and one
//!    `recover_after` has not passed: held, `action_skipped` said once.
//! 3. **read** the scheduler's present view: what the action would take
//!    (nothing to act on yet; already done by memwatch: adopted).
//! 4. **guard**: the cluster guard on that view; refused: held,
//!    `guard_blocked` said once, tried again with later events.
//! 5. **fresh read** right before acting, where reading took a while, and
//!    the guard again on it; **stale again** (the read may have waited on
//!    a scheduler coming back).
//! 6. **act**; the scheduler's refusal: held, `action_refused` said once.
//! 7. **stale after the act**: the worker recovered while the action was in
//!    flight: undone where the action can be undone.
//! 8. **re-check** after `settle`: when actions taken in the same moment on
//!    other hosts crossed the guard's floor together, the lowest-named
//!    subject keeps its action and the others undo theirs (the same answer
//!    on every host), held, `guard_blocked` said once.
//!
//! A sink supplies only its scheduler's part ([`Scheduler`]): how to read
//! its view, act, undo, and name things. What is pending, done and said
//! lives in [`Actions`].

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tracing::{debug, info, warn};

use super::{
    ActionGate,
    guard::{Capacity, Guard},
};
use crate::model::event::{Event, EventKind};

/// What one action would take, read from the scheduler's present view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// What is acted on, as reasons name it ("node n1", "Dask worker(s) a").
    pub subject: String,
    /// The scheduler's own names for what is acted on (a node; Dask
    /// addresses); the first is the events' `scheduler_worker`.
    pub members: Vec<String>,
    /// Members the action takes away, and how many of them run work.
    pub taking: usize,
    pub running: usize,
    /// The members the action takes from, as the guard counts them.
    pub capacity: Capacity,
}

impl Plan {
    /// The scheduler's name of what is acted on, in events and tie-breaks.
    pub(crate) fn scheduler_worker(&self) -> &str {
        self.members.first().map_or("", String::as_str)
    }
}

/// The scheduler's answer to "what would acting for this worker take".
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// Act on this.
    Act(Plan),
    /// Already done by memwatch (on this host or before a restart):
    /// adopted, the worker is done for its episode.
    Done(String),
    /// Nothing to act on now (not in the cluster, someone else's action
    /// holds it); kept pending, looked at again later.
    Nothing(String),
}

/// The scheduler's answer to an action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Acted {
    Done,
    /// It refused (Dask keeps a worker whose data has nowhere to go): why.
    Refused(String),
}

/// The words reasons use for a sink's action.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Words {
    /// "draining", "retiring", "tainting"
    pub doing: &'static str,
    /// "drained", "retired", "tainted"
    pub done: &'static str,
    /// "drain", "retirement", "taint"
    pub noun: &'static str,
    /// "resumed", "untainted"; unused by actions that cannot be undone.
    pub undone: &'static str,
}

/// A scheduler as the protocol sees it: what a sink supplies.
pub(crate) trait Scheduler {
    type Error;

    /// The sink's name, in logs.
    fn sink(&self) -> &str;
    fn words(&self) -> Words;
    /// What acting for `worker` acts on, before the view is read ("node
    /// n1", "the Dask worker(s) of w1").
    fn subject(&self, worker: &str) -> String;
    /// Why acting on `worker` being unhealthy would act on the past
    /// (`sinks::stale`); `None`: it is unhealthy now.
    fn stale(&self, worker: &str) -> Option<String>;
    /// For an action wanted because `worker`'s kill is predicted (not
    /// because it is unhealthy): why acting would act on the past (no kill
    /// is predicted now); by default the sink does not act on predictions.
    fn stale_prediction(&self, worker: &str) -> Option<String> {
        Some(format!(
            "{} does not act on predicted kills (worker {worker})",
            self.sink()
        ))
    }
    /// The scheduler's present view: what acting for `worker` would take.
    async fn read(&mut self, worker: &str) -> Result<Read, Self::Error>;
    /// The view again right before acting, where `read` took a while
    /// (Dask maps workers through /proc); by default `plan` stands.
    async fn refresh(&mut self, _worker: &str, plan: Plan) -> Result<Read, Self::Error> {
        Ok(Read::Act(plan))
    }
    /// Takes the capacity. `why`: the unhealthy event's reason, if known.
    async fn act(
        &mut self,
        worker: &str,
        plan: &Plan,
        why: Option<&str>,
    ) -> Result<Acted, Self::Error>;
    /// Gives it back; `false` when the action cannot be undone (a Dask
    /// retirement): then nothing is re-checked either.
    async fn undo(&mut self, worker: &str, plan: &Plan) -> Result<bool, Self::Error>;
    /// After the settle: the guard's view around `plan`'s subject now, and
    /// which subject keeps its action when the floor was crossed (the
    /// lowest name among memwatch's).
    async fn recheck(&mut self, plan: &Plan) -> Result<(Capacity, Option<String>), Self::Error>;
    /// Records an event the sink makes itself (`guard_blocked`, …).
    fn report(&self, kind: EventKind, worker: &str, scheduler_worker: Option<&str>, reason: String);
    /// Counts an action on `memwatch_scheduler_actions_total`.
    fn count(&self, action: &str);
}

/// What the protocol keeps between batches: one per sink. The default
/// has the default guard and no settle.
#[derive(Debug, Default)]
pub(crate) struct Actions {
    guard: Guard,
    gate: ActionGate,
    /// How long after acting the view is read again.
    settle: Duration,
    /// The longest pause before reading the view (agents of several hosts
    /// whose workers turned unhealthy together spread their reads).
    jitter: Duration,
    /// Unhealthy workers not acted on yet, with the reason of their event.
    pending: BTreeMap<String, Option<String>>,
    /// Acted on (or adopted) in their current episode.
    done: BTreeSet<String>,
    /// Whose refusal (gate, guard, scheduler) was said in this episode.
    said: BTreeSet<String>,
    /// Pending or done because their kill is predicted (`oom_imminent`),
    /// not because they are unhealthy; followed only when `predictions`.
    predicted: BTreeSet<String>,
    predictions: bool,
}

impl Actions {
    pub(crate) fn new(guard: Guard, settle: Duration) -> Self {
        Self {
            guard,
            gate: ActionGate::open(),
            settle,
            jitter: Duration::ZERO,
            pending: BTreeMap::new(),
            done: BTreeSet::new(),
            said: BTreeSet::new(),
            predicted: BTreeSet::new(),
            predictions: false,
        }
    }

    /// Also act when a worker's kill is predicted (`oom_imminent`), until
    /// `oom_averted` or the kill.
    pub(crate) fn with_predictions(mut self, on: bool) -> Self {
        self.predictions = on;
        self
    }

    pub(crate) fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    pub(crate) fn set_gate(&mut self, gate: ActionGate) {
        self.gate = gate;
    }

    #[cfg(test)]
    pub(crate) fn set_settle(&mut self, settle: Duration) {
        self.settle = settle;
    }

    /// `worker` is unhealthy: acted on unless it was in this episode.
    pub(crate) fn want(&mut self, worker: &str, why: Option<&str>) {
        if !self.done.contains(worker) {
            let reason = self.pending.entry(worker.to_string()).or_default();
            if why.is_some() {
                *reason = why.map(str::to_string);
            }
        }
    }

    /// `worker` recovered: its episode is over.
    pub(crate) fn forget(&mut self, worker: &str) {
        self.pending.remove(worker);
        self.done.remove(worker);
        self.said.remove(worker);
        self.predicted.remove(worker);
    }

    /// Reads what an event says of the workers' health: `worker_unhealthy`
    /// wants an action, `worker_recovered` ends the episode, a heartbeat's
    /// state does both for every worker it lists.
    pub(crate) fn observe(&mut self, event: &Event) {
        let worker = event.body.worker.as_deref();
        match (event.body.kind, worker) {
            (EventKind::WorkerUnhealthy, Some(w)) => {
                // A new episode: the scheduler's view is read again (what
                // memwatch did is adopted from it), a refusal said again.
                self.forget(w);
                self.want(w, event.body.reason.as_deref());
            }
            (EventKind::WorkerRecovered, Some(w)) => self.forget(w),
            (EventKind::OomImminent, Some(w)) if self.predictions => {
                if !self.pending.contains_key(w) && !self.done.contains(w) {
                    self.predicted.insert(w.to_string());
                }
                let why = event
                    .body
                    .eta_seconds
                    .map(|eta| format!("its OOM kill is predicted in {eta:.0} s"));
                self.want(w, why.as_deref());
            }
            // The prediction's episode ends with it (or with the kill).
            (EventKind::OomAverted | EventKind::OomKill, Some(w)) if self.predicted.contains(w) => {
                self.forget(w);
            }
            (EventKind::Heartbeat, _) => {
                for (name, status) in heartbeat_statuses(event) {
                    if status == "unhealthy" {
                        self.predicted.remove(name);
                        self.want(name, None);
                    } else if !self.predicted.contains(name) {
                        self.forget(name);
                    }
                }
            }
            _ => {}
        }
    }

    #[cfg(test)]
    pub(crate) fn is_pending(&self, worker: &str) -> bool {
        self.pending.contains_key(worker)
    }

    #[cfg(test)]
    pub(crate) fn is_done(&self, worker: &str) -> bool {
        self.done.contains(worker)
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Runs the sequence for every pending worker, in name order.
    pub(crate) async fn run<S: Scheduler>(&mut self, scheduler: &mut S) -> Result<(), S::Error> {
        let pending: Vec<(String, Option<String>)> = self
            .pending
            .iter()
            .map(|(w, why)| (w.clone(), why.clone()))
            .collect();
        let mut jittered = false;
        for (worker, why) in pending {
            if let Some(why) = self.stale(scheduler, &worker) {
                self.skip(scheduler, &worker, None, why);
                continue;
            }
            if let Some(why) = self.gate.holds() {
                let words = scheduler.words();
                self.hold(
                    scheduler,
                    EventKind::ActionSkipped,
                    &worker,
                    None,
                    format!(
                        "{} not {} yet: {why}; {} after that if it is still due",
                        scheduler.subject(&worker),
                        words.done,
                        words.done
                    ),
                );
                continue;
            }
            if !jittered && !self.jitter.is_zero() {
                jittered = true;
                tokio::time::sleep(jitter(self.jitter)).await;
            }
            self.one(scheduler, &worker, why.as_deref()).await?;
        }
        Ok(())
    }

    /// Why acting for `worker` would act on the past, by what it was
    /// wanted for: its health, or its predicted kill.
    fn stale<S: Scheduler>(&self, scheduler: &S, worker: &str) -> Option<String> {
        if self.predicted.contains(worker) {
            scheduler.stale_prediction(worker)
        } else {
            scheduler.stale(worker)
        }
    }

    /// Steps 3 to 8 for one worker.
    async fn one<S: Scheduler>(
        &mut self,
        scheduler: &mut S,
        worker: &str,
        why: Option<&str>,
    ) -> Result<(), S::Error> {
        let Some(plan) = self.read_and_guard(scheduler, worker).await? else {
            return Ok(());
        };
        if let Some(stale) = self.stale(scheduler, worker) {
            self.skip(scheduler, worker, Some(plan.scheduler_worker()), stale);
            return Ok(());
        }
        let words = scheduler.words();
        match scheduler.act(worker, &plan, why).await? {
            Acted::Done => {}
            Acted::Refused(reason) => {
                let subject = plan.scheduler_worker().to_string();
                self.hold(
                    scheduler,
                    EventKind::ActionRefused,
                    worker,
                    Some(&subject),
                    reason,
                );
                return Ok(());
            }
        }
        if let Some(stale) = self.stale(scheduler, worker) {
            // The action waited on the scheduler longer than the episode
            // lasted: undone where it can be.
            let undone = scheduler.undo(worker, &plan).await?;
            let stale = if undone {
                scheduler.count("undo");
                format!(
                    "{stale}; {} {}: it recovered while the {} was in flight",
                    plan.subject, words.undone, words.noun
                )
            } else {
                stale
            };
            self.skip(scheduler, worker, Some(plan.scheduler_worker()), stale);
            return Ok(());
        }
        info!(sink = %scheduler.sink(), %worker, subject = %plan.subject, "{}", words.done);
        self.pending.remove(worker);
        self.said.remove(worker);
        self.done.insert(worker.to_string());
        self.recheck(scheduler, worker, &plan).await
    }

    /// Steps 3 to 5: the plan the guard lets go, or `None` (held, adopted,
    /// nothing to act on).
    async fn read_and_guard<S: Scheduler>(
        &mut self,
        scheduler: &mut S,
        worker: &str,
    ) -> Result<Option<Plan>, S::Error> {
        let mut plan = match scheduler.read(worker).await? {
            Read::Act(plan) => plan,
            other => return Ok(self.settled(scheduler, worker, other)),
        };
        for fresh in [false, true] {
            if fresh {
                plan = match scheduler.refresh(worker, plan).await? {
                    Read::Act(plan) => plan,
                    other => return Ok(self.settled(scheduler, worker, other)),
                };
            }
            if let Err(blocked) = self.guard.check(&plan.capacity, plan.taking, plan.running) {
                let words = scheduler.words();
                let reason = format!(
                    "not {} {}: {blocked}; retried while it is still due",
                    words.doing, plan.subject
                );
                let subject = plan.scheduler_worker().to_string();
                self.hold(
                    scheduler,
                    EventKind::GuardBlocked,
                    worker,
                    Some(&subject),
                    reason,
                );
                return Ok(None);
            }
        }
        Ok(Some(plan))
    }

    /// A read that found nothing to act on.
    fn settled<S: Scheduler>(&mut self, scheduler: &S, worker: &str, read: Read) -> Option<Plan> {
        match read {
            Read::Done(what) => {
                info!(sink = %scheduler.sink(), %worker, %what, "adopted");
                self.pending.remove(worker);
                self.said.remove(worker);
                self.done.insert(worker.to_string());
            }
            Read::Nothing(what) => {
                debug!(sink = %scheduler.sink(), %worker, %what, "nothing to act on")
            }
            Read::Act(_) => unreachable!("settled is called for the other answers"),
        }
        None
    }

    /// Step 8: see the module's doc.
    async fn recheck<S: Scheduler>(
        &mut self,
        scheduler: &mut S,
        worker: &str,
        plan: &Plan,
    ) -> Result<(), S::Error> {
        if self.settle.is_zero() {
            return Ok(());
        }
        tokio::time::sleep(self.settle).await;
        let (capacity, keeper) = scheduler.recheck(plan).await?;
        if !self.guard.crossed(&capacity) || keeper.as_deref() == Some(plan.scheduler_worker()) {
            debug!(sink = %scheduler.sink(), %worker, subject = %plan.subject, "re-checked");
            return Ok(());
        }
        if !scheduler.undo(worker, plan).await? {
            return Ok(());
        }
        scheduler.count("undo");
        let words = scheduler.words();
        let keeper = keeper.unwrap_or_else(|| "another member".into());
        warn!(sink = %scheduler.sink(), %worker, subject = %plan.subject, %keeper, "actions in the same moment crossed the floor; ours undone");
        self.done.remove(worker);
        self.want(worker, None);
        self.hold(
            scheduler,
            EventKind::GuardBlocked,
            worker,
            Some(plan.scheduler_worker()),
            format!(
                "{} {}: {} in the same moment as {keeper} on another host, which crossed the cluster \
                 guard's floor; {keeper} keeps its {} (the lowest name); retried while it is still due",
                plan.subject, words.undone, words.done, words.noun
            ),
        );
        Ok(())
    }

    /// Acting would act on the past: dropped, said.
    fn skip<S: Scheduler>(
        &mut self,
        scheduler: &S,
        worker: &str,
        scheduler_worker: Option<&str>,
        why: String,
    ) {
        info!(sink = %scheduler.sink(), %worker, %why, "{} skipped", scheduler.words().noun);
        self.pending.remove(worker);
        self.said.remove(worker);
        self.predicted.remove(worker);
        scheduler.count("skipped");
        scheduler.report(EventKind::ActionSkipped, worker, scheduler_worker, why);
    }

    /// Not now: kept pending, said once in the episode.
    fn hold<S: Scheduler>(
        &mut self,
        scheduler: &S,
        kind: EventKind,
        worker: &str,
        scheduler_worker: Option<&str>,
        reason: String,
    ) {
        self.pending.entry(worker.to_string()).or_default();
        if self.said.insert(worker.to_string()) {
            warn!(sink = %scheduler.sink(), %worker, %reason, "{} held", scheduler.words().noun);
            scheduler.count(match kind {
                EventKind::GuardBlocked => "guard_blocked",
                EventKind::ActionRefused => "refused",
                _ => "skipped",
            });
            scheduler.report(kind, worker, scheduler_worker, reason);
        }
    }
}

/// Every worker a heartbeat's state lists, with its status.
pub(crate) fn heartbeat_statuses(event: &Event) -> impl Iterator<Item = (&str, &str)> {
    event
        .body
        .state
        .as_ref()
        .and_then(|s| s.get("workers"))
        .and_then(|w| w.as_array())
        .into_iter()
        .flatten()
        .filter_map(|w| Some((w.get("name")?.as_str()?, w.get("status")?.as_str()?)))
}

/// A pause of up to `max`, different on every host and call.
pub(crate) fn jitter(max: Duration) -> Duration {
    let random = uuid::Uuid::now_v7().as_u128() as u64;
    let nanos = max.as_nanos().max(1) as u64;
    Duration::from_nanos(random % nanos)
}

#[cfg(test)]
mod tests;
