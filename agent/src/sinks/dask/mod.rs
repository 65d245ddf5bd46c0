//! The Dask sink: retires the Dask workers of an unhealthy memwatch worker
//! through the scheduler's HTTP API, behind the cluster guard.
//!
//! - `worker_unhealthy` (or a heartbeat whose state says a worker is
//!   unhealthy): the memwatch worker's Dask workers (see `dask_map` for the
//!   rule) are retired with `POST /api/v1/retire_workers {"workers": [...]}`:
//!   the scheduler moves their data and tasks to other workers, then the
//!   worker and its nanny exit.
//! - Before that, `GET /api/v1/get_workers`: when the retirement would
//!   leave fewer workers than the guard allows, nothing is retired and one
//!   `guard_blocked` event says why. The retirement is tried again on every
//!   later batch (any event, heartbeats included) until the guard allows it
//!   or the worker recovers.
//! - `worker_recovered` forgets the worker. A worker is retired once per
//!   unhealthy episode: its replacement, started by the operator's
//!   supervisor while memwatch still counts down `recover_after`, is left alone.
//!
//! Any failure to reach the scheduler fails the batch: the delivery loop
//! retries it with backoff, and acting on it again is idempotent.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use tokio::sync::watch;
use tracing::{debug, info, warn};

mod config;
pub(crate) mod names;

use anyhow::Context as _;
use tokio::task::JoinHandle;

pub(crate) use self::config::DaskConfig;
use self::names::{Identity, Mapped, SchedulerNames};
use crate::{
    model::{
        event::{Event, EventKind},
        spec::WorkerSpec,
    },
    record::Recorder,
    sinks::{
        ActionGate, SinkContext, Start, WorkerHealth,
        config::Delivery,
        delivery::{FailureClass, SendError, Sink},
        guard::Capacity,
        report, stale,
        webhook::classify,
    },
};

impl Start for DaskConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Vec<JoinHandle<()>>> {
        info!(sink = %self.name, url = %self.url, min_remaining = self.guard.min_remaining, min_remaining_fraction = self.guard.min_remaining_fraction, "Dask sink");
        let sink = DaskSink::new(
            self.clone(),
            Arc::clone(&ctx.workers),
            ctx.recorder.clone(),
            ctx.names.clone(),
            ctx.health.clone(),
        )
        .with_context(|| format!("Dask sink {}", self.name))?;
        let mut sink = sink;
        sink.gate = ctx.gate.clone();
        Ok(vec![
            ctx.spawn_delivery(sink),
            tokio::spawn(refresh_names(
                self.clone(),
                Arc::clone(&ctx.workers),
                ctx.names.clone(),
                ctx.stop.clone(),
            )),
        ])
    }
}

pub(crate) struct DaskSink {
    config: DaskConfig,
    client: reqwest::Client,
    specs: Arc<[WorkerSpec]>,
    recorder: Recorder,
    names: SchedulerNames,
    health: WorkerHealth,
    /// Whether actions are held back after a state loss.
    gate: ActionGate,
    /// memwatch workers whose retirement the gate held back, said once.
    gated: BTreeSet<String>,
    /// memwatch workers that are unhealthy and not retired yet.
    pending: BTreeSet<String>,
    /// memwatch workers retired in their current unhealthy episode.
    done: BTreeSet<String>,
    /// memwatch workers whose `guard_blocked` (or refusal) was already
    /// reported in this episode.
    blocked: BTreeSet<String>,
    /// How long a retirement's answer is waited for (RETIRE_ANSWER_WAIT).
    retire_wait: Duration,
}

impl DaskSink {
    pub(crate) fn new(
        config: DaskConfig,
        specs: Arc<[WorkerSpec]>,
        recorder: Recorder,
        names: SchedulerNames,
        health: WorkerHealth,
    ) -> Result<Self, reqwest::Error> {
        Ok(Self {
            client: client(&config.delivery)?,
            config,
            specs,
            recorder,
            names,
            health,
            gate: ActionGate::open(),
            gated: BTreeSet::new(),
            pending: BTreeSet::new(),
            done: BTreeSet::new(),
            blocked: BTreeSet::new(),
            retire_wait: RETIRE_ANSWER_WAIT,
        })
    }

