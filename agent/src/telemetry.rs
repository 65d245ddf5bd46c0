//! Logs and metrics: one convention for both.
//!
//! Metric names are constants here; labels are low-cardinality (event kind,
//! drop reason, probe counter), never a pid or a cgroup. The registry is
//! made in `main` and passed down.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tracing_subscriber::EnvFilter;

pub const OOM_KILLS_TOTAL: &str = "memwatch_oom_kills_total";
pub const EVENTS_TOTAL: &str = "memwatch_events_total";
pub const EVENTS_DROPPED_TOTAL: &str = "memwatch_events_dropped_total";
pub const PROBE_READY: &str = "memwatch_probe_ready";
pub const PROBE_SOURCE: &str = "memwatch_probe_source";
pub const PROBE_KERNEL_TOTAL: &str = "memwatch_probe_kernel_total";
pub const BUILD_INFO: &str = "memwatch_build_info";
pub const OUTBOX_STORED: &str = "memwatch_outbox_stored_events";
pub const OUTBOX_PENDING: &str = "memwatch_outbox_pending_events";
pub const OUTBOX_UNPERSISTED_TOTAL: &str = "memwatch_outbox_unpersisted_total";
pub const SINK_DELIVERED_TOTAL: &str = "memwatch_sink_delivered_total";
pub const SINK_RETRIES_TOTAL: &str = "memwatch_sink_retries_total";
pub const SINK_FAILURES_TOTAL: &str = "memwatch_sink_failures_total";
pub const SINK_BACKLOG: &str = "memwatch_sink_backlog_events";

/// Starts `tracing` to stderr. `RUST_LOG` wins over `default_level`.
pub fn init_logging(default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Every metric the agent exports. Cheap to clone (handles are shared).
#[derive(Clone)]
pub struct Metrics {
    pub oom_kills: IntCounter,
    /// Events appended to the outbox, by kind.
    pub events: IntCounterVec,
    /// Events lost, by reason (`outbox_full`, `ringbuf_full`, …).
    pub events_dropped: IntCounterVec,
    /// 1 once the probe is attached and its reader runs.
    pub probe_ready: IntGauge,
    /// 1 for the event source in use (`ebpf` or `poll`).
    pub probe_source: IntGaugeVec,
    /// The eBPF programs' own counters, by name (oom_seen, ringbuf_full, read_errors).
    pub probe_kernel: IntCounterVec,
    /// Events in the outbox database.
    pub outbox_stored: IntGauge,
    /// Events held in memory because the state directory cannot be written.
    pub outbox_pending: IntGauge,
    /// Events that could not be written to the state directory when made.
    pub outbox_unpersisted: IntCounter,
    /// Events a sink acknowledged, by sink name.
    pub sink_delivered: IntCounterVec,
    /// Batches sent again after a failure, by sink name.
    pub sink_retries: IntCounterVec,
    /// Failed attempts, by sink name and class (`connect`, `timeout`, `status`, `other`).
    pub sink_failures: IntCounterVec,
    /// Events a sink has not acknowledged yet, by sink name.
    pub sink_backlog: IntGaugeVec,
}

impl Metrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self {
            oom_kills: IntCounter::new(OOM_KILLS_TOTAL, "OOM kills reported by the kernel.")?,
            events: IntCounterVec::new(
                Opts::new(EVENTS_TOTAL, "Events appended to the outbox."),
                &["kind"],
            )?,
            events_dropped: IntCounterVec::new(
                Opts::new(
                    EVENTS_DROPPED_TOTAL,
                    "Events lost before every consumer had them, by reason.",
                ),
                &["reason"],
            )?,
            probe_ready: IntGauge::new(PROBE_READY, "1 once the probe is attached.")?,
            probe_source: IntGaugeVec::new(
                Opts::new(PROBE_SOURCE, "1 for the event source in use."),
                &["source"],
            )?,
            probe_kernel: IntCounterVec::new(
                Opts::new(PROBE_KERNEL_TOTAL, "Counters kept by the eBPF programs."),
                &["counter"],
            )?,
            outbox_stored: IntGauge::new(OUTBOX_STORED, "Events in the outbox database.")?,
            outbox_pending: IntGauge::new(
                OUTBOX_PENDING,
                "Events held in memory because the state directory cannot be written.",
            )?,
            outbox_unpersisted: IntCounter::new(
                OUTBOX_UNPERSISTED_TOTAL,
                "Events that could not be written to the state directory when made.",
            )?,
            sink_delivered: IntCounterVec::new(
                Opts::new(SINK_DELIVERED_TOTAL, "Events acknowledged by a sink."),
                &["sink"],
            )?,
            sink_retries: IntCounterVec::new(
                Opts::new(SINK_RETRIES_TOTAL, "Batches sent again after a failure."),
                &["sink"],
            )?,
            sink_failures: IntCounterVec::new(
                Opts::new(SINK_FAILURES_TOTAL, "Failed delivery attempts, by class."),
                &["sink", "class"],
            )?,
            sink_backlog: IntGaugeVec::new(
                Opts::new(SINK_BACKLOG, "Events a sink has not acknowledged yet."),
                &["sink"],
            )?,
        };
        registry.register(Box::new(metrics.oom_kills.clone()))?;
        registry.register(Box::new(metrics.events.clone()))?;
        registry.register(Box::new(metrics.events_dropped.clone()))?;
        registry.register(Box::new(metrics.probe_ready.clone()))?;
        registry.register(Box::new(metrics.probe_source.clone()))?;
        registry.register(Box::new(metrics.probe_kernel.clone()))?;
        registry.register(Box::new(metrics.outbox_stored.clone()))?;
        registry.register(Box::new(metrics.outbox_pending.clone()))?;
        registry.register(Box::new(metrics.outbox_unpersisted.clone()))?;
        registry.register(Box::new(metrics.sink_delivered.clone()))?;
        registry.register(Box::new(metrics.sink_retries.clone()))?;
        registry.register(Box::new(metrics.sink_failures.clone()))?;
        registry.register(Box::new(metrics.sink_backlog.clone()))?;
        let build = IntGaugeVec::new(Opts::new(BUILD_INFO, "Agent version."), &["version"])?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(build))?;
        Ok(metrics)
    }
}
