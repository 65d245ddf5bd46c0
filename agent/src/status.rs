//! The agent's state as one JSON value: served on `GET /v1/status` and
//! carried by every `heartbeat` event, so a scheduler that missed events
//! can reconcile from either.
//!
//! The agent wires a [`StateFn`]; parts of the agent that grow (workers,
//! tasks) add their figures to it without the API or heartbeats changing.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{
    model::health::Verdict,
    monitor::Monitor,
    outbox::{Outbox, OutboxStatus},
    watchdog::{
        self_health::{self, ProbeState},
        worker::WorkerView,
    },
};

/// Produces the state JSON. Cheap enough to call on each request.
pub type StateFn = Arc<dyn Fn() -> Value + Send + Sync>;

/// Everything the agent knows: version, event source, its overall verdict,
/// every worker and running task with memory and caps, recently finished
/// tasks, and the outbox with its per-sink backlog.
pub fn agent_state(
    host: String,
    probe: Arc<Mutex<ProbeState>>,
    outbox: Outbox,
    monitor: Arc<Monitor>,
) -> StateFn {
    Arc::new(move || {
        let probe = probe.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let outbox_status = outbox.status();
        let workers = monitor.workers();
        let health = overall(&probe, &outbox_status, &workers);
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "host": host,
            "source": probe.source.map(|s| s.as_str()),
            "attach": probe.attach,
            "health": health,
            "workers": workers,
            "tasks": monitor.tasks(),
            "finished_tasks": monitor.finished_tasks(),
            "outbox": outbox_status,
        })
    })
}

/// The host's verdict: the worst of the agent's own (probe, outbox, state
/// directory) and the given workers', with every reason. `/health`, the
/// status and heartbeats all say this one.
pub fn overall(probe: &ProbeState, outbox: &OutboxStatus, workers: &[WorkerView]) -> Verdict {
    let mut verdict = self_health::assess(probe, Instant::now());
    self_health::assess_outbox(
        outbox.persist_error.as_deref(),
        outbox.pending,
        &mut verdict,
    );
    for w in workers {
        for reason in &w.reasons {
            verdict.add(w.status, format!("worker {}: {reason}", w.name));
        }
        verdict.status = verdict.status.max(w.status);
    }
    verdict
}