    fn observe(&mut self, event: &Event) {
        let worker = event.body.worker.clone();
        match (event.body.kind, worker) {
            (EventKind::WorkerUnhealthy, Some(w)) if !self.done.contains(&w) => {
                self.pending.insert(w);
            }
            (EventKind::WorkerRecovered, Some(w)) => self.forget(&w),
            (EventKind::Heartbeat, _) => {
                let workers = event
                    .body
                    .state
                    .as_ref()
                    .and_then(|s| s.get("workers"))
                    .and_then(|w| w.as_array());
                for w in workers.into_iter().flatten() {
                    let (Some(name), Some(status)) = (
                        w.get("name").and_then(|n| n.as_str()),
                        w.get("status").and_then(|s| s.as_str()),
                    ) else {
                        continue;
                    };
                    if status != "unhealthy" {
                        self.forget(name);
                    } else if !self.done.contains(name) {
                        self.pending.insert(name.to_string());
                    }
                }
            }
            _ => {}
        }
    }

    fn forget(&mut self, worker: &str) {
        self.pending.remove(worker);
        self.done.remove(worker);
        self.blocked.remove(worker);
        self.gated.remove(worker);
    }

    /// Every worker the scheduler lists, with its status
    /// (`/json/identity.json`): the raw answer, without mapping.
    async fn identity(&self) -> Result<Vec<names::DaskWorker>, SendError> {
        let url = api_url(&self.config, "json/identity.json");
        let response = self.client.get(url).send().await.map_err(classify)?;
        let status = response.status();
        if !status.is_success() {
            return Err(SendError::new(
                FailureClass::Status,
                format!("identity.json answered {status}"),
            ));
        }
        let answer: Identity = response.json().await.map_err(|e| {
            SendError::new(FailureClass::Other, format!("identity.json answer: {e}"))
        })?;
        Ok(answer.workers())
    }

    /// Every worker the scheduler lists, with its status, mapped to
    /// memwatch workers.
    async fn dask_workers(&self) -> Result<Vec<Mapped>, SendError> {
        let workers = self.identity().await?;
        let specs = Arc::clone(&self.specs);
        let mapped = tokio::task::spawn_blocking(move || names::map_workers(&specs, &workers))
            .await
            .map_err(|e| SendError::new(FailureClass::Other, format!("worker map: {e}")))?;
        self.names.update(&mapped);
        Ok(mapped)
    }

    /// Brings the statuses of `mapped` up to the scheduler's present view
    /// (a worker no longer listed is gone); cheap: no mapping.
    async fn refresh_statuses(&self, mapped: &mut Vec<Mapped>) -> Result<(), SendError> {
        let now: std::collections::BTreeMap<String, Option<String>> = self
            .identity()
            .await?
            .into_iter()
            .map(|w| (w.address, w.status))
            .collect();
        mapped.retain(|m| now.contains_key(&m.address));
        for m in mapped.iter_mut() {
            m.status = now.get(&m.address).cloned().flatten();
        }
        Ok(())
    }

