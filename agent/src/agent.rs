//! `memwatch run`: wires the probe, the pipeline, the outbox and the API,
//! and shuts them down in order.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_common::ProbeCounter;
use anyhow::Context as _;
use prometheus::Registry;
use tokio::{
    net::TcpListener,
    sync::{mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{info, warn};

use crate::{
    api::{self, AppState},
    cgroup::MemoryHierarchy,
    config::{Config, SourceChoice},
    heartbeat,
    model::event::{EventBody, EventKind},
    model::source::SourceKind,
    model::spec::WorkerSpec,
    monitor::Monitor,
    outbox::{self, Outbox},
    pipeline::{PROBE_QUEUE, Pipeline},
    probe::{
        ProbeEvent,
        ebpf::{EbpfProbe, ProbeError, ProbeOptions},
        poll, privilege,
    },
    reconcile,
    record::Recorder,
    sampler::SystemReader,
    sinks::{self, SinkContext, dask::names::SchedulerNames},
    status,
    telemetry::Metrics,
    watchdog::self_health::ProbeState,
};

/// How often the kernel-side counters are read into metrics and health,
/// and events held in memory are retried to disk.
const COUNTER_INTERVAL: Duration = Duration::from_secs(1);
/// How often the OOM counters of cgroups with a live kill are read again and
/// saved (for reconcile.rs): a kill seen live less than this long before a
/// crash may be reported again.
const OOM_COUNTS_INTERVAL: Duration = Duration::from_secs(5);
/// How often every memory cgroup's OOM counter is read (a walk of the whole
/// hierarchy, costly with thousands of cgroups): picks up kills no live
/// event named and forgets removed cgroups. Also done at start and at exit.
const OOM_RESCAN_INTERVAL: Duration = Duration::from_secs(300);
/// How often expired events are removed from the outbox.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);
/// How long open HTTP requests may finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub async fn run(config: Config) -> anyhow::Result<()> {
    // Before anything is created on disk: a run that cannot attach must say
    // why, not fail on a state directory it may not write either.
    let missing = privilege::missing_for_tracing();
    if config.source == SourceChoice::Ebpf && !missing.is_empty() {
        return Err(ProbeError::Privilege {
            missing: privilege::names(&missing),
        }
        .into());
    }
    let signal = shutdown_signal()?;
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).context("registering metrics")?;
    let limits = outbox::Limits {
        max_events: config.outbox_capacity as u64,
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
        outbox.clone(),
        metrics.clone(),
    ));
    let probe_state = Arc::new(Mutex::new(ProbeState::default()));
    let state_fn = status::agent_state(
        config.node_name.clone(),
        probe_state.clone(),
        outbox.clone(),
        monitor.clone(),
    );
    let app = AppState {
        outbox: outbox.clone(),
        registry,
        probe: probe_state.clone(),
        monitor: monitor.clone(),
        api_token: config.api_token.as_deref().map(Arc::from),
        status: state_fn.clone(),
    };
    let (stop_shipping, shipping_stopped) = watch::channel(false);
    let names = SchedulerNames::default();
    // With no [[worker]], the whole host is the one worker (see the watchdog).
    let workers: Arc<[WorkerSpec]> = if config.workers.is_empty() {
        vec![WorkerSpec::host()].into()
    } else {
        config.workers.clone().into()
    };
    let sink_context = SinkContext {
        outbox: outbox.clone(),
        recorder: recorder.clone(),
        metrics: metrics.clone(),
        stop: shipping_stopped.clone(),
        node_name: config.node_name.clone(),
        state_dir: config.state_dir.clone(),
        workers,
        names: names.clone(),
    };
    let mut shippers: Vec<JoinHandle<()>> = sinks::start_all(&config.sinks, &sink_context)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen / `listen`)", config.listen))?;
    info!(listen = %config.listen, "API listening");
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, api::router(app))
            .with_graceful_shutdown(async {
                let _ = server_stopped.await;
            })
            .into_future(),
    );

    let (tx, rx) = mpsc::channel(PROBE_QUEUE);
    let (probe, reader, ebpf_error) = start_source(&config, &hierarchy, tx).await?;
    let (source, attach) = match &probe {
        Some(p) => (SourceKind::Ebpf, p.attach_kind().as_str()),
        None => (SourceKind::Poll, "cgroup files"),
    };
    {
        let mut state = probe_state.lock().unwrap_or_else(|e| e.into_inner());
        state.source = Some(source);
        state.attach = Some(attach);
        state.ebpf_unavailable = ebpf_error;
    }
    metrics.probe_ready.set(1);
    metrics
        .probe_source
        .with_label_values(&[source.as_str()])
        .set(1);

    let mut started = EventBody::new(EventKind::AgentStarted);
    started.reason = Some(format!(
        "memwatch {} started; source {source} ({attach})",
        env!("CARGO_PKG_VERSION")
    ));
    outbox.append(started, None);
    // After the probe is attached: a kill in between is reported twice
    // (live and recovered) rather than not at all.
    let (mut oom_counts, mut oom_unsaved) =
        report_missed_oom_kills(&hierarchy, &outbox, &metrics).await?;
    shippers.push(tokio::spawn(heartbeat::run(
        outbox.clone(),
        config.heartbeat_interval,
        state_fn,
        shipping_stopped.clone(),
    )));

    let pipeline = tokio::spawn(
        Pipeline {
            monitor: monitor.clone(),
            outbox: outbox.clone(),
            metrics: metrics.clone(),
            names,
        }
        .run(rx),
    );
    if let Some(watch) = probe.as_ref().and_then(EbpfProbe::kernel_watch) {
        monitor.attach_kernel_watch(watch);
    }
    if let Some(reason) = probe.as_ref().and_then(EbpfProbe::growth_unavailable) {
        probe_state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .growth_unavailable = Some(reason.to_string());
    }
    let sampling = tokio::spawn(sample_forever(monitor.clone(), config.sample_interval));

    let mut expiry = tokio::time::interval(EXPIRY_INTERVAL);
    let mut oom_ticker = tokio::time::interval(OOM_COUNTS_INTERVAL);
    let mut oom_rescan =
        tokio::time::interval_at(Instant::now() + OOM_RESCAN_INTERVAL, OOM_RESCAN_INTERVAL);
    let mut ticker = tokio::time::interval(COUNTER_INTERVAL);
    let mut last = [0u64; ProbeCounter::COUNT as usize];
    let mut last_runs: HashMap<String, (u64, u64)> = HashMap::new();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            name = &mut signal => {
                info!(signal = name, "shutting down");
                break;
            }
            _ = ticker.tick() => {
                let now = probe.as_ref().map(EbpfProbe::kernel_counters).unwrap_or_default();
                if config.bpf_stats
                    && let Some(probe) = &probe
                {
                    publish_program_stats(&metrics, &mut last_runs, probe.program_stats());
                }
                publish_counters(&metrics, &last, &now);
                probe_state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .observe_ringbuf_drops(now[ProbeCounter::RingbufFull as usize], Instant::now());
                last = now;
                outbox.maintain();
            }
            _ = expiry.tick() => outbox.prune_expired(chrono::Utc::now()),
            _ = oom_ticker.tick() => {
                let killed = monitor.take_oom_cgroups();
                if !killed.is_empty() || oom_unsaved {
                    save_oom_counts(&outbox, &mut oom_counts, &mut oom_unsaved, OomScan::Cgroups(killed)).await;
                }
            }
            _ = oom_rescan.tick() => {
                save_oom_counts(&outbox, &mut oom_counts, &mut oom_unsaved, OomScan::Full).await;
            }
        }
    }

    // Detach first so nothing new arrives, then drain what is queued.
    sampling.abort();
    reader.abort();
    drop(probe);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, pipeline).await;
    // Sinks stop between attempts; what they had not delivered is sent at
    // the next start (their cursors are in the state directory).
    let _ = stop_shipping.send(true);
    for task in shippers {
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, task).await;
    }
    save_oom_counts(&outbox, &mut oom_counts, &mut oom_unsaved, OomScan::Full).await;
    if !outbox.maintain() {
        warn!(
            pending = outbox.status().pending,
            "events held in memory are lost: the state directory is still not writable"
        );
    }
    let _ = stop_server.send(());
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(result) => result.context("API server task")?.context("API server")?,
        Err(_) => {
            warn!(grace = ?SHUTDOWN_GRACE, "API connections still open at the end of the grace period")
        }
    }
    info!("stopped");
    Ok(())
}

