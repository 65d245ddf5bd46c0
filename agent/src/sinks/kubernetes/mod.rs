//! The Kubernetes sink (`[kubernetes] api = true`): makes Kubernetes hear
//! memwatch the way node-problem-detector and kubelet speak to it.
//!
//! - The node's `MemwatchUnhealthy` condition says whether any worker is
//!   unhealthy now, which and why (node.rs).
//! - With `taint = true`, the node carries `memwatch.io/unhealthy:NoSchedule`
//!   while so, under the cluster guard: nodes unschedulable for any reason
//!   count as gone, the view is read just before tainting and again after
//!   (node.rs).
//! - Events (events.k8s.io/v1): `OOMKilling` and `SoftCapExceeded` about
//!   the pod (the node when no pod is named), `WorkerUnhealthy` and
//!   `WorkerRecovered` about the node; deduplicated into series and
//!   rate-limited per object as kubelet's recorder does (events.rs).
//! - Pods by name: a watch of the node's pods names every event's pod and
//!   container (pods.rs).
//!
//! It runs the one delivery loop of every sink: an API unreachable or
//! answering 409, 429 or 5xx is retried with backoff from the sink's
//! cursor, nothing lost. What the node says is made from the watchdog's
//! present verdict, never from an event's past one, and re-asserted at
//! every start and heartbeat (the API is the truth after a restart).

pub(crate) mod config;
mod events;
mod names;
mod node;
pub mod objects;
mod pods;
#[cfg(test)]
mod tests;

use std::{collections::BTreeMap, sync::Arc};

use anyhow::Context as _;
use k8s_openapi::api::{core::v1::Node, events::v1::Event as KubeEvent};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tracing::{debug, info};

pub use self::config::KubernetesSinkConfig;
use self::{
    events::{EventLog, Next},
    names::PodNames,
    objects::{EventSpec, Regarding},
};
use crate::{
    model::event::{Event, EventKind},
    record::Recorder,
    sinks::{
        Lent, SinkContext, Start, Started, WorkerHealth,
        action::Actions,
        config::Delivery,
        delivery::{FailureClass, SendError, Sink},
    },
};

/// The sink's name: metric label and cursor key.
pub(crate) const NAME: &str = "kubernetes";

