//! Logs and metrics: one convention for both.
//!
//! Metric names are constants here; labels are low-cardinality (event kind,
//! drop reason, probe counter), never a pid or a cgroup. The registry is
//! made in `main` and passed down.
//!
//! Longer than 600 lines: every exported metric's name, help and labels in
//! one place (docs/metrics.md is checked against the names here);
//! `Metrics::new` still registers them one by one, to become one table
//! (issue 26).

pub(crate) mod delay;
pub mod heap;
pub(crate) mod liveness;
pub(crate) mod notify;

use agent_common::ProbeCounter;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tracing_subscriber::EnvFilter;

pub(crate) const OOM_KILLS_TOTAL: &str = "memwatch_oom_kills_total";
pub(crate) const EVENTS_TOTAL: &str = "memwatch_events_total";
pub(crate) const EVENT_DELAY_SECONDS: &str = "memwatch_event_delay_seconds";
pub(crate) const EVENTS_DROPPED_TOTAL: &str = "memwatch_events_dropped_total";
pub(crate) const PROBE_READY: &str = "memwatch_probe_ready";
pub(crate) const PROBE_SOURCE: &str = "memwatch_probe_source";
pub(crate) const PROBE_OOM_VICTIMS_TOTAL: &str = "memwatch_probe_oom_victims_total";
pub(crate) const PROBE_RECORDS_LOST_TOTAL: &str = "memwatch_probe_records_lost_total";
pub(crate) const PROBE_READ_ERRORS_TOTAL: &str = "memwatch_probe_read_errors_total";
pub(crate) const PROBE_GROWTH_RUNS_TOTAL: &str = "memwatch_probe_growth_runs_total";
pub(crate) const PROBE_GROWTH_CHECKS_TOTAL: &str = "memwatch_probe_growth_checks_total";
pub(crate) const PROBE_GROWTH_RECORDS_TOTAL: &str = "memwatch_probe_growth_records_total";
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
pub(crate) const PREDICT_LEAD_SECONDS: &str = "memwatch_predict_lead_seconds";
pub(crate) const WORKER_OOM_ETA_SECONDS: &str = "memwatch_worker_oom_eta_seconds";
pub(crate) const PREDICT_ETA_ERROR_SECONDS: &str = "memwatch_predict_eta_error_seconds";
pub(crate) const PREDICT_READS_TOTAL: &str = "memwatch_predict_reads_total";
pub(crate) const PROGRAM_RUNS_TOTAL: &str = "memwatch_probe_program_runs_total";
pub(crate) const PROGRAM_RUN_SECONDS_TOTAL: &str = "memwatch_probe_program_run_seconds_total";

/// Seconds, for the predictor's lead time and ETA error.
const PREDICT_BUCKETS: [f64; 10] = [0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];

fn gauge(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
    IntGaugeVec::new(Opts::new(name, help), labels)
}

fn counter(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}
pub(crate) const OUTBOX_STORED: &str = "memwatch_outbox_stored_events";
pub(crate) const OUTBOX_STORED_BYTES: &str = "memwatch_outbox_stored_bytes";
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

/// How log lines are written (`--log-format`, `log_format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line of text per event, `key=value` fields; colour only on a terminal.
    #[default]
    Text,
    /// One JSON object per line (tracing-subscriber's JSON formatter).
    Json,
}

/// Starts `tracing` to stderr. `RUST_LOG` wins over `default_level`.
pub(crate) fn init_logging(default_level: &str, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colour only for a person at a terminal: escape codes in a file,
    // journald or `kubectl logs` are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A second init (tests) is harmless: keep the first subscriber.
    // `try_init` also routes the `log` crate's records (aya, hyper) here.
    let _ = tracing_subscriber::util::SubscriberInitExt::try_init(subscriber(
        filter,
        format,
        ansi,
        || EscapeLines(std::io::stderr()),
    ));
}

/// The subscriber [`init_logging`] starts, writing to `writer`.
fn subscriber<W>(
    filter: EnvFilter,
    format: LogFormat,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(builder.json().with_ansi(false).finish()),
    }
}

/// A writer that keeps one log event on one line: every line break (and
/// carriage return) but the one ending the event is written as `\n`
/// (`\r`). The strings a workload controls (a victim's `comm`, task ids,
/// cgroup paths, error texts that quote them) are logged with `%` in many
/// places; a newline in one must not forge a log line. The formatter
/// writes each event whole, in one `write`. (tracing-subscriber escapes
/// ANSI sequences in fields itself; JSON escapes everything.)
pub(crate) struct EscapeLines<W>(pub W);