    /// Retires the Dask workers of every pending memwatch worker the
    /// cluster guard lets go, one memwatch worker at a time, against the
    /// scheduler's present view (shared by every host's agent: a worker
    /// retiring by anyone's doing counts as gone).
    // Long, on purpose: the checks before a retirement (stale, gate, guard,
    // guard again on fresh statuses, the bounded answer) share the view and
    // must run in this order; split, the order would hide in the calls.
    async fn retire_pending(&mut self) -> Result<(), SendError> {
        for worker in self.pending.clone() {
            if let Some(why) = stale(&self.health, &worker) {
                info!(sink = %self.config.name, %worker, %why, "retirement skipped");
                self.pending.remove(&worker);
                self.blocked.remove(&worker);
                self.report(EventKind::ActionSkipped, &worker, &[], &why);
            }
        }
        if let Some(why) = self.gate.holds() {
            // Kept pending: tried again at a later batch, past the window.
            for worker in self.pending.clone() {
                if self.gated.insert(worker.clone()) {
                    info!(sink = %self.config.name, %worker, %why, "retirement held back");
                    self.report(EventKind::ActionSkipped, &worker, &[], &format!(
                        "Dask worker(s) of {worker} not retired yet: {why}; retired after that if the worker is still unhealthy"
                    ));
                }
            }
            return Ok(());
        }
        // Agents of several hosts whose workers turned unhealthy together
        // would otherwise read the same view in the same moment: a spread
        // narrows that race (docs/dask.md says what remains of it).
        tokio::time::sleep(jitter(RETIRE_JITTER)).await;
        let mut mapped = self.dask_workers().await?;
        for worker in self.pending.clone() {
            let (addresses, running) = retirable(&mapped, &worker);
            if addresses.is_empty() {
                debug!(sink = %self.config.name, %worker, "no Dask worker of this worker is in the cluster");
                continue;
            }
            let guard = self
                .config
                .guard
                .check(&capacity(&mapped), addresses.len(), running);
            // Passed: read the statuses once more right before acting (the
            // mapping above reads /proc and may take a while, and another
            // host may have retired a worker meanwhile).
            let (addresses, guard) = match guard {
                Ok(()) => {
                    self.refresh_statuses(&mut mapped).await?;
                    let (addresses, running) = retirable(&mapped, &worker);
                    if addresses.is_empty() {
                        continue;
                    }
                    let guard =
                        self.config
                            .guard
                            .check(&capacity(&mapped), addresses.len(), running);
                    (addresses, guard)
                }
                blocked => (addresses, blocked),
            };
            if let Err(blocked) = guard {
                if self.blocked.insert(worker.clone()) {
                    warn!(sink = %self.config.name, %worker, dask = ?addresses, %blocked, "retirement refused by the cluster guard");
                    self.report(EventKind::GuardBlocked, &worker, &addresses, &format!(
                        "not retiring Dask worker(s) {}: {blocked}; retried when the cluster changes",
                        addresses.join(", ")
                    ));
                }
                continue;
            }
            let retired = match tokio::time::timeout(self.retire_wait, self.retire(&addresses))
                .await
            {
                Ok(answer) => answer?,
                // `retire_workers` answers once the data has moved, which
                // may take long, or never when two hosts retired each
                // other's only recipient: the scheduler's status says
                // whether the retirement is under way.
                Err(_) => {
                    self.refresh_statuses(&mut mapped).await?;
                    let under_way: BTreeSet<String> = mapped
                        .iter()
                        .filter(|m| addresses.contains(&m.address) && m.leaving())
                        .map(|m| m.address.clone())
                        .collect();
                    info!(sink = %self.config.name, %worker, dask = ?addresses, leaving = ?under_way, wait = ?self.retire_wait, "no answer from retire_workers yet: judged from the workers' statuses");
                    under_way
                }
            };
            if retired.is_empty() {
                if self.blocked.insert(worker.clone()) {
                    warn!(sink = %self.config.name, %worker, dask = ?addresses, "the scheduler retired none of the workers asked");
                    self.report(EventKind::ActionRefused, &worker, &addresses, &format!(
                        "Dask retired none of {}: its retire_workers answer listed none, or none was \
                         leaving after {:.1}s (it keeps a worker whose data has nowhere to go); retried \
                         when the cluster changes",
                        addresses.join(", "),
                        self.retire_wait.as_secs_f64()
                    ));
                }
                continue;
            }
            info!(sink = %self.config.name, %worker, dask = ?retired, "Dask workers retired");
            self.count("retire");
            for m in mapped.iter_mut().filter(|m| retired.contains(&m.address)) {
                m.status = Some("closing_gracefully".into());
            }
            self.pending.remove(&worker);
            self.blocked.remove(&worker);
            self.done.insert(worker);
        }
        Ok(())
    }

    /// Asks the scheduler to retire `addresses`; the ones it says it
    /// retired (the keys of its answer).
    async fn retire(&self, addresses: &[String]) -> Result<BTreeSet<String>, SendError> {
        let url = api_url(&self.config, "api/v1/retire_workers");
        let response = self
            .client
            .post(url)
            .json(&serde_json::json!({ "workers": addresses }))
            .send()
            .await
            .map_err(classify)?;
        let status = response.status();
        if !status.is_success() {
            return Err(SendError::new(
                FailureClass::Status,
                format!("retire_workers {addresses:?} answered {status}"),
            ));
        }
        let answer: serde_json::Map<String, serde_json::Value> =
            response.json().await.map_err(|e| {
                SendError::new(FailureClass::Other, format!("retire_workers answer: {e}"))
            })?;
        Ok(answer.into_iter().map(|(address, _)| address).collect())
    }

