//! The agent at run time. [`Daemon::start`] opens the state directory and
//! starts the watchdog (the monitor), the sinks and the heartbeats;
//! [`Daemon::attach`] attaches the event source (the agent is ready then);
//! [`Daemon::run`] does the periodic work until a signal;
//! [`Daemon::shutdown`] detaches, drains and saves, in that order.
//! `cmd::run` serves the HTTP API beside it.

pub(crate) mod heartbeat;
mod kernel_caps;
mod kernel_figures;
pub(crate) mod monitor;
pub(crate) mod pipeline;
mod psi_triggers;
pub(crate) mod reconcile;
pub(crate) mod sampler;
mod source;
pub(crate) mod status;

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use anyhow::Context as _;
use prometheus::Registry;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, info, warn};

use self::{
    monitor::Monitor,
    pipeline::{PROBE_QUEUE, Pipeline},
    reconcile::{LiveKills, OomBook, OomScan},
    sampler::SystemReader,
    source::Source,
    status::StatusFn,
};
use crate::{
    cgroup::MemoryHierarchy,
    config::{Config, SourceChoice},
    model::{
        event::{EventBody, EventKind},
        source::SourceKind,
        spec::WorkerSpec,
    },
    outbox::{self, Outbox},
    probe::{counters::CounterPublisher, ebpf::ProbeError, privilege},
    record::Recorder,
    sinks::{self, ActionGate, Lent, SinkContext, WorkerEta, WorkerHealth},
    telemetry::{
        Metrics, heap,
        liveness::{Beat, IDLE_BEAT, Liveness},
    },
    watchdog::self_health::ProbeState,
};

/// How often the kernel-side counters are read into metrics and health,
/// and events held in memory are retried to disk.
const COUNTER_INTERVAL: Duration = Duration::from_secs(1);
/// How often the OOM counters of cgroups with a live kill are read again and
/// saved (for reconcile.rs): a kill seen live less than this long before a
/// crash may be reported again.
const OOM_COUNTS_INTERVAL: Duration = Duration::from_secs(5);
/// How often the OOM counters are checked as a safety net: those of the
/// cgroups accounted for (forgets removed ones); every memory cgroup's (a
/// walk of the whole hierarchy, costly with thousands of cgroups) only on a
/// kernel without the host-wide count, which otherwise says when a kill
/// went unreported ([`reconcile::OomBook::rescan`]). Walked in full at
/// start and at exit too.
const OOM_RESCAN_INTERVAL: Duration = Duration::from_secs(300);
/// How often expired events are removed from the outbox.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);
/// How often the heap's kept free memory is checked (and handed back past
/// `heap::KEEP_FREE_BYTES`): right after a sampling round, whose garbage
/// (a walk of /proc, thousands of usage reads on a full round) was just
/// freed.
const HEAP_INTERVAL: Duration = Duration::from_secs(5);
/// How long the pipeline and each sink may take to stop at shutdown.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub(crate) struct Daemon {
    config: Config,
    registry: Registry,
    metrics: Metrics,
    recorder: Recorder,
    hierarchy: MemoryHierarchy,
    monitor: Arc<Monitor>,
    probe_state: Arc<Mutex<ProbeState>>,
    status: StatusFn,
    /// Turns true at shutdown: sinks and heartbeats stop.
    stop_tasks: watch::Sender<bool>,
    /// Sinks and heartbeats.
    tasks: Vec<JoinHandle<()>>,
    /// The event source, once attached.
    source: Option<Source>,
    /// The OOM counters, once reconciled at attach.
    oom: Option<OomBook>,
    /// OOM kills reported live since the last check.
    live_kills: LiveKills,
    /// Whether each loop makes progress.
    liveness: Liveness,
    /// What the sinks lent (sinks/mod.rs): the API's registration hooks.
    lent: Lent,
}

impl Daemon {
    /// Everything but the kernel side: validates privileges, opens the
    /// state directory, finds the memory hierarchy, starts the monitor and
    /// the sinks. Fails with the key or capability to fix.
    pub(crate) async fn start(config: Config) -> anyhow::Result<Self> {
        // Before anything is created on disk: a run that cannot attach must
        // say why, not fail on a state directory it may not write either.
        let missing = privilege::missing_for_tracing();
        if config.source == SourceChoice::Ebpf && !missing.is_empty() {
            return Err(ProbeError::Privilege {
                missing: privilege::names(&missing),
            }
            .into());
        }
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).context("registering metrics")?;
        let outbox = open_outbox(&config, &metrics)?;
        let recorder = Recorder::new(outbox.clone(), metrics.clone());
        let hierarchy = MemoryHierarchy::discover()?;
        info!(root = %hierarchy.root.display(), version = %hierarchy.version, "memory cgroup hierarchy");

