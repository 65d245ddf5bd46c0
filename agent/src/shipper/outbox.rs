//! The outbox: every event is appended here, numbered, before anything reads
//! or ships it.
//!
//! This one lives in memory and is bounded: when full it drops the oldest
//! event and counts the drop (`memwatch_events_dropped_total{reason="outbox_full"}`).
//! The delivery issue replaces it with a durable store under `--state-dir`
//! whose `seq` survives restarts.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::{
    event::{Event, EventBody},
    telemetry::Metrics,
};

/// Default number of events kept in memory.
pub const DEFAULT_CAPACITY: usize = 10_000;

#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Mutex<Inner>>,
    host: Arc<str>,
    metrics: Metrics,
    /// The newest seq, for readers that wait for more (`events --follow`).
    newest: watch::Sender<u64>,
}

struct Inner {
    next_seq: u64,
    capacity: usize,
    events: VecDeque<Event>,
}

impl Outbox {
    pub fn new(host: impl Into<Arc<str>>, capacity: usize, metrics: Metrics) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                next_seq: 1,
                capacity: capacity.max(1),
                events: VecDeque::new(),
            })),
            host: host.into(),
            metrics,
            newest: watch::channel(0).0,
        }
    }

    /// Numbers and stores an event. `time` is when it happened; `None` means now.
    pub fn append(&self, body: EventBody, time: Option<DateTime<Utc>>) -> Event {
        let kind = body.kind;
        let event = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let seq = inner.next_seq;
            inner.next_seq += 1;
            let event = Event {
                id: uuid::Uuid::now_v7().to_string(),
                seq,
                time: time.unwrap_or_else(Utc::now),
                host: self.host.to_string(),
                body,
            };
            if inner.events.len() == inner.capacity {
                inner.events.pop_front();
                self.metrics
                    .events_dropped
                    .with_label_values(&["outbox_full"])
                    .inc();
            }
            inner.events.push_back(event.clone());
            event
        };
        self.metrics
            .events
            .with_label_values(&[kind.as_str()])
            .inc();
        self.newest.send_replace(event.seq);
        event
    }

    /// Up to `limit` events with `seq > after`, oldest first.
    pub fn read(&self, after: u64, limit: usize) -> Vec<Event> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // Events are in seq order: skip by binary search, not a scan.
        let start = inner.events.partition_point(|e| e.seq <= after);
        inner.events.range(start..).take(limit).cloned().collect()
    }

    /// Watches the newest seq.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.newest.subscribe()
    }

    pub fn host(&self) -> &str {
        &self.host
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    fn outbox(capacity: usize) -> (Outbox, Metrics) {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        (Outbox::new("h1", capacity, metrics.clone()), metrics)
    }

    #[test]
    fn seq_increases_and_ids_are_unique() {
        let (outbox, _) = outbox(10);
        let a = outbox.append(EventBody::new(EventKind::AgentStarted), None);
        let b = outbox.append(EventBody::new(EventKind::OomKill), None);
        assert_eq!((a.seq, b.seq), (1, 2));
        assert_ne!(a.id, b.id);
        assert_eq!(a.host, "h1");
    }

    #[test]
    fn read_pages_after_a_seq() {
        let (outbox, _) = outbox(10);
        for _ in 0..5 {
            outbox.append(EventBody::new(EventKind::OomKill), None);
        }
        let seqs = |after, limit| -> Vec<u64> {
            outbox.read(after, limit).iter().map(|e| e.seq).collect()
        };
        assert_eq!(seqs(0, 2), [1, 2]);
        assert_eq!(seqs(2, 10), [3, 4, 5]);
        assert!(seqs(5, 10).is_empty());
    }

    #[test]
    fn full_outbox_drops_oldest_and_counts_it() {
        let (outbox, metrics) = outbox(3);
        for _ in 0..5 {
            outbox.append(EventBody::new(EventKind::OomKill), None);
        }
        let seqs: Vec<u64> = outbox.read(0, 10).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5]);
        assert_eq!(
            metrics
                .events_dropped
                .with_label_values(&["outbox_full"])
                .get(),
            2
        );
        assert_eq!(metrics.events.with_label_values(&["oom_kill"]).get(), 5);
    }
}
