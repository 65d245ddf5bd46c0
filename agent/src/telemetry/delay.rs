//! Where an event's delay goes, segment by segment: from the kernel's
//! stamp to the record read off the ring buffer (`kernel_to_read`), from
//! there (or from the sample that decided a soft-cap crossing) to stored
//! and synced in the outbox (`read_to_stored`), and on to each sink's
//! acknowledgement (`stored_to_sent`, and the agent's whole share,
//! `read_to_sent`). A sink sends while the outbox syncs (outbox/mod.rs):
//! an event acknowledged before it was stored has no `stored_to_sent`. Kept for OOM kills and soft-cap crossings, the events
//! a scheduler waits for; a bounded table, oldest forgotten first.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Instant,
};

use chrono::{DateTime, Utc};
use prometheus::{HistogramOpts, HistogramVec};

use super::EVENT_DELAY_SECONDS;
use crate::model::event::{Event, EventKind};

/// Events followed at once at most (a storm forgets the oldest).
const FOLLOWED: usize = 4096;
/// Fine at the low end: the agent's own share is meant to be ≤ 2 ms.
const BUCKETS: [f64; 16] = [
    0.000_25, 0.000_5, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.1, 0.25, 1.0,
];

/// An event's stamps so far.
struct Stamps {
    kind: &'static str,
    read: Instant,
    stored: Option<Instant>,
}

#[derive(Default)]
struct Followed {
    events: BTreeMap<u64, Stamps>,
    /// Every event up to this seq is stored (an event noted after the
    /// writer stored it is stored at once).
    stored_up_to: u64,
}

#[derive(Clone)]
pub struct Timeline {
    followed: Arc<Mutex<Followed>>,
    pub(crate) seconds: HistogramVec,
}

impl Timeline {
    pub(crate) fn new() -> prometheus::Result<Self> {
        let timeline = Self {
            followed: Arc::default(),
            seconds: HistogramVec::new(
                HistogramOpts::new(
                    EVENT_DELAY_SECONDS,
                    "Delay of OOM kills and soft-cap crossings, by segment of their way.",
                )
                .buckets(BUCKETS.to_vec()),
                &["kind", "segment", "sink"],
            )?,
        };
        // The series every agent has, at 0 from the start (the sinks'
        // come with their first batch).
        for (kind, segment) in [
            (EventKind::OomKill, "kernel_to_read"),
            (EventKind::OomKill, "read_to_stored"),
            (EventKind::SoftCapExceeded, "read_to_stored"),
        ] {
            timeline
                .seconds
                .with_label_values(&[kind.as_str(), segment, ""]);
        }
        Ok(timeline)
    }

    fn followed(&self) -> MutexGuard<'_, Followed> {
        self.followed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn observe(&self, kind: &str, segment: &str, sink: &str, seconds: f64) {
        self.seconds
            .with_label_values(&[kind, segment, sink])
            .observe(seconds.max(0.0));
    }

    /// A record read off the ring buffer at `read`, stamped `kernel` by
    /// the kernel.
    pub(crate) fn kernel_to_read(
        &self,
        kind: EventKind,
        kernel: DateTime<Utc>,
        read: DateTime<Utc>,
    ) {
        let seconds = (read - kernel).num_microseconds().unwrap_or(0) as f64 / 1e6;
        self.observe(kind.as_str(), "kernel_to_read", "", seconds);
    }

    /// `event` was appended for something read (or decided) at `read`.
    pub(crate) fn read(&self, event: &Event, read: Instant) {
        let kind = match event.body.kind {
            EventKind::OomKill => EventKind::OomKill.as_str(),
            EventKind::SoftCapExceeded => EventKind::SoftCapExceeded.as_str(),
            _ => return,
        };
        let mut followed = self.followed();
        let stored = (event.seq <= followed.stored_up_to).then(|| {
            let now = Instant::now();
            self.observe(kind, "read_to_stored", "", (now - read).as_secs_f64());
            now
        });
        followed
            .events
            .insert(event.seq, Stamps { kind, read, stored });
        while followed.events.len() > FOLLOWED {
            followed.events.pop_first();
        }
    }

