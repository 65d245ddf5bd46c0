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
//! - `oom_imminent` (with `retire_imminent`, the default): the same
//!   retirement for a worker whose OOM kill is predicted, while the kill
//!   is still predicted (re-checked right before acting), so the data move
//!   off before they are lost; `oom_averted` or the kill ends it.
//! - `worker_recovered` forgets the worker. A worker is retired once per
//!   unhealthy episode: its replacement, started by the operator's
//!   supervisor while memwatch still counts down `recover_after`, is left alone.
//!
//! Any failure to reach the scheduler fails the batch: the delivery loop
//! retries it with backoff, and acting on it again is idempotent.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use tokio::sync::watch;
use tracing::{debug, info};

mod config;
pub(crate) mod names;

use anyhow::Context as _;

pub(crate) use self::config::DaskConfig;
use self::names::{Identity, Mapped, SchedulerNames};
use crate::{
    model::{
        event::{Event, EventKind},
        spec::WorkerSpec,
    },
    record::Recorder,
    sinks::{
        Lent, SinkContext, Start, Started, WorkerEta, WorkerHealth,
        action::{Acted, Actions, Plan, Read, Scheduler, Words},
        config::Delivery,
        delivery::{FailureClass, SendError, Sink},
        guard::Capacity,
        report, stale, stale_prediction,
    },
};

impl Start for DaskConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started> {
        info!(sink = %self.name, url = %self.url, min_remaining = self.guard.min_remaining, min_remaining_fraction = self.guard.min_remaining_fraction, "Dask sink");
        // This sink's map of Dask addresses, lent so that an `oom_kill`
        // names the Dask worker it killed.
        let names = SchedulerNames::default();
        let sink = DaskSink::new(
            self.clone(),
            Arc::clone(&ctx.workers),
            ctx.recorder.clone(),
            names.clone(),
            ctx.health.clone(),
        )
        .with_context(|| format!("Dask sink {}", self.name))?;
        let mut sink = sink;
        sink.actions.set_gate(ctx.gate.clone());
        sink.eta = ctx.eta.clone();
        Ok(Started {
            tasks: vec![
                ctx.spawn_delivery(sink),
                tokio::spawn(refresh_names(
                    self.clone(),
                    Arc::clone(&ctx.workers),
                    names.clone(),
                    ctx.stop.clone(),
                )),
            ],
            lent: Lent::default().enricher(Arc::new(names)),
        })
    }
}

pub(crate) struct DaskSink {
    config: DaskConfig,
    client: reqwest::Client,
    specs: Arc<[WorkerSpec]>,
    recorder: Recorder,
    names: SchedulerNames,
    health: WorkerHealth,
    /// Each worker's predicted kill now (`retire_imminent`).
    eta: WorkerEta,
    /// Retirements: what is pending, done and said, run by the action
    /// protocol (sinks/action.rs).
    actions: Actions,
    /// The scheduler's view read in this batch (mapping workers reads
    /// /proc: once per batch, however many workers are pending).
    view: Option<Vec<Mapped>>,
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
            specs,
            recorder,
            names,
            health,
            actions: Actions::new(config.guard, Duration::ZERO)
                .with_jitter(RETIRE_JITTER)
                .with_predictions(config.retire_imminent),
            eta: Arc::new(|_| None),
            view: None,
            retire_wait: RETIRE_ANSWER_WAIT,
            config,
        })
    }

    /// Every worker the scheduler lists, with its status
    /// (`/json/identity.json`): the raw answer, without mapping.
    async fn identity(&self) -> Result<Vec<names::DaskWorker>, SendError> {
        let url = api_url(&self.config, "json/identity.json");
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(SendError::from_reqwest)?;
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
            .map_err(SendError::from_reqwest)?;
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

    /// The plan for `worker` in the batch's view.
    fn plan(&self, worker: &str) -> Read {
        let mapped = self.view.as_deref().unwrap_or_default();
        let (addresses, running) = retirable(mapped, worker);
        if addresses.is_empty() {
            return Read::Nothing(format!("no Dask worker of {worker} is in the cluster"));
        }
        Read::Act(Plan {
            subject: format!("Dask worker(s) {}", addresses.join(", ")),
            capacity: capacity(mapped),
            taking: addresses.len(),
            running,
            members: addresses,
        })
    }
}