    fn count(&self, action: &str) {
        self.recorder
            .metrics()
            .scheduler_actions
            .with_label_values(&[self.config.name.as_str(), action])
            .inc();
    }

    /// Records a `guard_blocked` or `action_refused` event of `worker`.
    fn report(&self, kind: EventKind, worker: &str, addresses: &[String], reason: &str) {
        self.count(kind.as_str());
        report(
            &self.recorder,
            kind,
            Some(worker),
            addresses.first().map(String::as_str),
            reason.to_string(),
        );
    }
}

impl Sink for DaskSink {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn delivery(&self) -> &Delivery {
        &self.config.delivery
    }

    async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
        for event in batch {
            self.observe(event);
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        self.retire_pending().await
    }
}

/// The longest pause before a retirement round reads the scheduler's view.
const RETIRE_JITTER: Duration = Duration::from_millis(1000);
/// How long a retirement's answer is waited for before the scheduler's
/// statuses decide whether it is under way.
const RETIRE_ANSWER_WAIT: Duration = Duration::from_secs(15);

/// A pause of up to `max`, different on every host and call.
fn jitter(max: Duration) -> Duration {
    let random = uuid::Uuid::now_v7().as_u128() as u64;
    let nanos = max.as_nanos().max(1) as u64;
    Duration::from_nanos(random % nanos)
}

/// The Dask workers of memwatch worker `worker` that a retirement would
/// take away (those not leaving already), and how many of them run.
fn retirable(mapped: &[Mapped], worker: &str) -> (Vec<String>, usize) {
    let mine: Vec<&Mapped> = mapped
        .iter()
        .filter(|m| m.worker.as_deref() == Some(worker) && !m.leaving())
        .collect();
    let running = mine.iter().filter(|m| m.running()).count();
    (mine.iter().map(|m| m.address.clone()).collect(), running)
}

/// The scheduler's view, as the cluster guard counts it.
fn capacity(mapped: &[Mapped]) -> Capacity {
    Capacity {
        listed: mapped.len(),
        leaving: mapped.iter().filter(|m| m.leaving()).count(),
        running: mapped.iter().filter(|m| m.running()).count(),
    }
}

fn client(delivery: &Delivery) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(delivery.connect_timeout)
        .timeout(delivery.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("memwatch/", env!("CARGO_PKG_VERSION")))
        .build()
}

fn api_url(config: &DaskConfig, path: &str) -> reqwest::Url {
    let mut url = config.url.clone();
    let base = url.path().trim_end_matches('/').to_string();
    url.set_path(&format!("{base}/{path}"));
    url
}

/// Keeps `names` current (pid → Dask address), so an `oom_kill` event can
/// name the Dask worker that was killed. Stops when `shutdown` turns true.
pub(crate) async fn refresh_names(
    config: DaskConfig,
    specs: Arc<[WorkerSpec]>,
    names: SchedulerNames,
    mut shutdown: watch::Receiver<bool>,
) {
    let Ok(client) = client(&config.delivery) else {
        return;
    };
    let url = api_url(&config, "json/identity.json");
    let mut ticker = tokio::time::interval(config.refresh_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let answer = async {
            let response = client.get(url.clone()).send().await?.error_for_status()?;
            response.json::<Identity>().await
        };
        match tokio::time::timeout(config.delivery.timeout + Duration::from_secs(1), answer).await {
            Ok(Ok(answer)) => {
                let specs = Arc::clone(&specs);
                let workers = answer.workers();
                if let Ok(mapped) =
                    tokio::task::spawn_blocking(move || names::map_workers(&specs, &workers)).await
                {
                    names.update(&mapped);
                }
            }
            Ok(Err(error)) => debug!(sink = %config.name, %error, "Dask worker map not refreshed"),
            Err(_) => debug!(sink = %config.name, "Dask worker map refresh timed out"),
        }
    }
}

#[cfg(test)]
mod tests;