/// Every call the sink and its pod watch make, as RBAC names them:
/// (API group, resource, verb). The manifests and the chart grant exactly
/// these (tests/ops/manifests/rbac.rs); the fake API server's tests check that
/// the code makes no other call (tests.rs).
pub const API_USES: &[(&str, &str, &str)] = &[
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

impl Start for KubernetesSinkConfig {
    fn name(&self) -> &str {
        NAME
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started> {
        let client = client(self).context("Kubernetes sink ([kubernetes] api = true)")?;
        info!(node = %ctx.node_name, condition = self.condition, taint = self.taint, events = self.events, pod_names = self.pod_names, "Kubernetes sink");
        let mut tasks = Vec::new();
        let mut lent = Lent::default();
        // Pod names by UID: filled by the watch, lent so that every event
        // with a pod's UID names the pod; empty without the watch.
        let pods = PodNames::default();
        if self.pod_names {
            tasks.push(tokio::spawn(pods::watch_pods(
                client.clone(),
                ctx.node_name.clone(),
                pods.clone(),
                ctx.stop.clone(),
            )));
            lent = lent.enricher(Arc::new(pods.clone()));
        }
        let sink = KubernetesSink::new(self.clone(), client, pods, ctx);
        tasks.push(ctx.spawn_delivery(sink));
        Ok(Started { tasks, lent })
    }
}

/// The client: the configured `api_server`, or in the pod the one
/// `KUBERNETES_SERVICE_HOST`/`_PORT` name; the token file read again as
/// kubelet rotates it, the CA file too; rustls.
fn client(config: &KubernetesSinkConfig) -> anyhow::Result<Client> {
    let url = match &config.api_server {
        Some(url) => url.clone(),
        None => {
            let host = std::env::var("KUBERNETES_SERVICE_HOST").context(
                "`kubernetes.api_server` is not set and KUBERNETES_SERVICE_HOST is not in the \
                 environment (not in a pod): set api_server, or api = false",
            )?;
            let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
            if host.contains(':') {
                format!("https://[{host}]:{port}")
            } else {
                format!("https://{host}:{port}")
            }
        }
    };
    let mut kube = kube::Config::new(url.parse().with_context(|| format!("api_server {url:?}"))?);
    kube.auth_info.token_file = Some(config.token_file.display().to_string());
    if let Some(ca) = &config.ca_file {
        std::fs::metadata(ca).with_context(|| format!("kubernetes.ca_file {}", ca.display()))?;
        kube.root_cert_file = Some(ca.clone());
    }
    kube.connect_timeout = Some(config.delivery.connect_timeout);
    kube.write_timeout = Some(config.delivery.timeout);
    // Retries are the delivery loop's, with its backoff and counters.
    kube.default_retry = false;
    Client::try_from(kube).context("building the Kubernetes client")
}

pub(crate) struct KubernetesSink {
    config: KubernetesSinkConfig,
    node: String,
    client: Client,
    recorder: Recorder,
    pods: PodNames,
    health: WorkerHealth,
    workers: Vec<String>,
    /// The taint: pending, done and said, run by the action protocol
    /// (sinks/action.rs) for the node as a whole (key: the node's name).
    actions: Actions,
    /// The node as the last reconcile read it.
    current: Option<Node>,
    /// Why each worker is unhealthy, from its last `worker_unhealthy` or
    /// heartbeat.
    reasons: BTreeMap<String, String>,
    log: EventLog,
    /// Highest seq handled in this run: a batch sent again after a failure
    /// goes on where it failed.
    done: u64,
    /// Whether the node was made to say the present since this start.
    asserted: bool,
}

impl KubernetesSink {
    fn new(
        config: KubernetesSinkConfig,
        client: Client,
        pods: PodNames,
        ctx: &SinkContext,
    ) -> Self {
        let workers = ctx.workers.iter().map(|w| w.name.clone()).collect();
        let mut sink = Self::with(
            config,
            client,
            ctx.node_name.clone(),
            ctx.recorder.clone(),
            pods,
            ctx.health.clone(),
            workers,
        );
        sink.actions.set_gate(ctx.gate.clone());
        sink
    }

    fn with(
        config: KubernetesSinkConfig,
        client: Client,
        node: String,
        recorder: Recorder,
        pods: PodNames,
        health: WorkerHealth,
        workers: Vec<String>,
    ) -> Self {
        Self {
            node,
            client,
            pods,
            recorder,
            health,
            workers,
            actions: Actions::new(config.guard, node::GUARD_SETTLE),
            current: None,
            reasons: BTreeMap::new(),
            log: EventLog::default(),
            done: 0,
            asserted: false,
            config,
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn count(&self, action: &str) {
        self.recorder
            .metrics()
            .scheduler_actions
            .with_label_values(&[NAME, action])
            .inc();
    }

    async fn handle(&mut self, event: &Event) -> Result<(), kube::Error> {
        let body = &event.body;
        match body.kind {
            EventKind::WorkerUnhealthy | EventKind::WorkerRecovered => {
                if let Some(worker) = &body.worker
                    && body.kind == EventKind::WorkerUnhealthy
                {
                    let why = body
                        .reason
                        .clone()
                        .unwrap_or_else(|| "no reason given".into());
                    self.reasons.insert(worker.clone(), why);
                }
                self.reconcile().await?;
            }
            EventKind::Heartbeat | EventKind::AgentStarted => {
                self.reasons_from(event);
                self.reconcile().await?;
            }
            _ => {}
        }
        if let Some(spec) = self.event_spec(event) {
            self.send_event(&spec, event).await?;
        }
        Ok(())
    }

    /// Reasons of the unhealthy workers a heartbeat lists.
    fn reasons_from(&mut self, event: &Event) {
        let workers = event
            .body
            .state
            .as_ref()
            .and_then(|s| s.get("workers"))
            .and_then(|w| w.as_array());
        for w in workers.into_iter().flatten() {
            let (Some(name), Some("unhealthy")) = (
                w.get("name").and_then(|n| n.as_str()),
                w.get("status").and_then(|s| s.as_str()),
            ) else {
                continue;
            };
            let reasons: Vec<&str> = w
                .get("reasons")
                .and_then(|r| r.as_array())
                .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            if !reasons.is_empty() {
                self.reasons.insert(name.to_string(), reasons.join("; "));
            }
        }
    }

    /// The Event a memwatch event makes, if any.
    fn event_spec(&self, event: &Event) -> Option<EventSpec> {
        if !self.config.events {
            return None;
        }
        let body = &event.body;
        let node = Regarding::Node {
            name: self.node.clone(),
        };
        let pod = || {
            let uid = body.pod_uid.as_deref()?;
            let known = self.pods.get(uid);
            let (namespace, name) = match (&body.pod_namespace, &body.pod_name, known) {
                (Some(ns), Some(name), _) => (ns.clone(), name.clone()),
                (_, _, Some(p)) => (p.namespace, p.name),
                _ => return None,
            };
            Some(Regarding::Pod {
                namespace,
                name,
                uid: uid.to_string(),
            })
        };
        let worker = body.worker.as_deref().unwrap_or("-");
        let what = describe(event);
        let (regarding, type_, reason, action, note) = match body.kind {
            EventKind::OomKill => (
                pod().unwrap_or(node),
                "Warning",
                "OOMKilling",
                "Observe",
                format!("memwatch: {what}"),
            ),
            EventKind::SoftCapExceeded => (
                pod().unwrap_or(node),
                "Warning",
                "SoftCapExceeded",
                "Observe",
                format!("memwatch: {what}"),
            ),
            // The kill predicted: the pod's owners and controllers can act
            // (checkpoint, scale out) while the work can still be saved.
            EventKind::OomImminent => (
                pod().unwrap_or(node),
                "Warning",
                "OOMImminent",
                "Observe",
                format!("memwatch: {what}"),
            ),
            EventKind::OomAverted => (
                pod().unwrap_or(node),
                "Normal",
                "OOMAverted",
                "Observe",
                format!("memwatch: {what}"),
            ),
            EventKind::WorkerUnhealthy => (
                node,
                "Warning",
                "WorkerUnhealthy",
                "MarkUnhealthy",
                format!(
                    "memwatch: worker {worker} unhealthy: {}",
                    body.reason.as_deref().unwrap_or("no reason given")
                ),
            ),
            EventKind::WorkerRecovered => (
                node,
                "Normal",
                "WorkerRecovered",
                "MarkHealthy",
                format!("memwatch: worker {worker} recovered"),
            ),
            _ => return None,
        };
        Some(EventSpec {
            regarding,
            type_,
            reason,
            action,
            note,
        })
    }

    /// Creates the Event, or counts it in its series, or drops it over the
    /// object's rate. A create sent again (the first attempt's answer
    /// lost) finds its name taken: done.
    async fn send_event(&mut self, spec: &EventSpec, event: &Event) -> Result<(), kube::Error> {
        let next = self.log.next(spec, event.time);
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), spec.regarding.namespace());
        let name = objects::event_name(&self.node, &event.id);
        match &next {
            Next::RateLimited => {
                debug!(reason = spec.reason, regarding = ?spec.regarding, "Event over the object's rate: not sent");
                self.count("event_rate_limited");
                return Ok(());
            }
            Next::Create => {
                let object: KubeEvent = serde_json::from_value(objects::event_object(
                    spec, &name, &self.node, event.time,
                ))
                .map_err(kube::Error::SerdeError)?;
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => {}
                    // Created by an attempt whose answer was lost.
                    Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {}
                    Err(e) => return Err(e),
                }
                self.count("event");
            }
            Next::Series { name: first, count } => {
                let patch = objects::series_patch(*count, event.time, &spec.note);
                match api
                    .patch(first, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => self.count("event_series"),
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        // The API let the first Event expire: a new series.
                        self.log.forget(spec);
                        return Box::pin(self.send_event(spec, event)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.log.sent(spec, &next, &name, event.time);
        Ok(())
    }
}

/// One line about what happened, for an Event's note.
fn describe(event: &Event) -> String {
    let body = &event.body;
    let mut parts = vec![body.kind.as_str().replace('_', " ")];
    if let Some(name) = &body.container_name {
        parts.push(format!("container {name}"));
    }
    if let (Some(pid), comm) = (body.pid, body.comm.as_deref()) {
        parts.push(format!("process {pid} ({})", comm.unwrap_or("?")));
    }
    if let Some(rss) = body.rss_bytes {
        parts.push(format!("rss {} MiB", rss >> 20));
    }
    if let Some(cap) = body.soft_cap_bytes {
        parts.push(format!("soft cap {} MiB", cap >> 20));
    }
    if let Some(eta) = body.eta_seconds {
        parts.push(format!("kill in {eta:.0} s"));
    }
    if let Some(limit) = body.limit_bytes {
        parts.push(format!("limit {} MiB", limit >> 20));
    }
    if let Some(cgroup) = &body.limit_cgroup {
        parts.push(format!("of {cgroup}"));
    }
    if body.throttled == Some(true) {
        parts.push("throttled at memory.high".into());
    }
    if let Some(task) = &body.task_id {
        parts.push(format!("task {task}"));
    }
    if let Some(worker) = &body.worker {
        parts.push(format!("worker {worker}"));
    }
    parts.push(format!("event {}", event.id));
    parts.join(", ")
}

/// How a failed call is retried: the API's own answer decides. 409 (a
/// conflict that outlived the sink's own re-reads), 429 and 5xx are worth
/// trying again; so are 401, 403 and 404 (a token, RBAC or node name an
/// operator fixes: nothing is dropped meanwhile, the failures are counted
/// and the backlog grows on `/health`); 400 and 422 refuse the object for
/// good.
pub(crate) fn send_error(e: kube::Error) -> SendError {
    let class = match &e {
        kube::Error::Api(s) if matches!(s.code, 400 | 422) => FailureClass::Refused,
        kube::Error::Api(_) => FailureClass::Status,
        kube::Error::HyperError(_) | kube::Error::Service(_) => FailureClass::Connect,
        kube::Error::Auth(_) => FailureClass::Status,
        _ => FailureClass::Other,
    };
    SendError::new(class, format!("Kubernetes API: {e}"))
}

impl Sink for KubernetesSink {
    fn name(&self) -> &str {
        NAME
    }

    fn delivery(&self) -> &Delivery {
        &self.config.delivery
    }

    async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
        let timeout = self.config.delivery.timeout;
        let bounded = |what: &str| {
            SendError::new(
                FailureClass::Timeout,
                format!("Kubernetes API: no answer to {what} in {timeout:?}"),
            )
        };
        if !self.asserted {
            tokio::time::timeout(timeout * 4, self.reconcile())
                .await
                .map_err(|_| bounded("the node's reconcile"))?
                .map_err(send_error)?;
            self.asserted = true;
        }
        for event in batch {
            if event.seq <= self.done {
                continue;
            }
            tokio::time::timeout(timeout * 4, self.handle(event))
                .await
                .map_err(|_| bounded(event.body.kind.as_str()))?
                .map_err(send_error)?;
            self.done = event.seq;
        }
        Ok(())
    }
}