/// The Dask sink's part of the action protocol: the scheduler's view is
/// its workers mapped to memwatch workers; a retirement cannot be undone.
impl Scheduler for DaskSink {
    type Error = SendError;

    fn sink(&self) -> &str {
        &self.config.name
    }

    fn words(&self) -> Words {
        Words {
            doing: "retiring",
            done: "retired",
            noun: "retirement",
            undone: "",
        }
    }

    fn subject(&self, worker: &str) -> String {
        format!("the Dask worker(s) of {worker}")
    }

    fn stale(&self, worker: &str) -> Option<String> {
        stale(&self.health, worker)
    }

    fn stale_prediction(&self, worker: &str) -> Option<String> {
        stale_prediction(&self.eta, worker)
    }

    async fn read(&mut self, worker: &str) -> Result<Read, SendError> {
        if self.view.is_none() {
            self.view = Some(self.dask_workers().await?);
        }
        Ok(self.plan(worker))
    }

    /// The statuses once more right before acting: the mapping reads /proc
    /// and may take a while, and another host may have retired a worker
    /// meanwhile.
    async fn refresh(&mut self, worker: &str, _plan: Plan) -> Result<Read, SendError> {
        let mut mapped = self.view.take().unwrap_or_default();
        let refreshed = self.refresh_statuses(&mut mapped).await;
        self.view = Some(mapped);
        refreshed?;
        Ok(self.plan(worker))
    }

    async fn act(
        &mut self,
        worker: &str,
        plan: &Plan,
        _why: Option<&str>,
    ) -> Result<Acted, SendError> {
        let addresses = &plan.members;
        let retired = match tokio::time::timeout(self.retire_wait, self.retire(addresses)).await {
            Ok(answer) => answer?,
            // `retire_workers` answers once the data has moved, which may
            // take long, or never when two hosts retired each other's only
            // recipient: the scheduler's status says whether the
            // retirement is under way.
            Err(_) => {
                let mut mapped = self.view.take().unwrap_or_default();
                let refreshed = self.refresh_statuses(&mut mapped).await;
                let under_way: BTreeSet<String> = mapped
                    .iter()
                    .filter(|m| addresses.contains(&m.address) && m.leaving())
                    .map(|m| m.address.clone())
                    .collect();
                self.view = Some(mapped);
                refreshed?;
                info!(sink = %self.config.name, %worker, dask = ?addresses, leaving = ?under_way, wait = ?self.retire_wait, "no answer from retire_workers yet: judged from the workers' statuses");
                under_way
            }
        };
        if retired.is_empty() {
            return Ok(Acted::Refused(format!(
                "Dask retired none of {}: its retire_workers answer listed none, or none was \
                 leaving after {:.1}s (it keeps a worker whose data has nowhere to go); retried \
                 when the cluster changes",
                addresses.join(", "),
                self.retire_wait.as_secs_f64()
            )));
        }
        info!(sink = %self.config.name, %worker, dask = ?retired, "Dask workers retired");
        self.count("retire");
        for m in self
            .view
            .iter_mut()
            .flatten()
            .filter(|m| retired.contains(&m.address))
        {
            m.status = Some("closing_gracefully".into());
        }
        Ok(Acted::Done)
    }

    async fn undo(&mut self, _worker: &str, _plan: &Plan) -> Result<bool, SendError> {
        Ok(false)
    }

    async fn recheck(&mut self, plan: &Plan) -> Result<(Capacity, Option<String>), SendError> {
        // Never asked: a retirement is not undone, so it is not re-checked.
        Ok((Capacity::default(), plan.members.first().cloned()))
    }

    fn report(
        &self,
        kind: EventKind,
        worker: &str,
        scheduler_worker: Option<&str>,
        reason: String,
    ) {
        report(&self.recorder, kind, Some(worker), scheduler_worker, reason);
    }

    fn count(&self, action: &str) {
        DaskSink::count(self, action);
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
            self.actions.observe(event);
        }
        if !self.actions.has_pending() {
            return Ok(());
        }
        self.view = None;
        let mut actions = std::mem::take(&mut self.actions);
        let result = actions.run(self).await;
        self.actions = actions;
        result
    }
}

/// The longest pause before a retirement round reads the scheduler's view.
const RETIRE_JITTER: Duration = Duration::from_millis(1000);
/// How long a retirement's answer is waited for before the scheduler's
/// statuses decide whether it is under way.
const RETIRE_ANSWER_WAIT: Duration = Duration::from_secs(15);

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
