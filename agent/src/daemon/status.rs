//! The agent's state: served on `GET /v1/status` and carried by every
//! `heartbeat` event (as JSON), so a scheduler that missed events can
//! reconcile from either. [`AgentStatus`] is the one type the API serves
//! and `memwatch status` reads.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{
    daemon::monitor::Monitor,
    model::{
        health::{Health, Verdict},
        source::SourceKind,
    },
    outbox::{Outbox, OutboxStatus},
    telemetry::liveness::Liveness,
    watchdog::{
        self_health::{self, ProbeState},
        task::TaskView,
        worker::WorkerView,
    },
};

/// Everything the agent knows: version, event source, its overall verdict,
/// every worker and running task with memory and caps, recently finished
/// tasks, and the outbox with its per-sink backlog.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct AgentStatus {
    pub version: String,
    pub host: String,
    /// `ebpf` or `poll`; null until a source runs.
    pub source: Option<SourceKind>,
    /// How the source is attached (`tp_btf`, `cgroup files`, …).
    pub attach: Option<String>,
    pub health: Verdict,
    pub workers: Vec<WorkerView>,
    pub tasks: Vec<TaskView>,
    /// Recently finished tasks, newest last. In a heartbeat: only those
    /// finished since the previous heartbeat.
    pub finished_tasks: Vec<TaskView>,
    /// Tasks finished since the agent started (a heartbeat's receiver sees
    /// from it whether it missed any: more than the deltas it got).
    #[serde(default)]
    pub finished_total: u64,
    pub outbox: OutboxStatus,
    /// The API's local socket, on `/v1/status` (heartbeats leave it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<SocketStatus>,
}

/// Whether the API serves its local socket: the path, or why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SocketStatus {
    pub path: String,
    pub listening: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Produces the status. Cheap enough to call on each request.
pub(crate) type StatusFn = Arc<dyn Fn() -> AgentStatus + Send + Sync>;

pub(crate) fn agent_status(
    host: String,
    probe: Arc<Mutex<ProbeState>>,
    outbox: Outbox,
    monitor: Arc<Monitor>,
    liveness: Liveness,
) -> StatusFn {
    Arc::new(move || {
        let probe = probe.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let outbox_status = outbox.status();
        let workers = monitor.workers();
        let (finished_tasks, finished_total) = monitor.finished();
        let health = overall(&probe, &outbox_status, &workers, &liveness.stalled());
        AgentStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            host: host.clone(),
            source: probe.source,
            attach: probe.attach.map(str::to_string),
            health,
            workers,
            tasks: monitor.tasks(),
            finished_tasks,
            finished_total,
            outbox: outbox_status,
            socket: None,
        }
    })
}

/// The host's verdict: the worst of the agent's own (probe, outbox, state
/// directory) and the given workers', with every reason. `/health`, the
/// status and heartbeats all say this one.
pub(crate) fn overall(
    probe: &ProbeState,
    outbox: &OutboxStatus,
    workers: &[WorkerView],
    stalled: &[(String, Duration)],
) -> Verdict {
    let mut verdict = self_health::assess(probe, Instant::now());
    self_health::assess_outbox(
        outbox.persist_error.as_deref(),
        outbox.pending,
        outbox.set_aside.as_deref(),
        &mut verdict,
    );
    for (name, silent) in stalled {
        verdict.add(
            Health::Degraded,
            format!(
                "{name} made no progress for {}s: /live fails, so the agent is restarted",
                silent.as_secs()
            ),
        );
    }
    for w in workers {
        for reason in &w.reasons {
            verdict.add(w.status, format!("worker {}: {reason}", w.name));
        }
        verdict.status = verdict.status.max(w.status);
    }
    verdict
}
