//! Where events go after the outbox: the [`Sink`](delivery::Sink) trait and
//! the one delivery loop every sink runs (delivery.rs), the cluster guard
//! of the sinks that act on a scheduler (guard.rs), and one folder per sink
//! that owns its config type: webhook, nats, dask, slurm, kubernetes, otlp
//! (OpenTelemetry). nats, kubernetes and otlp are Cargo features of their
//! names, on by default (agent/Cargo.toml).
//!
//! Adding a sink touches its own folder and one line of [`sinks!`] below
//! (docs/writing-a-sink.md).

pub(crate) mod action;
pub(crate) mod config;
pub(crate) mod dask;
pub(crate) mod delivery;
pub(crate) mod guard;
#[cfg(feature = "kubernetes")]
pub(crate) mod kubernetes;
#[cfg(feature = "nats")]
pub(crate) mod nats;
#[cfg(feature = "otlp")]
pub(crate) mod otlp;
pub(crate) mod slurm;
pub(crate) mod webhook;

use std::{path::PathBuf, sync::Arc};

use futures_util::future::BoxFuture;
use tokio::{sync::watch, task::JoinHandle};

use self::{
    config::{InvalidKey, SinkTable},
    dask::DaskConfig,
    delivery::Sink,
    slurm::SlurmConfig,
    webhook::WebhookConfig,
};
use crate::{
    model::{
        event::{Enrich, EventBody, EventKind},
        health::Health,
        process::SeenProcess,
        spec::WorkerSpec,
    },
    outbox::Outbox,
    record::Recorder,
    telemetry::{Metrics, liveness::Liveness},
};

/// A worker's health now, by name (the watchdog's present verdict): what a
/// sink checks before it acts, so that an event replayed after an outage,
/// or one the present contradicts, does nothing.
pub(crate) type WorkerHealth = Arc<dyn Fn(&str) -> Option<Health> + Send + Sync>;

/// The seconds to a worker's predicted OOM kill now (its soonest task's, or
/// its own cgroup's), by name; `None`: no kill predicted.
pub(crate) type WorkerEta = Arc<dyn Fn(&str) -> Option<f64> + Send + Sync>;

/// Why acting on `worker`'s predicted kill would act on the past: no kill
/// is predicted for it now.
pub(crate) fn stale_prediction(eta: &WorkerEta, worker: &str) -> Option<String> {
    match eta(worker) {
        Some(_) => None,
        None => Some(format!(
            "no OOM kill is predicted for worker {worker} now: the event is stale, nothing done"
        )),
    }
}

/// Why acting on `worker` being unhealthy would act on the past: it is not
/// unhealthy now.
pub(crate) fn stale(health: &WorkerHealth, worker: &str) -> Option<String> {
    match health(worker) {
        Some(Health::Unhealthy) => None,
        Some(now) => Some(format!(
            "worker {worker} is {} now: the event is stale, nothing done",
            format!("{now:?}").to_lowercase()
        )),
        None => Some(format!("worker {worker} is not watched now: nothing done")),
    }
}

/// Holds scheduler actions back for a while after the agent lost its
/// stored state (a corrupt outbox database set aside at start): the tasks
/// and unhealthy workers the last run kept are gone, so until one
/// `recover_after` has passed the watchdog's verdicts are not yet to be
/// acted on (a task's memory may look like a worker's residual memory).
/// The one gate every scheduler sink (Dask, Slurm) asks before it acts.
#[derive(Clone, Debug, Default)]
pub(crate) struct ActionGate {
    closed: Option<Arc<Closed>>,
}

#[derive(Debug)]
struct Closed {
    /// Why: what was set aside.
    what: String,
    until: tokio::time::Instant,
    window: std::time::Duration,
}

impl ActionGate {
    /// A gate that never holds anything back.
    pub(crate) fn open() -> Self {
        Self::default()
    }

    /// Holds actions back for `window` from now, because of `what`.
    pub(crate) fn closed_for(window: std::time::Duration, what: String) -> Self {
        Self {
            closed: Some(Arc::new(Closed {
                what,
                until: tokio::time::Instant::now() + window,
                window,
            })),
        }
    }

    /// Why acting now would be premature; `None` once the window passed.
    pub(crate) fn holds(&self) -> Option<String> {
        let closed = self.closed.as_deref()?;
        let left = closed
            .until
            .checked_duration_since(tokio::time::Instant::now())
            .filter(|left| !left.is_zero())?;
        Some(format!(
            "no scheduler action within {}s of a start that lost the agent's state ({}); {}s left",
            closed.window.as_secs(),
            closed.what,
            left.as_secs().max(1)
        ))
    }
}

/// Records an event a sink makes itself (`guard_blocked`,
/// `action_refused`, `action_skipped`).
pub(crate) fn report(
    recorder: &Recorder,
    kind: EventKind,
    worker: Option<&str>,
    scheduler_worker: Option<&str>,
    reason: String,
) {
    let mut body = EventBody::new(kind);
    body.worker = worker.map(str::to_string);
    body.scheduler_worker = scheduler_worker.map(str::to_string);
    body.reason = Some(reason);
    recorder.record(body, None);
}

