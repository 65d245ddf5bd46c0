//! Logs and metrics: one convention for both.
//!
//! Metric names are constants here; labels are low-cardinality (event kind,
//! drop reason, probe counter), never a pid or a cgroup. The registry is
//! made in `main` and passed down. `Metrics` is one table (the `metrics!`
//! macro of table.rs): each metric's field, name, help and labels, once.

pub(crate) mod delay;
pub mod heap;
pub(crate) mod liveness;
pub(crate) mod notify;
mod table;

use agent_common::ProbeCounter;
use prometheus::{
    CounterVec, GaugeVec, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
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

table::metrics! {
    table {
        /// OOM kills reported, by `constraint` (`cgroup`, `global`, or
        /// `unknown` for a kill recovered from the counters).
        oom_kills: IntCounterVec(
            OOM_KILLS_TOTAL,
            "OOM kills reported by the kernel.",
            ["constraint"],
        ),
        /// Events appended to the outbox, by kind.
        events: IntCounterVec(EVENTS_TOTAL, "Events appended to the outbox.", ["kind"]),
        /// Events lost, by reason (`outbox_full`, `ringbuf_full`, …).
        events_dropped: IntCounterVec(
            EVENTS_DROPPED_TOTAL,
            "Events lost before every consumer had them, by reason.",
            ["reason"],
        ),
        /// 1 once the probe is attached and its reader runs.
        probe_ready: IntGauge(PROBE_READY, "1 once the probe is attached."),
        /// 1 for the event source in use (`ebpf` or `poll`).
        probe_source: IntGaugeVec(PROBE_SOURCE, "1 for the event source in use.", ["source"]),
        /// Per worker (configured, so few): memory.
        worker_memory: IntGaugeVec(
            WORKER_MEMORY_BYTES,
            "Worker memory (cgroup working set or process RSS).",
            ["worker"],
        ),
        /// Per worker: memory not owned by its running tasks.
        worker_residual: IntGaugeVec(
            WORKER_RESIDUAL_BYTES,
            "Worker memory not owned by its running tasks.",
            ["worker"],
        ),
        /// Per worker: its soft cap.
        worker_soft_cap: IntGaugeVec(WORKER_SOFT_CAP_BYTES, "Worker soft cap.", ["worker"]),
        /// 1 for the worker's current state (`healthy`, `degraded`, `unhealthy`), 0 for the others.
        worker_health: IntGaugeVec(
            WORKER_HEALTH,
            "1 for the worker's current health state.",
            ["worker", "state"],
        ),
        /// Changes into `unhealthy` or back to `healthy`, by worker and target state.
        worker_transitions: IntCounterVec(
            WORKER_TRANSITIONS_TOTAL,
            "Worker health changes, by target state.",
            ["worker", "to"],
        ),
        /// Tasks running, per worker.
        tasks_running: IntGaugeVec(TASKS_RUNNING, "Tasks running per worker.", ["worker"]),
        /// Task registrations rejected, per worker.
        task_rejections: IntCounterVec(
            TASK_REJECTIONS_TOTAL,
            "Task registrations rejected.",
            ["worker"],
        ),
        /// Soft-cap crossings, by scope (`task` or `worker`).
        soft_cap_crossings: IntCounterVec(
            SOFT_CAP_CROSSINGS_TOTAL,
            "Soft-cap crossings.",
            ["scope"],
        ),
        /// OOM kills attributed to a worker's tasks or the worker itself.
        task_oom_kills: IntCounterVec(
            TASK_OOM_KILLS_TOTAL,
            "OOM kills attributed to a worker.",
            ["worker"],
        ),
        /// Lines crossed in the kernel, by line (`above_cap`, `below_cap`, `step`).
        growth_lines: IntCounterVec(
            GROWTH_LINES_TOTAL,
            "Memory cgroup lines crossed, seen in the kernel.",
            ["line"],
        ),
        /// Predicted kills: seconds from the first `oom_imminent` to the kill.
        predict_lead: Histogram(
            PREDICT_LEAD_SECONDS,
            "Predicted OOM kills: seconds from the first oom_imminent to the kill.",
            buckets = PREDICT_BUCKETS,
        ),
        /// Seconds to each worker's soonest predicted kill; absent when none.
        worker_oom_eta: GaugeVec(
            WORKER_OOM_ETA_SECONDS,
            "Seconds to the worker's soonest predicted OOM kill (absent when none).",
            ["worker"],
        ),
        /// Predicted kills: how far the ETA said was from the kill (absolute).
        predict_eta_error: Histogram(
            PREDICT_ETA_ERROR_SECONDS,
            "Predicted OOM kills: absolute seconds between the ETA said and the kill.",
            buckets = PREDICT_BUCKETS,
        ),
        /// The predictor's full reads of a cgroup, by why (`new`, `kernel`,
        /// `usage`, `near_limit`, `poll`, `reread`).
        predict_reads: IntCounterVec(
            PREDICT_READS_TOTAL,
            "Full reads of a cgroup by the kill predictor, by why.",
            ["why"],
        ),
        /// Runs of each eBPF program (with `bpf_stats = true`).
        program_runs: IntCounterVec(
            PROGRAM_RUNS_TOTAL,
            "eBPF program runs (with bpf_stats on).",
            ["program"],
        ),
        /// Run time of each eBPF program (with `bpf_stats = true`).
        program_run_seconds: CounterVec(
            PROGRAM_RUN_SECONDS_TOTAL,
            "eBPF program run time (with bpf_stats on).",
            ["program"],
        ),
        /// Events in the outbox database.
        outbox_stored: IntGauge(OUTBOX_STORED, "Events in the outbox database."),
        /// Bytes of event JSON in the outbox database.
        outbox_stored_bytes: IntGauge(
            OUTBOX_STORED_BYTES,
            "Bytes of event JSON in the outbox database (bounded by outbox_max_bytes).",
        ),
        /// Events held in memory because the state directory cannot be written.
        outbox_pending: IntGauge(
            OUTBOX_PENDING,
            "Events held in memory because the state directory cannot be written.",
        ),
        /// Events that could not be written to the state directory when made.
        outbox_unpersisted: IntCounter(
            OUTBOX_UNPERSISTED_TOTAL,
            "Events that could not be written to the state directory when made.",
        ),
        /// Events a sink acknowledged, by sink name.
        sink_delivered: IntCounterVec(
            SINK_DELIVERED_TOTAL,
            "Events acknowledged by a sink.",
            ["sink"],
        ),
        /// Batches sent again after a failure, by sink name.
        sink_retries: IntCounterVec(
            SINK_RETRIES_TOTAL,
            "Batches sent again after a failure.",
            ["sink"],
        ),
        /// Failed attempts, by sink name and class (`connect`, `timeout`, `status`, `other`).
        sink_failures: IntCounterVec(
            SINK_FAILURES_TOTAL,
            "Failed delivery attempts, by class.",
            ["sink", "class"],
        ),
        /// Events a sink has not acknowledged yet, by sink name.
        sink_backlog: IntGaugeVec(
            SINK_BACKLOG,
            "Events a sink has not acknowledged yet.",
            ["sink"],
        ),
        /// What scheduler sinks did (`retire`, `drain`, `resume`, `requeue`,
        /// `guard_blocked`), by sink name.
        scheduler_actions: IntCounterVec(
            SCHEDULER_ACTIONS_TOTAL,
            "Actions scheduler sinks took (or were refused by the guard).",
            ["sink", "action"],
        ),
        /// API connections closed at once because the listener had as many
        /// open as it may, by listener (`tcp`, `unix`).
        api_connections_refused: IntCounterVec(
            API_CONNECTIONS_REFUSED_TOTAL,
            "API connections closed at once: the listener had as many open as it may.",
            ["listener"],
        ),
        /// Stored state set aside because it was corrupt, by what
        /// (`outbox`: the whole database; `slurm`: a Slurm sink's state file).
        state_quarantined: IntCounterVec(
            STATE_QUARANTINED_TOTAL,
            "Stored state set aside because it was corrupt.",
            ["what"],
        ),
        /// PSI averages as fractions, by `scope` (`host`, `worker`), `worker`
        /// (empty for the host), `kind` (`some`, `full`), `window`.
        memory_pressure: GaugeVec(
            MEMORY_PRESSURE_RATIO,
            "Share of time tasks stalled on memory (PSI avg, a fraction 0-1).",
            ["scope", "worker", "kind", "window"],
        ),
        /// PSI stall time, by `scope`, `worker`, `kind`.
        memory_pressure_stall: CounterVec(
            PRESSURE_STALL_TOTAL,
            "Time tasks stalled on memory (PSI total).",
            ["scope", "worker", "kind"],
        ),
        /// A worker's memory event counters (`memory.events`), by `event`.
        memory_events: IntCounterVec(
            MEMORY_EVENTS_TOTAL,
            "A worker cgroup's memory events (memory.events; v1: failcnt, oom_control).",
            ["worker", "event"],
        ),
    }
    by_hand {
        /// The eBPF programs' own counters, one metric each, in
        /// [`ProbeCounter::ALL`] order (see [`probe_counter_metric`]).
        probe_counters: Vec<IntCounter>,
        /// Where the delay of OOM kills and soft-cap crossings goes.
        timeline: delay::Timeline,
    }
}

impl Metrics {
    /// The table's collectors and the hand-built ones.
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        let mut all = self.table_collectors();
        all.push(Box::new(self.timeline.seconds.clone()));
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

    /// Every metric made and registered in `registry`: the table's, then
    /// the hand-built ones, build info and the process collector.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let probe_counters = ProbeCounter::ALL
            .iter()
            .map(|c| {
                let (name, help) = probe_counter_metric(*c);
                IntCounter::new(name, help)
            })
            .collect::<Result<_, _>>()?;
        let metrics = Self::from_table(probe_counters, delay::Timeline::new()?)?;
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

    /// Every metric of the table is registered, once: a field added to the
    /// struct cannot go unexported. Making them twice in one registry fails.
    #[test]
    fn every_table_metric_is_registered_once() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).unwrap();
        // A `…Vec` with no series is not gathered.
        metrics.touch_table();
        let families = registry.gather();
        let count = |name: &str| families.iter().filter(|f| f.name() == name).count();
        for name in Metrics::TABLE {
            assert_eq!(count(name), 1, "{name}");
        }
        let by_hand = ProbeCounter::ALL
            .iter()
            .map(|c| probe_counter_metric(*c).0)
            .chain([EVENT_DELAY_SECONDS, BUILD_INFO]);
        for name in by_hand.clone() {
            assert_eq!(count(name), 1, "{name}");
        }
        let ours: Vec<&str> = Metrics::TABLE.iter().copied().chain(by_hand).collect();
        let unknown: Vec<&str> = families
            .iter()
            .map(|f| f.name())
            .filter(|n| n.starts_with("memwatch_") && !ours.contains(n))
            .collect();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert!(Metrics::new(&registry).is_err(), "registered twice");
    }

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
