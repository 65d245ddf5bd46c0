//! `memwatch run`: wires the probe, the pipeline, the outbox and the API,
//! and shuts them down in order.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use agent_common::ProbeCounter;
use anyhow::Context as _;
use prometheus::Registry;
use tokio::{net::TcpListener, sync::mpsc, time::Instant};
use tracing::{info, warn};

use crate::{
    api::{self, AppState},
    cgroup::MemoryHierarchy,
    config::Config,
    event::{EventBody, EventKind},
    monitor::Monitor,
    pipeline::{PROBE_QUEUE, Pipeline},
    probe::{SourceKind, ebpf::EbpfProbe},
    sampler::SystemReader,
    shipper::outbox::Outbox,
    telemetry::Metrics,
    watchdog::self_health::ProbeState,
};

/// How often the kernel-side counters are read into metrics and health.
const COUNTER_INTERVAL: Duration = Duration::from_secs(1);
/// How long open HTTP requests may finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub async fn run(config: Config) -> anyhow::Result<()> {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).context("registering metrics")?;
    let hierarchy = MemoryHierarchy::discover()?;
    info!(root = %hierarchy.root.display(), version = %hierarchy.version, "memory cgroup hierarchy");

    let outbox = Outbox::new(
        config.node_name.clone(),
        config.outbox_capacity,
        metrics.clone(),
    );
    let monitor = Arc::new(Monitor::new(
        config.workers.clone(),
        config.watchdog.clone(),
        config.rules.clone(),
        hierarchy,
        Arc::new(SystemReader),
        outbox.clone(),
        metrics.clone(),
    ));
    let probe_state = Arc::new(Mutex::new(ProbeState::default()));
    let app = AppState {
        outbox: outbox.clone(),
        registry,
        probe: probe_state.clone(),
        monitor: monitor.clone(),
        api_token: config.api_token.as_deref().map(Arc::from),
    };
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

    let btf_path = config.btf_path.clone();
    let mut probe = tokio::task::spawn_blocking(move || EbpfProbe::load(&btf_path))
        .await
        .context("probe loader panicked")??;
    let (tx, rx) = mpsc::channel(PROBE_QUEUE);
    let reader = probe.spawn_reader(tx)?;
    let attach = probe.attach_kind().as_str();
    {
        let mut state = probe_state.lock().unwrap_or_else(|e| e.into_inner());
        state.source = Some(SourceKind::Ebpf);
        state.attach = Some(attach);
    }
    metrics.probe_ready.set(1);
    metrics
        .probe_source
        .with_label_values(&[SourceKind::Ebpf.as_str()])
        .set(1);

    let mut started = EventBody::new(EventKind::AgentStarted);
    started.reason = Some(format!(
        "memwatch {} started; source ebpf ({attach})",
        env!("CARGO_PKG_VERSION")
    ));
    outbox.append(started, None);

    let pipeline = tokio::spawn(
        Pipeline {
            monitor: monitor.clone(),
            outbox,
            metrics: metrics.clone(),
        }
        .run(rx),
    );
    let sampling = tokio::spawn(sample_forever(monitor, config.sample_interval));

    let mut ticker = tokio::time::interval(COUNTER_INTERVAL);
    let mut last = [0u64; ProbeCounter::COUNT as usize];
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            name = &mut signal => {
                info!(signal = name?, "shutting down");
                break;
            }
            _ = ticker.tick() => {
                let now = probe.kernel_counters();
                publish_counters(&metrics, &last, &now);
                probe_state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .observe_ringbuf_drops(now[ProbeCounter::RingbufFull as usize], Instant::now());
                last = now;
            }
        }
    }

    // Detach first so nothing new arrives, then drain what is queued.
    sampling.abort();
    reader.abort();
    drop(probe);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, pipeline).await;
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
async fn sample_forever(monitor: Arc<Monitor>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let monitor = monitor.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || monitor.tick()).await {
            warn!(%error, "sampling round failed");
        }
    }
}

/// Moves the kernel counters' growth into the Prometheus counters.
fn publish_counters(metrics: &Metrics, last: &[u64], now: &[u64]) {
    for ((counter, before), after) in ProbeCounter::ALL.iter().zip(last).zip(now) {
        let delta = after.saturating_sub(*before);
        if delta == 0 {
            continue;
        }
        let name = match counter {
            ProbeCounter::OomSeen => "oom_seen",
            ProbeCounter::RingbufFull => {
                metrics
                    .events_dropped
                    .with_label_values(&["ringbuf_full"])
                    .inc_by(delta);
                "ringbuf_full"
            }
            ProbeCounter::ReadErrors => "read_errors",
        };
        metrics
            .probe_kernel
            .with_label_values(&[name])
            .inc_by(delta);
    }
}

/// Resolves with the signal's name on SIGTERM or SIGINT.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