/// What every sink is started with.
#[derive(Clone)]
pub(crate) struct SinkContext {
    pub outbox: Outbox,
    /// For the events a sink makes itself (`guard_blocked`).
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// Turns true at shutdown: sinks stop between attempts.
    pub stop: watch::Receiver<bool>,
    pub node_name: String,
    pub state_dir: PathBuf,
    /// Every worker (the host worker when none is configured).
    pub workers: Arc<[WorkerSpec]>,
    /// Each worker's health now.
    pub(crate) health: WorkerHealth,
    /// Each worker's predicted kill now.
    pub(crate) eta: WorkerEta,
    /// Whether scheduler actions are held back (after a state loss).
    pub(crate) gate: ActionGate,
    /// Where the sinks' loops say they make progress.
    pub(crate) liveness: Liveness,
}

impl SinkContext {
    /// Runs `sink`'s delivery loop until shutdown, watched for progress.
    pub(crate) fn spawn_delivery<S: Sink>(&self, sink: S) -> JoinHandle<()> {
        let beat = self.liveness.register(
            &format!("sink {}", sink.name()),
            delivery::beat_period(sink.delivery()),
        );
        tokio::spawn(delivery::run_beating(
            sink,
            self.outbox.clone(),
            self.metrics.clone(),
            self.stop.clone(),
            Some(beat),
        ))
    }
}

/// Told of every task registration before it is answered, so that a sink
/// can learn what only the registering process shows (a Slurm sink asks
/// Slurm which job the caller's process is in). Bounded by the sink.
pub(crate) trait OnRegister: Send + Sync {
    /// `peer`: the caller's process, when it came over the local socket.
    fn registered<'a>(
        &'a self,
        task_id: &'a str,
        worker: Option<&'a str>,
        peer: Option<SeenProcess>,
    ) -> BoxFuture<'a, ()>;
}

/// What started sinks lend the rest of the agent: the one seam through
/// which the recorder, the daemon and the API use a sink's state without
/// naming a sink. A sink keeps its state in its own folder and lends a
/// handle to it here from [`Start::start`].
#[derive(Clone, Default)]
pub(crate) struct Lent {
    /// Given every event before it is stored (the Kubernetes sink's pod
    /// names, the Dask sink's worker addresses): `Recorder::enrich_with`.
    pub(crate) enrichers: Vec<Arc<dyn Enrich>>,
    /// Told of each task registration before the API answers it (the
    /// Slurm sink's job proofs).
    on_register: Vec<Arc<dyn OnRegister>>,
}

impl Lent {
    /// Lends `enricher` (given every event before it is stored).
    pub(crate) fn enricher(mut self, enricher: Arc<dyn Enrich>) -> Self {
        self.enrichers.push(enricher);
        self
    }

    /// Lends `hook` (told of each task registration).
    pub(crate) fn on_register(mut self, hook: Arc<dyn OnRegister>) -> Self {
        self.on_register.push(hook);
        self
    }

    fn extend(&mut self, other: Lent) {
        self.enrichers.extend(other.enrichers);
        self.on_register.extend(other.on_register);
    }

    /// Tells every sink that lent a hook that `task_id` was registered, one
    /// after another (each bounds its own wait).
    pub(crate) async fn task_registered(
        &self,
        task_id: &str,
        worker: Option<&str>,
        peer: Option<SeenProcess>,
    ) {
        for hook in &self.on_register {
            hook.registered(task_id, worker, peer).await;
        }
    }
}

/// A started sink: its tasks, and what it lends.
pub(crate) struct Started {
    pub tasks: Vec<JoinHandle<()>>,
    pub lent: Lent,
}

impl Started {
    /// A sink that lends nothing.
    pub(crate) fn tasks(tasks: Vec<JoinHandle<()>>) -> Self {
        Self {
            tasks,
            lent: Lent::default(),
        }
    }
}

/// What each sink's config type does besides being read.
pub(crate) trait Start {
    /// Label on metrics and key of the sink's cursor.
    fn name(&self) -> &str;
    /// Starts the sink: its delivery loop and any task of its own, and
    /// what it lends the rest of the agent.
    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started>;
    /// Checks the workers the sink's config names (`index`: its place
    /// among the sinks of its table); `declared`: whether a worker of that
    /// name is watched. Most sinks name none.
    fn check_workers(
        &self,
        _index: usize,
        _declared: &dyn Fn(&str) -> bool,
    ) -> Result<(), InvalidKey> {
        Ok(())
    }
}

