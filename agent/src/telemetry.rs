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
                    "Events lost before delivery, by reason.",
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
        };
        registry.register(Box::new(metrics.oom_kills.clone()))?;
        registry.register(Box::new(metrics.events.clone()))?;
        registry.register(Box::new(metrics.events_dropped.clone()))?;
        registry.register(Box::new(metrics.probe_ready.clone()))?;
        registry.register(Box::new(metrics.probe_source.clone()))?;
        registry.register(Box::new(metrics.probe_kernel.clone()))?;
        let build = IntGaugeVec::new(Opts::new(BUILD_INFO, "Agent version."), &["version"])?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(build))?;
        Ok(metrics)
    }
}
