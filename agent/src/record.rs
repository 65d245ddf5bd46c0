//! The one way a new event goes into the outbox: enriched (a cgroup's pod,
//! container and QoS class, pure; the pod's names when the pod watch knows
//! them, one read lock), counted in the metrics,
//! then appended. Probe, watchdog, API, heartbeat and sink events alike pass
//! through [`Recorder::record`]; the outbox itself only stores.

use chrono::{DateTime, Utc};

use crate::{
    model::{
        event::{Event, EventBody},
        pod::{self, PodNames},
    },
    outbox::Outbox,
    telemetry::Metrics,
};

#[derive(Clone)]
pub struct Recorder {
    outbox: Outbox,
    metrics: Metrics,
    /// Pod names by UID, shared by every clone (filled by the Kubernetes
    /// sink's pod watch; empty without it).
    pods: PodNames,
}

impl Recorder {
    pub fn new(outbox: Outbox, metrics: Metrics) -> Self {
        Self {
            outbox,
            metrics,
            pods: PodNames::default(),
        }
    }

    /// Records an event that happened at `time` (now when `None`).
    pub fn record(&self, mut body: EventBody, time: Option<DateTime<Utc>>) -> Event {
        pod::annotate(&mut body);
        self.pods.name(&mut body);
        self.metrics.count_event(&body);
        self.outbox.append(body, time)
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The pod names events are given.
    pub fn pods(&self) -> &PodNames {
        &self.pods
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}