    /// Every event up to `seq` is stored and synced.
    pub(crate) fn stored(&self, seq: u64) {
        let now = Instant::now();
        let mut followed = self.followed();
        followed.stored_up_to = followed.stored_up_to.max(seq);
        for (_, stamps) in followed
            .events
            .range_mut(..=seq)
            .filter(|(_, s)| s.stored.is_none())
        {
            stamps.stored = Some(now);
            self.observe(
                stamps.kind,
                "read_to_stored",
                "",
                (now - stamps.read).as_secs_f64(),
            );
        }
    }

    /// `sink` acknowledged `batch`.
    pub(crate) fn sent(&self, sink: &str, batch: &[Event]) {
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            return;
        };
        let now = Instant::now();
        let followed = self.followed();
        for (_, stamps) in followed.events.range(first.seq..=last.seq) {
            self.observe(
                stamps.kind,
                "read_to_sent",
                sink,
                (now - stamps.read).as_secs_f64(),
            );
            if let Some(stored) = stamps.stored {
                self.observe(
                    stamps.kind,
                    "stored_to_sent",
                    sink,
                    (now - stored).as_secs_f64(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::EventBody;

    fn event(seq: u64, kind: EventKind) -> Event {
        Event {
            id: seq.to_string(),
            seq,
            time: Utc::now(),
            host: "h".into(),
            epoch: None,
            body: EventBody::new(kind),
        }
    }

    fn count(timeline: &Timeline, kind: &str, segment: &str, sink: &str) -> u64 {
        timeline
            .seconds
            .with_label_values(&[kind, segment, sink])
            .get_sample_count()
    }

    /// Each followed event is observed once per segment: stored once (a
    /// later `stored` does not count it again), sent once per sink; other
    /// kinds are not followed, and the table keeps the newest only.
    #[test]
    fn segments_are_observed_once_per_followed_event() {
        let timeline = Timeline::new().unwrap();
        let read = Instant::now();
        let events = [
            event(1, EventKind::OomKill),
            event(2, EventKind::Heartbeat),
            event(3, EventKind::SoftCapExceeded),
        ];
        for e in &events {
            timeline.read(e, read);
        }
        timeline.stored(2);
        timeline.stored(3);
        timeline.sent("webhook", &events);
        timeline.sent("nats", &events[..1]);
        assert_eq!(count(&timeline, "oom_kill", "read_to_stored", ""), 1);
        assert_eq!(
            count(&timeline, "soft_cap_exceeded", "read_to_stored", ""),
            1
        );
        assert_eq!(count(&timeline, "heartbeat", "read_to_stored", ""), 0);
        assert_eq!(count(&timeline, "oom_kill", "read_to_sent", "webhook"), 1);
        assert_eq!(count(&timeline, "oom_kill", "stored_to_sent", "nats"), 1);
        assert_eq!(
            count(&timeline, "soft_cap_exceeded", "read_to_sent", "nats"),
            0
        );
        let now = Utc::now();
        timeline.kernel_to_read(
            EventKind::OomKill,
            now - chrono::Duration::milliseconds(3),
            now,
        );
        let kernel = timeline
            .seconds
            .with_label_values(&["oom_kill", "kernel_to_read", ""]);
        assert!((kernel.get_sample_sum() - 0.003).abs() < 1e-6);
        for seq in 10..10 + FOLLOWED as u64 + 5 {
            timeline.read(&event(seq, EventKind::OomKill), read);
        }
        let followed = timeline.followed();
        assert_eq!(followed.events.len(), FOLLOWED, "bounded");
        assert_eq!(
            followed.events.first_key_value().map(|(k, _)| *k),
            Some(15),
            "oldest forgotten"
        );
    }

    /// The writer may store an event before the recorder notes it read:
    /// it is then stored at once, not left without its segment.
    #[test]
    fn an_event_noted_after_it_was_stored_is_stored_at_once() {
        let timeline = Timeline::new().unwrap();
        timeline.stored(5);
        timeline.read(&event(5, EventKind::OomKill), Instant::now());
        timeline.sent("webhook", &[event(5, EventKind::OomKill)]);
        assert_eq!(count(&timeline, "oom_kill", "read_to_stored", ""), 1);
        assert_eq!(count(&timeline, "oom_kill", "stored_to_sent", "webhook"), 1);
    }
}
