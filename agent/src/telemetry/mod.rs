//! Logs and metrics: one convention for both.
//!
//! Metric names are constants here; labels are low-cardinality (event kind,
//! drop reason, probe counter), never a pid or a cgroup. The registry is
//! made in `main` and passed down.

pub(crate) mod liveness;

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tracing_subscriber::EnvFilter;

pub(crate) const OOM_KILLS_TOTAL: &str = "memwatch_oom_kills_total";
pub(crate) const EVENTS_TOTAL: &str = "memwatch_events_total";
pub(crate) const EVENTS_DROPPED_TOTAL: &str = "memwatch_events_dropped_total";
pub(crate) const PROBE_READY: &str = "memwatch_probe_ready";
pub(crate) const PROBE_SOURCE: &str = "memwatch_probe_source";
pub(crate) const PROBE_KERNEL_TOTAL: &str = "memwatch_probe_kernel_total";
pub(crate) const BUILD_INFO: &str = "memwatch_build_info";
pub(crate) const WORKER_MEMORY_BYTES: &str = "memwatch_worker_memory_bytes";
pub(crate) const WORKER_RESIDUAL_BYTES: &str = "memwatch_worker_residual_bytes";
pub(crate) const WORKER_SOFT_CAP_BYTES: &str = "memwatch_worker_soft_cap_bytes";
pub(crate) const WORKER_HEALTH: &str = "memwatch_worker_health";
pub(crate) const WORKER_TRANSITIONS_TOTAL: &str = "memwatch_worker_transitions_total";
pub(crate) const TASKS_RUNNING: &str = "memwatch_tasks_running";
pub(crate) const TASK_REJECTIONS_TOTAL: &str = "memwatch_task_rejections_total";
pub(crate) const SOFT_CAP_CROSSINGS_TOTAL: &str = "memwatch_soft_cap_crossings_total";
pub(crate) const TASK_OOM_KILLS_TOTAL: &str = "memwatch_task_oom_kills_total";
pub(crate) const GROWTH_LINES_TOTAL: &str = "memwatch_growth_lines_total";
pub(crate) const PROGRAM_RUNS_TOTAL: &str = "memwatch_probe_program_runs_total";
pub(crate) const PROGRAM_RUN_SECONDS_TOTAL: &str = "memwatch_probe_program_run_seconds_total";

fn gauge(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
    IntGaugeVec::new(Opts::new(name, help), labels)
}

fn counter(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}
pub(crate) const OUTBOX_STORED: &str = "memwatch_outbox_stored_events";
pub(crate) const OUTBOX_PENDING: &str = "memwatch_outbox_pending_events";
pub(crate) const OUTBOX_UNPERSISTED_TOTAL: &str = "memwatch_outbox_unpersisted_total";
pub(crate) const SINK_DELIVERED_TOTAL: &str = "memwatch_sink_delivered_total";
pub(crate) const SINK_RETRIES_TOTAL: &str = "memwatch_sink_retries_total";
pub(crate) const SINK_FAILURES_TOTAL: &str = "memwatch_sink_failures_total";
pub(crate) const SINK_BACKLOG: &str = "memwatch_sink_backlog_events";
pub(crate) const SCHEDULER_ACTIONS_TOTAL: &str = "memwatch_scheduler_actions_total";
pub(crate) const API_CONNECTIONS_REFUSED_TOTAL: &str = "memwatch_api_connections_refused_total";
pub(crate) const STATE_QUARANTINED_TOTAL: &str = "memwatch_state_quarantined_total";
pub(crate) const MEMORY_PRESSURE_RATIO: &str = "memwatch_memory_pressure_ratio";
pub(crate) const PRESSURE_STALL_TOTAL: &str = "memwatch_memory_pressure_stall_seconds_total";
pub(crate) const MEMORY_EVENTS_TOTAL: &str = "memwatch_memory_events_total";