        let mut rules = config.rules.clone();
        if let Some(worker) = config.kubernetes.pod_worker(&config.workers)? {
            info!(%worker, "kubelet pods are tasks");
            rules.extend(crate::model::pod::pod_rules(&hierarchy.root, &worker));
        }
        let monitor = Arc::new(Monitor::new(
            config.workers.clone(),
            config.watchdog.clone(),
            rules,
            hierarchy.clone(),
            Arc::new(SystemReader),
            recorder.clone(),
        ));
        let restored = monitor.restore();
        if restored > 0 {
            info!(tasks = restored, "running tasks of the last run taken back");
        }
        let probe_state = Arc::new(Mutex::new(ProbeState::default()));
        let liveness = Liveness::default();
        outbox.watch_writer(&liveness);
        let status = status::agent_status(
            config.node_name.clone(),
            probe_state.clone(),
            outbox.clone(),
            monitor.clone(),
            liveness.clone(),
        );
        let (stop_tasks, tasks_stopped) = watch::channel(false);
        let workers = all_workers(&config);
        let gate = action_gate(&outbox, &workers);
        let sink_context = SinkContext {
            outbox,
            recorder: recorder.clone(),
            metrics: metrics.clone(),
            stop: tasks_stopped,
            node_name: config.node_name.clone(),
            state_dir: config.state_dir.clone(),
            workers,
            health: worker_health(&monitor),
            eta: worker_eta(&monitor),
            gate,
            liveness: liveness.clone(),
        };
        let (tasks, lent) = sinks::start_all(&config.sinks, &sink_context)?;
        Ok(Self {
            config,
            registry,
            metrics,
            recorder,
            hierarchy,
            monitor,
            probe_state,
            status,
            stop_tasks,
            tasks,
            source: None,
            oom: None,
            live_kills: LiveKills::default(),
            liveness,
            lent,
        })
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn outbox(&self) -> &Outbox {
        self.recorder.outbox()
    }

    pub(crate) fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    pub(crate) fn probe_state(&self) -> &Arc<Mutex<ProbeState>> {
        &self.probe_state
    }

    pub(crate) fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// What the sinks lent the rest of the agent.
    pub(crate) fn lent(&self) -> &Lent {
        &self.lent
    }

    pub(crate) fn status(&self) -> &StatusFn {
        &self.status
    }

    fn probe(&self) -> MutexGuard<'_, ProbeState> {
        self.probe_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Does the periodic work until `stop` resolves; [`Self::attach`] first.
    pub(crate) async fn run(
        &mut self,
        stop: impl Future<Output = &'static str>,
    ) -> anyhow::Result<()> {
        let mut expiry = tokio::time::interval(EXPIRY_INTERVAL);
        let mut oom_ticker = tokio::time::interval(OOM_COUNTS_INTERVAL);
        let mut oom_rescan =
            tokio::time::interval_at(Instant::now() + OOM_RESCAN_INTERVAL, OOM_RESCAN_INTERVAL);
        let mut ticker = tokio::time::interval(COUNTER_INTERVAL);
        let mut counters = CounterPublisher::new(self.config.bpf_stats);
        let beat = self.liveness.register("main loop", COUNTER_INTERVAL);
        tokio::pin!(stop);
        loop {
            beat.beat();
            tokio::select! {
                name = &mut stop => {
                    info!(signal = name, "shutting down");
                    return Ok(());
                }
                _ = ticker.tick() => {
                    let probe = self.source.as_ref().and_then(Source::probe);
                    let lost = counters.publish(probe, &self.metrics);
                    let newly_lost = self.probe().observe_ringbuf_drops(lost, Instant::now());
                    if newly_lost {
                        // A lost record may have been a cap crossing.
                        self.monitor.kernel_records_lost();
                    }
                    if let Some(oom) = &mut self.oom {
                        // A lost record may have been a kill; the host-wide
                        // count says whether any went unreported.
                        if newly_lost {
                            oom.owe_walk();
                        }
                        oom.watch_host(self.live_kills.pending());
                    }
                    self.outbox().tick();
                }
                _ = expiry.tick() => self.outbox().expire(chrono::Utc::now()),
                _ = oom_ticker.tick() => {
                    let live = self.live_kills.take();
                    if let Some(oom) = &mut self.oom {
                        let scan = oom.to_read(&live.0);
                        oom.live(live);
                        if let Some(scan) = scan {
                            oom.check(&self.recorder, scan).await;
                        }
                    }
                }
                _ = oom_rescan.tick() => {
                    if let Some(oom) = &mut self.oom {
                        oom.rescan();
                    }
                }
            }
        }
    }