impl<W: std::io::Write> std::io::Write for EscapeLines<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match buf.split_last() {
            Some((b'\n', body)) => (body, &b"\n"[..]),
            _ => (buf, &b""[..]),
        };
        if !body.iter().any(|b| matches!(b, b'\n' | b'\r')) {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                _ => out.push(b),
            }
        }
        out.extend_from_slice(end);
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The metric of one of the eBPF programs' own counters: its name and help.
pub(crate) fn probe_counter_metric(counter: ProbeCounter) -> (&'static str, &'static str) {
    match counter {
        ProbeCounter::OomSeen => (PROBE_OOM_VICTIMS_TOTAL, "OOM victims the eBPF program saw."),
        ProbeCounter::RingbufFull => (
            PROBE_RECORDS_LOST_TOTAL,
            "Records the eBPF programs could not send: their ring buffer was full.",
        ),
        ProbeCounter::ReadErrors => (
            PROBE_READ_ERRORS_TOTAL,
            "Kernel reads the eBPF programs could not make (a victim reported partly).",
        ),
        ProbeCounter::GrowthRuns => (PROBE_GROWTH_RUNS_TOTAL, "Runs of the memory growth hook."),
        ProbeCounter::GrowthChecks => (
            PROBE_GROWTH_CHECKS_TOTAL,
            "Growth hook runs that checked a cgroup's lines.",
        ),
        ProbeCounter::GrowthRecords => {
            (PROBE_GROWTH_RECORDS_TOTAL, "Growth lines the kernel sent.")
        }
    }
}

/// Every metric the agent exports. Cheap to clone (handles are shared).
#[derive(Clone)]
pub struct Metrics {
    /// OOM kills reported, by `constraint` (`cgroup`, `global`, or
    /// `unknown` for a kill recovered from the counters).
    pub oom_kills: IntCounterVec,
    /// Events appended to the outbox, by kind.
    pub events: IntCounterVec,
    /// Events lost, by reason (`outbox_full`, `ringbuf_full`, …).
    pub events_dropped: IntCounterVec,
    /// 1 once the probe is attached and its reader runs.
    pub probe_ready: IntGauge,
    /// 1 for the event source in use (`ebpf` or `poll`).
    pub probe_source: IntGaugeVec,
    /// The eBPF programs' own counters, one metric each, in
    /// [`ProbeCounter::ALL`] order (see [`probe_counter_metric`]).
    pub probe_counters: Vec<IntCounter>,
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
    /// Predicted kills: seconds from the first `oom_imminent` to the kill,
    /// and how far the ETA said was from it (absolute).
    pub predict_lead: prometheus::Histogram,
    /// Seconds to each worker's soonest predicted kill; absent when none.
    pub worker_oom_eta: prometheus::GaugeVec,
    pub predict_eta_error: prometheus::Histogram,
    /// The predictor's full reads of a cgroup, by why (`new`, `kernel`,
    /// `usage`, `near_limit`, `poll`, `reread`).
    pub predict_reads: IntCounterVec,
    /// Runs and run time of each eBPF program (with `bpf_stats = true`).
    pub program_runs: IntCounterVec,
    pub program_run_seconds: prometheus::CounterVec,
    /// Events in the outbox database.
    pub outbox_stored: IntGauge,
    pub outbox_stored_bytes: IntGauge,
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
    /// Where the delay of OOM kills and soft-cap crossings goes.
    pub timeline: delay::Timeline,
}

