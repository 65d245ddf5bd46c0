//! Where events go after the outbox: the [`Sink`](delivery::Sink) trait and
//! the one delivery loop every sink runs (delivery.rs), the cluster guard
//! of the sinks that act on a scheduler (guard.rs), and one folder per sink
//! that owns its config type: webhook, nats, dask, slurm, kubernetes, otlp
//! (OpenTelemetry, behind the Cargo feature `otlp`).
//!
//! Adding a sink touches its own folder and one line of [`sinks!`] below
//! (docs/writing-a-sink.md).

pub(crate) mod action;
pub(crate) mod config;
pub(crate) mod dask;
pub(crate) mod delivery;
pub(crate) mod guard;
pub(crate) mod kubernetes;
pub(crate) mod nats;
#[cfg(feature = "otlp")]
pub(crate) mod otlp;
pub(crate) mod slurm;
pub(crate) mod webhook;

use std::{path::PathBuf, sync::Arc};

use tokio::{sync::watch, task::JoinHandle};

use self::{
    config::{InvalidKey, SinkTable},
    dask::{DaskConfig, names::SchedulerNames},
    delivery::Sink,
    kubernetes::KubernetesSinkConfig,
    nats::NatsConfig,
    slurm::SlurmConfig,
    webhook::WebhookConfig,
};
use crate::{
    model::{
        event::{EventBody, EventKind},
        health::Health,
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
pub struct SinkContext {
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
    /// Scheduler names of processes, filled by the Dask sinks.
    pub names: SchedulerNames,
    /// Each worker's health now.
    pub(crate) health: WorkerHealth,
    /// Each worker's predicted kill now.
    pub(crate) eta: WorkerEta,
    /// Whether scheduler actions are held back (after a state loss).
    pub(crate) gate: ActionGate,
    /// Where the sinks' loops say they make progress.
    pub(crate) liveness: Liveness,
    /// Which Slurm job each task's process is in, as Slurm says it (filled
    /// at registration by the API; read by the Slurm sink's requeues).
    pub(crate) job_proofs: Option<slurm::JobProofs>,
}

impl SinkContext {
    /// Runs `sink`'s delivery loop until shutdown, watched for progress.
    pub fn spawn_delivery<S: Sink>(&self, sink: S) -> JoinHandle<()> {
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

/// What each sink's config type does besides being read.
pub(crate) trait Start {
    /// Label on metrics and key of the sink's cursor.
    fn name(&self) -> &str;
    /// Starts the sink: its delivery loop and any task of its own.
    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Vec<JoinHandle<()>>>;
}

/// The registry: each line names a config table and the sink's config type
/// (which implements [`Start`] and has `from_table(SinkTable)`).
/// The single-table sinks after `;` are read by their own table's reader
/// (`[kubernetes]`: config/kubernetes.rs), not as `[[table]]`s.
/// A line may start with attributes (`#[cfg(feature = "otlp")]`): they
/// apply to everything the macro makes of that line.
macro_rules! sinks {
    ($($(#[$meta:meta])* $table:literal => $variant:ident($config:ty)),+ ; $($single:ident($sconfig:ty)),* $(,)?) => {
        /// One configured sink, of any kind.
        #[derive(Clone, Debug, PartialEq)]
        pub enum SinkConfig {
            $($(#[$meta])* $variant($config),)+
            $($single($sconfig),)*
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

            fn kind(&self) -> &dyn Start {
                match self {
                    $($(#[$meta])* Self::$variant(config) => config,)+
                    $(Self::$single(config) => config,)*
                }
            }
        }
    };
}

sinks! {
    "webhook" => Webhook(WebhookConfig),
    "nats" => Nats(NatsConfig),
    "dask" => Dask(DaskConfig),
    "slurm" => Slurm(SlurmConfig),
    #[cfg(feature = "otlp")]
    "otlp" => Otlp(otlp::OtlpConfig);
    Kubernetes(KubernetesSinkConfig),
}

/// Sink tables this build was made without (their Cargo feature off):
/// (table, feature). A config that has one is refused by name, not read
/// as an unknown key.
pub(crate) const LEFT_OUT: &[(&str, &str)] = &[
    #[cfg(not(feature = "otlp"))]
    ("otlp", "otlp"),
];

impl SinkConfig {
    pub fn name(&self) -> &str {
        self.kind().name()
    }

    pub fn start(&self, ctx: &SinkContext) -> anyhow::Result<Vec<JoinHandle<()>>> {
        self.kind().start(ctx)
    }
}

/// Starts every configured sink.
pub(crate) fn start_all(
    sinks: &[SinkConfig],
    ctx: &SinkContext,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for sink in sinks {
        tasks.extend(sink.start(ctx)?);
    }
    Ok(tasks)
}