    /// Starts the event source (see source.rs), says so in `/health`, the
    /// metrics and an `agent_started` event, reconciles the OOM counters,
    /// and starts the pipeline, the heartbeats and the sampling loop. Once it
    /// returns `/ready` answers 200; the answer says what runs.
    pub(crate) async fn attach(&mut self) -> anyhow::Result<String> {
        let (tx, rx) = mpsc::channel(PROBE_QUEUE);
        let baseline = OomBook::baseline(&self.hierarchy).await?;
        let mut source = Source::start(&self.config, &self.hierarchy, tx, &self.liveness).await?;
        let (kind, attach) = source.describe();
        {
            let mut state = self.probe();
            state.source = Some(kind);
            state.attach = Some(attach);
            state.ebpf_unavailable = source.ebpf_unavailable.clone();
            state.growth_unavailable = source.growth_unavailable();
        }
        self.metrics.probe_ready.set(1);
        self.metrics
            .probe_source
            .with_label_values(&[kind.as_str()])
            .set(1);

        let mut started = EventBody::new(EventKind::AgentStarted);
        started.reason = Some(started_reason(
            kind,
            attach,
            self.outbox().status().set_aside.as_deref(),
        ));
        self.recorder.record(started, None);
        self.oom = Some(OomBook::open(baseline, &self.recorder));
        self.tasks.push(tokio::spawn(heartbeat::run(
            self.recorder.clone(),
            self.config.heartbeat_interval,
            self.status.clone(),
            self.stop_tasks.subscribe(),
        )));
        let pipeline = Pipeline {
            monitor: self.monitor.clone(),
            recorder: self.recorder.clone(),
            live_kills: self.live_kills.clone(),
        };
        let beat = self.liveness.register("pipeline", IDLE_BEAT);
        source.pipeline = Some(tokio::spawn(pipeline.run(rx, beat)));
        if let Some(watch) = source.probe().and_then(|p| p.kernel_watch()) {
            self.monitor.attach_kernel_watch(watch);
        }
        let beat = self
            .liveness
            .register("sampler", self.config.sample_interval);
        let triggers = psi_triggers::arm(&all_workers(&self.config));
        source.sampling = Some(tokio::spawn(sample_forever(
            self.monitor.clone(),
            self.config.sample_interval,
            triggers,
            beat,
        )));
        self.source = Some(source);
        Ok(format!("ready: source {} ({})", kind.as_str(), attach))
    }

    /// Detaches first so nothing new arrives, drains what is queued, stops
    /// the sinks between attempts (what they had not delivered is sent at
    /// the next start: their cursors are in the state directory), and saves
    /// the OOM counters and any event held in memory.
    pub(crate) async fn shutdown(mut self) {
        if let Some(source) = self.source.take() {
            source.stop().await;
        }
        let _ = self.stop_tasks.send(true);
        for task in self.tasks {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, task).await;
        }
        if let Some(oom) = &mut self.oom {
            oom.live(self.live_kills.take());
            oom.check(&self.recorder, OomScan::Full).await;
        }
        let outbox = self.recorder.outbox();
        if !outbox.maintain() {
            warn!(
                pending = outbox.status().pending,
                "events held in memory are lost: the state directory is still not writable"
            );
        }
    }
}

fn open_outbox(config: &Config, metrics: &Metrics) -> anyhow::Result<Outbox> {
    let limits = outbox::Limits {
        max_events: config.outbox_capacity as u64,
        max_bytes: config.outbox_max_bytes,
        max_age: config.outbox_max_age,
        ..outbox::Limits::default()
    };
    let outbox = Outbox::open(
        &config.state_dir,
        config.node_name.clone(),
        limits,
        metrics.clone(),
    )
    .with_context(|| {
        format!(
            "state directory {} is unusable (--state-dir / `state_dir`)",
            config.state_dir.display()
        )
    })?;
    info!(state_dir = %config.state_dir.display(), last_seq = outbox.status().last_seq, "outbox open");
    Ok(outbox)
}

