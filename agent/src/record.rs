//! The one way a new event goes into the outbox: enriched (a cgroup's pod,
//! container and QoS class; pure and non-blocking), counted in the metrics,
//! then appended. Probe, watchdog, API, heartbeat and sink events alike pass
//! through [`Recorder::record`]; the outbox itself only stores.

use chrono::{DateTime, Utc};

use crate::{
    model::{
        event::{Event, EventBody},
        pod,
    },
    outbox::Outbox,
    telemetry::Metrics,
};

#[derive(Clone)]
pub struct Recorder {
    outbox: Outbox,
    metrics: Metrics,
}

impl Recorder {
    pub fn new(outbox: Outbox, metrics: Metrics) -> Self {
        Self { outbox, metrics }
    }

    /// Records an event that happened at `time` (now when `None`).
    pub fn record(&self, mut body: EventBody, time: Option<DateTime<Utc>>) -> Event {
        pod::annotate(&mut body);
        self.metrics.count_event(&body);
        self.outbox.append(body, time)
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}