/// Reads worker and task memory every `interval` and runs the checks. The
/// file reads block, so each round runs on the blocking pool; a slow round
/// delays the next instead of piling up.
/// Starts the event source the configuration asks for: eBPF, the poll
/// fallback, or eBPF falling back to polling when it cannot load (then the
/// third value says why).
async fn start_source(
    config: &Config,
    hierarchy: &MemoryHierarchy,
    tx: mpsc::Sender<ProbeEvent>,
) -> anyhow::Result<(Option<EbpfProbe>, JoinHandle<()>, Option<String>)> {
    if config.source == SourceChoice::Poll {
        info!("source poll (configured)");
        return Ok((
            None,
            poll::spawn(hierarchy.clone(), poll::DEFAULT_INTERVAL, tx),
            None,
        ));
    }
    let btf_path = config.btf_path.clone();
    let options = ProbeOptions {
        growth: config.growth_settings(),
        floor: config.probe_floor,
        oom_by_pid: config.probe_oom_by_pid,
        stats: config.bpf_stats,
    };
    let loaded = tokio::task::spawn_blocking(move || EbpfProbe::load(&btf_path, &options))
        .await
        .context("probe loader panicked")?;
    match (loaded, config.source) {
        (Ok(mut probe), _) => {
            let reader = probe.spawn_reader(tx)?;
            Ok((Some(probe), reader, None))
        }
        (Err(error), SourceChoice::Auto) => {
            warn!(%error, "eBPF unavailable: falling back to polling the cgroup files");
            let reader = poll::spawn(hierarchy.clone(), poll::DEFAULT_INTERVAL, tx);
            Ok((None, reader, Some(error.to_string())))
        }
        (Err(error), _) => Err(error.into()),
    }
}