impl Metrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        let mut all: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.oom_kills.clone()),
            Box::new(self.events.clone()),
            Box::new(self.events_dropped.clone()),
            Box::new(self.probe_ready.clone()),
            Box::new(self.probe_source.clone()),
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
            Box::new(self.predict_lead.clone()),
            Box::new(self.worker_oom_eta.clone()),
            Box::new(self.predict_eta_error.clone()),
            Box::new(self.predict_reads.clone()),
            Box::new(self.program_runs.clone()),
            Box::new(self.program_run_seconds.clone()),
            Box::new(self.outbox_stored.clone()),
            Box::new(self.outbox_stored_bytes.clone()),
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
            Box::new(self.timeline.seconds.clone()),
        ];
        all.extend(
            self.probe_counters
                .iter()
                .map(|c| Box::new(c.clone()) as Box<dyn prometheus::core::Collector>),
        );
        all
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
                let constraint = match event.constraint {
                    Some(crate::model::event::OomConstraint::Cgroup) => "cgroup",
                    Some(crate::model::event::OomConstraint::Global) => "global",
                    None => "unknown",
                };
                self.oom_kills.with_label_values(&[constraint]).inc();
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
            oom_kills: IntCounterVec::new(
                Opts::new(OOM_KILLS_TOTAL, "OOM kills reported by the kernel."),
                &["constraint"],
            )?,
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
            probe_counters: ProbeCounter::ALL
                .iter()
                .map(|c| {
                    let (name, help) = probe_counter_metric(*c);
                    IntCounter::new(name, help)
                })
                .collect::<Result<_, _>>()?,
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
            worker_oom_eta: prometheus::GaugeVec::new(
                Opts::new(
                    WORKER_OOM_ETA_SECONDS,
                    "Seconds to the worker's soonest predicted OOM kill (absent when none).",
                ),
                &["worker"],
            )?,
            predict_lead: prometheus::Histogram::with_opts(
                prometheus::HistogramOpts::new(
                    PREDICT_LEAD_SECONDS,
                    "Predicted OOM kills: seconds from the first oom_imminent to the kill.",
                )
                .buckets(PREDICT_BUCKETS.to_vec()),
            )?,
            predict_eta_error: prometheus::Histogram::with_opts(
                prometheus::HistogramOpts::new(
                    PREDICT_ETA_ERROR_SECONDS,
                    "Predicted OOM kills: absolute seconds between the ETA said and the kill.",
                )
                .buckets(PREDICT_BUCKETS.to_vec()),
            )?,
            predict_reads: counter(
                PREDICT_READS_TOTAL,
                "Full reads of a cgroup by the kill predictor, by why.",
                &["why"],
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
            outbox_stored_bytes: IntGauge::new(
                OUTBOX_STORED_BYTES,
                "Bytes of event JSON in the outbox database (bounded by outbox_max_bytes).",
            )?,
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
            timeline: delay::Timeline::new()?,
        };
        // The known constraints are series from the start (at 0).
        for constraint in ["cgroup", "global", "unknown"] {
            metrics.oom_kills.with_label_values(&[constraint]);
        }
        for collector in metrics.collectors() {
            registry.register(collector)?;
        }
        let build = IntGaugeVec::new(Opts::new(BUILD_INFO, "Agent version."), &["version"])?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(build))?;
        // The agent's own cost, as every Prometheus exporter shows it:
        // process_cpu_seconds_total, process_resident_memory_bytes, …
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(metrics)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log destination the test reads back.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(format: LogFormat, log: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = subscriber(EnvFilter::new("info"), format, false, move || {
            EscapeLines(out.clone())
        });
        tracing::subscriber::with_default(subscriber, log);
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    /// A victim's `comm`, a task id and a cgroup path are the workload's:
    /// a line break in one must not forge a log line, whether logged with
    /// `%` (Display) or `?` (Debug).
    #[test]
    fn a_workload_string_with_a_newline_is_one_log_line() {
        let comm = "evil\nERROR memwatch: forged";
        let text = logged(LogFormat::Text, || {
            tracing::info!(comm = %comm, task_id = %"t\r1", cgroup = ?"/a\nb", "OOM kill");
            tracing::warn!("second {}", "line\nbreak");
        });
        assert_eq!(text.matches('\n').count(), 2, "{text:?}");
        let first = text.lines().next().unwrap();
        assert!(first.contains("OOM kill"), "{first}");
        assert!(
            first.contains(r"comm=evil\nERROR memwatch: forged"),
            "{first}"
        );
        assert!(first.contains(r"task_id=t\r1"), "{first}");
        assert!(first.contains(r#"cgroup="/a\nb""#), "{first}");
        assert!(!text.contains('\x1b'), "no colour off a terminal: {text:?}");
    }

    #[test]
    fn json_logs_are_one_object_per_line_with_the_fields() {
        let text = logged(LogFormat::Json, || {
            tracing::info!(comm = %"a\nb", seq = 7, "OOM kill");
        });
        assert_eq!(text.lines().count(), 1, "{text:?}");
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["fields"]["message"], "OOM kill");
        assert_eq!(line["fields"]["comm"], "a\nb");
        assert_eq!(line["fields"]["seq"], 7);
    }

    #[test]
    fn escape_lines_keeps_the_final_newline_only() {
        let mut out = Vec::new();
        std::io::Write::write_all(&mut EscapeLines(&mut out), b"a\nb\r\n").unwrap();
        assert_eq!(
            out,
            br"a\nb\r".iter().chain(b"\n").copied().collect::<Vec<u8>>()
        );
    }
}
