//! The one way a new event goes into the outbox: enriched (a cgroup's pod,
//! container and QoS class, pure; then whatever the sinks lent, such as the
//! pod's names when a pod watch knows them), counted in the metrics, then
//! appended. Probe, watchdog, API, heartbeat and sink events alike pass
//! through [`Recorder::record`]; the outbox itself only stores.

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use tracing::warn;

use crate::{
    model::{
        event::{Enrich, Event, EventBody},
        pod,
    },
    outbox::Outbox,
    telemetry::Metrics,
};

/// The enrichers, set once and shared by every clone of a [`Recorder`].
type Enrichers = Arc<OnceLock<Box<[Arc<dyn Enrich>]>>>;

#[derive(Clone)]
pub(crate) struct Recorder {
    outbox: Outbox,
    metrics: Metrics,
    /// What the sinks lent to enrich events (sinks/mod.rs `Lent`), shared
    /// by every clone; set once, after the sinks started.
    enrichers: Enrichers,
}

impl Recorder {
    pub(crate) fn new(outbox: Outbox, metrics: Metrics) -> Self {
        Self {
            outbox,
            metrics,
            enrichers: Arc::default(),
        }
    }

    /// Records an event that happened at `time` (now when `None`).
    pub(crate) fn record(&self, body: EventBody, time: Option<DateTime<Utc>>) -> Event {
        self.record_read(body, time, None)
    }

    /// [`Recorder::record`] for an event read off the ring buffer (or
    /// decided from a sample) at `read`: its delay is followed from there.
    pub(crate) fn record_read(
        &self,
        mut body: EventBody,
        time: Option<DateTime<Utc>>,
        read: Option<std::time::Instant>,
    ) -> Event {
        pod::annotate(&mut body);
        for enricher in self.enrichers.get().into_iter().flatten() {
            enricher.enrich(&mut body);
        }
        self.metrics.count_event(&body);
        self.outbox.append_read(body, time, read)
    }

    pub(crate) fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// From now on, every event is given what `enrichers` know. Once: the
    /// daemon calls it after the sinks started; a second call is ignored.
    pub(crate) fn enrich_with(&self, enrichers: Vec<Arc<dyn Enrich>>) {
        if self.enrichers.set(enrichers.into()).is_err() {
            warn!("event enrichers were already set: the second set is ignored");
        }
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}