/// The registry: each line names a config table and the sink's config type
/// (which implements [`Start`] and has `from_table(SinkTable)`).
/// The single-table sinks after `;` share their one `[table]` with other
/// settings (`[kubernetes]` also holds the pod-task keys, read by
/// config/kubernetes.rs, which hands the rest here): their config type has
/// `from_single(SinkTable) -> Result<Option<Self>, InvalidKey>` (`None`:
/// the table does not turn the sink on).
/// A line may start with attributes (`#[cfg(feature = "otlp")]`): they
/// apply to everything the macro makes of that line.
macro_rules! sinks {
    (
        $($(#[$meta:meta])* $table:literal => $variant:ident($config:ty)),+ ;
        $($(#[$smeta:meta])* $stable:literal => $single:ident($sconfig:ty)),* $(,)?
    ) => {
        /// One configured sink, of any kind.
        #[derive(Clone, Debug, PartialEq)]
        pub enum SinkConfig {
            $($(#[$meta])* $variant($config),)+
            $($(#[$smeta])* $single($sconfig),)*
        }

        /// The config file's sink tables: `[[webhook]]`, …
        pub(crate) const TABLES: &[&str] = &[$($(#[$meta])* $table),+];

        impl SinkConfig {
            /// Reads the `index`th `[[table]]`; `None` when `table` is no sink's.
            pub(crate) fn from_table(
                table: &str,
                index: usize,
                value: toml::Table,
            ) -> Option<Result<Self, InvalidKey>> {
                match table {
                    $($(#[$meta])* $table => Some(
                        <$config>::from_table(SinkTable::new($table, index, value))
                            .map(Self::$variant),
                    ),)+
                    _ => None,
                }
            }

            /// Reads the sink's keys of the one `[table]` (what is left of
            /// it once its other settings are taken out); `None` when no
            /// single-table sink of this build reads `table`.
            // `value` is unused in a build without any single-table sink.
            #[allow(unused_variables)]
            pub(crate) fn from_single(
                table: &str,
                value: toml::Table,
            ) -> Option<Result<Option<Self>, InvalidKey>> {
                match table {
                    $($(#[$smeta])* $stable => Some(
                        <$sconfig>::from_single(SinkTable::single($stable, value))
                            .map(|sink| sink.map(Self::$single)),
                    ),)*
                    _ => None,
                }
            }

            fn kind(&self) -> &dyn Start {
                match self {
                    $($(#[$meta])* Self::$variant(config) => config,)+
                    $($(#[$smeta])* Self::$single(config) => config,)*
                }
            }
        }
    };
}

sinks! {
    "webhook" => Webhook(WebhookConfig),
    #[cfg(feature = "nats")]
    "nats" => Nats(nats::NatsConfig),
    "dask" => Dask(DaskConfig),
    "slurm" => Slurm(SlurmConfig),
    #[cfg(feature = "otlp")]
    "otlp" => Otlp(otlp::OtlpConfig);
    #[cfg(feature = "kubernetes")]
    "kubernetes" => Kubernetes(kubernetes::KubernetesSinkConfig),
}

/// The sinks given on the command line: `--webhook URL`, repeatable. When
/// any is given they replace the file's `[[webhook]]`s, in order.
pub(crate) fn apply_flags(
    sinks: &mut Vec<SinkConfig>,
    webhooks: &[String],
) -> Result<(), InvalidKey> {
    if webhooks.is_empty() {
        return Ok(());
    }
    sinks.retain(|s| !matches!(s, SinkConfig::Webhook(_)));
    for (i, url) in webhooks.iter().enumerate() {
        sinks.push(SinkConfig::Webhook(WebhookConfig::from_flag(i, url)?));
    }
    Ok(())
}

/// Checks every sink's named workers against `declared` (the Slurm sink's
/// `nodes`): [`Start::check_workers`], with each sink's index in its table.
pub(crate) fn check_workers(
    sinks: &[SinkConfig],
    declared: &dyn Fn(&str) -> bool,
) -> Result<(), InvalidKey> {
    for (i, sink) in sinks.iter().enumerate() {
        let kind = std::mem::discriminant(sink);
        let index = sinks[..i]
            .iter()
            .filter(|s| std::mem::discriminant(*s) == kind)
            .count();
        sink.kind().check_workers(index, declared)?;
    }
    Ok(())
}

/// Sink tables this build was made without (their Cargo feature off):
/// (table, feature). A config that has one is refused by name, not read
/// as an unknown key.
pub(crate) const LEFT_OUT: &[(&str, &str)] = &[
    #[cfg(not(feature = "otlp"))]
    ("otlp", "otlp"),
    #[cfg(not(feature = "nats"))]
    ("nats", "nats"),
];

impl SinkConfig {
    pub fn name(&self) -> &str {
        self.kind().name()
    }

    pub(crate) fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started> {
        self.kind().start(ctx)
    }
}

/// Starts every configured sink: their tasks, and what they lend, of
/// which the enrichers are already given to `ctx.recorder`.
pub(crate) fn start_all(
    sinks: &[SinkConfig],
    ctx: &SinkContext,
) -> anyhow::Result<(Vec<JoinHandle<()>>, Lent)> {
    let mut tasks = Vec::new();
    let mut lent = Lent::default();
    for sink in sinks {
        let started = sink.start(ctx)?;
        tasks.extend(started.tasks);
        lent.extend(started.lent);
    }
    ctx.recorder.enrich_with(lent.enrichers.clone());
    Ok((tasks, lent))
}