async fn sample_forever(monitor: Arc<Monitor>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let now = monitor.sample_now();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            // A cap crossed in the kernel: look now.
            _ = now.notified() => {}
        }
        let monitor = monitor.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || monitor.tick()).await {
            warn!(%error, "sampling round failed");
        }
    }
}

/// Reports the OOM kills the kernel counted while the agent was down, saves
/// the counters, and returns them (and true when the save failed).
async fn report_missed_oom_kills(
    hierarchy: &MemoryHierarchy,
    outbox: &Outbox,
    metrics: &Metrics,
) -> anyhow::Result<(reconcile::OomCounters, bool)> {
    let h = hierarchy.clone();
    let counts = tokio::task::spawn_blocking(move || crate::cgroup::oom::read_oom_counts(&h))
        .await
        .context("reading OOM counters")?;
    let saved = outbox.saved_oom_counts();
    for body in reconcile::recovered_kills(saved.as_ref(), &counts) {
        metrics.oom_kills.inc();
        let event = outbox.append(body, None);
        warn!(
            seq = event.seq,
            cgroup = event.body.cgroup.as_deref().unwrap_or("?"),
            reason = event.body.reason.as_deref().unwrap_or(""),
            "OOM kill while the agent was not running"
        );
    }
    let counters = reconcile::OomCounters::new(hierarchy.clone(), counts);
    let saved = outbox.save_oom_counts(counters.counts());
    Ok((counters, !saved))
}

/// Which OOM counters to read before saving.
enum OomScan {
    /// Those of the cgroups where kills were seen.
    Cgroups(BTreeSet<PathBuf>),
    /// Every memory cgroup's.
    Full,
}

/// Reads the OOM counters `scan` names and saves them when they changed
/// (or an earlier save failed: `unsaved`).
async fn save_oom_counts(
    outbox: &Outbox,
    counters: &mut reconcile::OomCounters,
    unsaved: &mut bool,
    scan: OomScan,
) {
    let mut copy = counters.clone();
    let read = tokio::task::spawn_blocking(move || {
        let changed = match &scan {
            OomScan::Cgroups(cgroups) => copy.refresh(cgroups),
            OomScan::Full => copy.rescan(),
        };
        (copy, changed)
    })
    .await;
    let Ok((copy, changed)) = read else {
        return;
    };
    *counters = copy;
    *unsaved |= changed;
    if *unsaved && outbox.save_oom_counts(counters.counts()) {
        *unsaved = false;
    }
}

/// Moves the programs' run counts and times into the metrics.
fn publish_program_stats(
    metrics: &Metrics,
    last: &mut HashMap<String, (u64, u64)>,
    now: Vec<(String, u64, u64)>,
) {
    for (name, runs, nanos) in now {
        let (runs_before, nanos_before) = last.get(&name).copied().unwrap_or_default();
        metrics
            .program_runs
            .with_label_values(&[name.as_str()])
            .inc_by(runs.saturating_sub(runs_before));
        metrics
            .program_run_seconds
            .with_label_values(&[name.as_str()])
            .inc_by(nanos.saturating_sub(nanos_before) as f64 / 1e9);
        last.insert(name, (runs, nanos));
    }
}

/// Moves the kernel counters' growth into the Prometheus counters.
fn publish_counters(metrics: &Metrics, last: &[u64], now: &[u64]) {
    for ((counter, before), after) in ProbeCounter::ALL.iter().zip(last).zip(now) {
        let delta = after.saturating_sub(*before);
        if delta == 0 {
            continue;
        }
        if *counter == ProbeCounter::RingbufFull {
            metrics
                .events_dropped
                .with_label_values(&["ringbuf_full"])
                .inc_by(delta);
        }
        metrics
            .probe_kernel
            .with_label_values(&[counter.name()])
            .inc_by(delta);
    }
}

/// Installs the SIGTERM and SIGINT handlers now (a signal that comes
/// before the main loop is kept, not fatal); the future resolves with the
/// signal's name.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
