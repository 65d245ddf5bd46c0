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
    shipper::outbox::Outbox,
    watchdog::self_health::{self, ProbeState},
};

/// Produces the state JSON. Cheap enough to call on each request.
pub type StateFn = Arc<dyn Fn() -> Value + Send + Sync>;

/// What the agent knows today: version, event source, outbox and per-sink
/// backlog, and its own health.
pub fn agent_state(host: String, probe: Arc<Mutex<ProbeState>>, outbox: Outbox) -> StateFn {
    Arc::new(move || {
        let probe = probe.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let outbox_status = outbox.status();
        let mut health = self_health::assess(&probe, Instant::now());
        self_health::assess_outbox(&outbox_status, &mut health);
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "host": host,
            "source": probe.source.map(|s| s.as_str()),
            "attach": probe.attach,
            "health": health,
            "outbox": outbox_status,
        })
    })
}