/// Starts `tracing` to stderr. `RUST_LOG` wins over `default_level`.
pub(crate) fn init_logging(default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colour only for a person at a terminal: escape codes in a file,
    // journald or `kubectl logs` are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
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
    /// Per worker (configured, so few): memory, residual memory, soft cap.
    pub worker_memory: IntGaugeVec,
    pub worker_residual: IntGaugeVec,
    pub worker_soft_cap: IntGaugeVec,
    /// 1 for the worker's current state (`healthy`, `degraded`, `unhealthy`), 0 for the others.
    pub worker_health: IntGaugeVec,
    /// Changes into `unhealthy` or back to `healthy`, by worker and target state.
    pub worker_transitions: IntCounterVec,
    pub tasks_running: IntGaugeVec,
    pub task_rejections: IntCounterVec,
    /// Soft-cap crossings, by scope (`task` or `worker`).
    pub soft_cap_crossings: IntCounterVec,
    /// OOM kills attributed to a worker's tasks or the worker itself.
    pub task_oom_kills: IntCounterVec,
    /// Lines crossed in the kernel, by line (`above_cap`, `below_cap`, `step`).
    pub growth_lines: IntCounterVec,
    /// Runs and run time of each eBPF program (with `bpf_stats = true`).
    pub program_runs: IntCounterVec,
    pub program_run_seconds: prometheus::CounterVec,
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
    /// What scheduler sinks did (`retire`, `drain`, `resume`, `requeue`,
    /// `guard_blocked`), by sink name.
    pub scheduler_actions: IntCounterVec,
    /// API connections closed at once because the listener had as many
    /// open as it may, by listener (`tcp`, `unix`).
    pub api_connections_refused: IntCounterVec,
    /// Stored state set aside because it was corrupt, by what
    /// (`outbox`: the whole database; `slurm`: a Slurm sink's state file).
    pub state_quarantined: IntCounterVec,
    /// PSI averages as fractions, by `scope` (`host`, `worker`), `worker`
    /// (empty for the host), `kind` (`some`, `full`), `window`.
    pub memory_pressure: prometheus::GaugeVec,
    /// PSI stall time, by `scope`, `worker`, `kind`.
    pub memory_pressure_stall: prometheus::CounterVec,
    /// A worker's memory event counters (`memory.events`), by `event`.
    pub memory_events: IntCounterVec,
}