/// The `agent_started` reason: the version, the event source, and the
/// state set aside at this start (`set_aside`, as `/health` says it).
fn started_reason(kind: SourceKind, attach: &str, set_aside: Option<&str>) -> String {
    let mut reason = format!(
        "memwatch {} started; source {kind} ({attach})",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(what) = set_aside {
        reason.push_str("; state lost: ");
        reason.push_str(what);
    }
    reason
}

/// The sinks' action gate: closed for the largest `recover_after` of the
/// workers after a start that set the outbox database aside (see
/// [`ActionGate`]), open otherwise.
fn action_gate(outbox: &Outbox, workers: &[WorkerSpec]) -> ActionGate {
    let Some(set_aside) = outbox.set_aside() else {
        return ActionGate::open();
    };
    let window = workers
        .iter()
        .map(|w| w.recover_after)
        .max()
        .unwrap_or(crate::model::spec::DEFAULT_RECOVER_AFTER);
    warn!(
        window_s = window.as_secs(),
        "scheduler actions held back after the state loss"
    );
    ActionGate::closed_for(
        window,
        format!(
            "the outbox database was corrupt and set aside as {}",
            set_aside.aside.display()
        ),
    )
}

/// Each worker's health now, for the sinks' re-check before they act.
fn worker_health(monitor: &Arc<Monitor>) -> WorkerHealth {
    let monitor = Arc::clone(monitor);
    Arc::new(move |name| {
        monitor
            .workers()
            .into_iter()
            .find(|w| w.name == name)
            .map(|w| w.status)
    })
}

/// Each worker's predicted kill now, for the sinks that act on one.
fn worker_eta(monitor: &Arc<Monitor>) -> WorkerEta {
    let monitor = Arc::clone(monitor);
    Arc::new(move |name| monitor.worker_eta(name))
}

/// Every worker: with no `[[worker]]`, the whole host is the one worker.
fn all_workers(config: &Config) -> Arc<[WorkerSpec]> {
    if config.workers.is_empty() {
        vec![WorkerSpec::host()].into()
    } else {
        config.workers.clone().into()
    }
}

/// Reads worker and task memory every `interval`, and at once when the
/// kernel says so (a soft cap crossed, a PSI trigger of `triggers`), and
/// runs the checks. The file reads block, so each round runs on the
/// blocking pool; a slow round delays the next instead of piling up.
async fn sample_forever(
    monitor: Arc<Monitor>,
    interval: Duration,
    triggers: Vec<(String, std::fs::File)>,
    beat: Beat,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Cgroups within half of a limit, for the kill predictor.
    let mut fast = tokio::time::interval(monitor::FAST_INTERVAL);
    fast.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let now = monitor.sample_now();
    // Dropped (their tasks aborted) with this future.
    let _triggers = psi_triggers::spawn(triggers, now.clone());
    let mut heap_checked = Instant::now();
    loop {
        beat.beat();
        tokio::select! {
            _ = ticker.tick() => {}
            // A cap crossed in the kernel, or a PSI trigger: look now.
            _ = now.notified() => {}
            _ = fast.tick(), if monitor.any_near_a_limit() => {
                let monitor = monitor.clone();
                if let Err(error) = tokio::task::spawn_blocking(move || monitor.fast_tick()).await {
                    warn!(%error, "fast sampling round failed");
                }
                continue;
            }
        }
        let monitor = monitor.clone();
        let check_heap = heap_checked.elapsed() >= HEAP_INTERVAL;
        if check_heap {
            heap_checked = Instant::now();
        }
        let round = tokio::task::spawn_blocking(move || {
            monitor.tick();
            if check_heap {
                heap::release_if_kept()
            } else {
                None
            }
        });
        match round.await {
            Ok(Some(bytes)) => debug!(bytes, "freed memory handed back to the kernel"),
            Ok(None) => {}
            Err(error) => warn!(%error, "sampling round failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(&Registry::new()).unwrap()
    }

    /// An outbox whose database was corrupt: the start says so in
    /// `agent_started`, `/health` (degraded, naming the file set aside)
    /// and the metrics, and holds scheduler actions back.
    #[tokio::test(start_paused = true)]
    async fn a_corrupt_outbox_reaches_health_agent_started_and_the_gate() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(outbox::store::FILE_NAME), [0x5a_u8; 8192]).unwrap();
        let metrics = metrics();
        let outbox =
            Outbox::open(dir.path(), "h1", outbox::Limits::default(), metrics.clone()).unwrap();
        let aside = outbox.set_aside().unwrap().aside.clone();
        assert!(aside.exists());
        let name = aside.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("outbox.sqlite.corrupt-"), "{name}");
        assert_eq!(
            metrics
                .state_quarantined
                .with_label_values(&["outbox"])
                .get(),
            1
        );

        let status = outbox.status();
        let verdict = status::overall(
            &crate::watchdog::self_health::ProbeState {
                source: Some(SourceKind::Ebpf),
                ..Default::default()
            },
            &status,
            &[],
            &[],
        );
        assert_eq!(verdict.status, crate::model::health::Health::Degraded);
        assert!(
            verdict
                .reasons
                .iter()
                .any(|r| r.starts_with("state lost:") && r.contains(&name)),
            "{verdict:?}"
        );

        let started = started_reason(SourceKind::Ebpf, "tp_btf", status.set_aside.as_deref());
        assert!(
            started.contains("state lost:") && started.contains(&name),
            "{started}"
        );
        assert!(!started_reason(SourceKind::Ebpf, "tp_btf", None).contains("state lost"));

        let workers = [WorkerSpec {
            recover_after: Duration::from_secs(90),
            ..WorkerSpec::host()
        }];
        let gate = action_gate(&outbox, &workers);
        let why = gate.holds().unwrap();
        assert!(why.contains("within 90s") && why.contains(&name), "{why}");
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(gate.holds(), None);
    }
}