impl Metrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.oom_kills.clone()),
            Box::new(self.events.clone()),
            Box::new(self.events_dropped.clone()),
            Box::new(self.probe_ready.clone()),
            Box::new(self.probe_source.clone()),
            Box::new(self.probe_kernel.clone()),
            Box::new(self.worker_memory.clone()),
            Box::new(self.worker_residual.clone()),
            Box::new(self.worker_soft_cap.clone()),
            Box::new(self.worker_health.clone()),
            Box::new(self.worker_transitions.clone()),
            Box::new(self.tasks_running.clone()),
            Box::new(self.task_rejections.clone()),
            Box::new(self.soft_cap_crossings.clone()),
            Box::new(self.task_oom_kills.clone()),
            Box::new(self.growth_lines.clone()),
            Box::new(self.program_runs.clone()),
            Box::new(self.program_run_seconds.clone()),
            Box::new(self.outbox_stored.clone()),
            Box::new(self.outbox_pending.clone()),
            Box::new(self.outbox_unpersisted.clone()),
            Box::new(self.sink_delivered.clone()),
            Box::new(self.sink_retries.clone()),
            Box::new(self.state_quarantined.clone()),
            Box::new(self.sink_failures.clone()),
            Box::new(self.sink_backlog.clone()),
            Box::new(self.scheduler_actions.clone()),
            Box::new(self.api_connections_refused.clone()),
            Box::new(self.memory_pressure.clone()),
            Box::new(self.memory_pressure_stall.clone()),
            Box::new(self.memory_events.clone()),
        ]
    }

    /// Counts what an event says happened (transitions, rejections, crossings).
    pub fn count_event(&self, event: &crate::model::event::EventBody) {
        use crate::model::event::EventKind;
        let worker = event.worker.as_deref().unwrap_or("");
        match event.kind {
            EventKind::WorkerUnhealthy => self
                .worker_transitions
                .with_label_values(&[worker, "unhealthy"])
                .inc(),
            EventKind::WorkerRecovered => self
                .worker_transitions
                .with_label_values(&[worker, "healthy"])
                .inc(),
            EventKind::TaskRejected => self.task_rejections.with_label_values(&[worker]).inc(),
            EventKind::SoftCapExceeded => {
                let scope = if event.task_id.is_some() {
                    "task"
                } else {
                    "worker"
                };
                self.soft_cap_crossings.with_label_values(&[scope]).inc();
            }
            EventKind::OomKill => {
                self.oom_kills.inc();
                if event.worker.is_some() {
                    self.task_oom_kills.with_label_values(&[worker]).inc()
                }
            }
            _ => {}
        }
    }

    // One registration per metric, in one place: a list, not logic (its
    // names are checked against docs/metrics.md). Splitting it would only
    // scatter the list.
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
            worker_memory: gauge(
                WORKER_MEMORY_BYTES,
                "Worker memory (cgroup working set or process RSS).",
                &["worker"],
            )?,
            worker_residual: gauge(
                WORKER_RESIDUAL_BYTES,
                "Worker memory not owned by its running tasks.",
                &["worker"],
            )?,
            worker_soft_cap: gauge(WORKER_SOFT_CAP_BYTES, "Worker soft cap.", &["worker"])?,
            worker_health: gauge(
                WORKER_HEALTH,
                "1 for the worker's current health state.",
                &["worker", "state"],
            )?,
            worker_transitions: counter(
                WORKER_TRANSITIONS_TOTAL,
                "Worker health changes, by target state.",
                &["worker", "to"],
            )?,
            tasks_running: gauge(TASKS_RUNNING, "Tasks running per worker.", &["worker"])?,
            task_rejections: counter(
                TASK_REJECTIONS_TOTAL,
                "Task registrations rejected.",
                &["worker"],
            )?,
            soft_cap_crossings: counter(
                SOFT_CAP_CROSSINGS_TOTAL,
                "Soft-cap crossings.",
                &["scope"],
            )?,
            task_oom_kills: counter(
                TASK_OOM_KILLS_TOTAL,
                "OOM kills attributed to a worker.",
                &["worker"],
            )?,
            growth_lines: counter(
                GROWTH_LINES_TOTAL,
                "Memory cgroup lines crossed, seen in the kernel.",
                &["line"],
            )?,
            program_runs: counter(
                PROGRAM_RUNS_TOTAL,
                "eBPF program runs (with bpf_stats on).",
                &["program"],
            )?,
            program_run_seconds: prometheus::CounterVec::new(
                Opts::new(
                    PROGRAM_RUN_SECONDS_TOTAL,
                    "eBPF program run time (with bpf_stats on).",
                ),
                &["program"],
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
            scheduler_actions: IntCounterVec::new(
                Opts::new(
                    SCHEDULER_ACTIONS_TOTAL,
                    "Actions scheduler sinks took (or were refused by the guard).",
                ),
                &["sink", "action"],
            )?,
            api_connections_refused: counter(
                API_CONNECTIONS_REFUSED_TOTAL,
                "API connections closed at once: the listener had as many open as it may.",
                &["listener"],
            )?,
            state_quarantined: counter(
                STATE_QUARANTINED_TOTAL,
                "Stored state set aside because it was corrupt.",
                &["what"],
            )?,
            memory_pressure: prometheus::GaugeVec::new(
                Opts::new(
                    MEMORY_PRESSURE_RATIO,
                    "Share of time tasks stalled on memory (PSI avg, a fraction 0-1).",
                ),
                &["scope", "worker", "kind", "window"],
            )?,
            memory_pressure_stall: prometheus::CounterVec::new(
                Opts::new(
                    PRESSURE_STALL_TOTAL,
                    "Time tasks stalled on memory (PSI total).",
                ),
                &["scope", "worker", "kind"],
            )?,
            memory_events: counter(
                MEMORY_EVENTS_TOTAL,
                "A worker cgroup's memory events (memory.events; v1: failcnt, oom_control).",
                &["worker", "event"],
            )?,
        };
        for collector in metrics.collectors() {
            registry.register(collector)?;
        }
        let build = IntGaugeVec::new(Opts::new(BUILD_INFO, "Agent version."), &["version"])?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(build))?;
        Ok(metrics)
    }
}
