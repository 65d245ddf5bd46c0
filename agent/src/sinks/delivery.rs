//! One delivery loop for every sink: read a batch after the sink's cursor,
//! send it until the sink acknowledges it, then move the cursor.
//!
//! Guarantees: at least once (a batch is sent again until acknowledged,
//! with the same event ids), in seq order per sink (the next batch waits
//! for the previous one), and no sink waits for another (each has its own
//! cursor and task).

use std::{future::Future, time::Duration};

use backon::{BackoffBuilder as _, ExponentialBuilder};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::{
    model::event::Event,
    outbox::Outbox,
    sinks::config::Delivery,
    telemetry::{
        Metrics,
        liveness::{Beat, IDLE_BEAT},
    },
};

/// Why an attempt failed; a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureClass {
    /// No connection (refused, unreachable, DNS, TLS).
    Connect,
    /// No answer in time.
    Timeout,
    /// An answer that is not an acknowledgement (HTTP non-2xx, JetStream error).
    Status,
    /// The far end refuses this batch for good (HTTP 4xx but 408 and 429:
    /// too large, malformed): sending it again would fail again. The batch
    /// is split; a single event refused is parked (skipped and counted).
    Refused,
    Other,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Status => "status",
            Self::Refused => "refused",
            Self::Other => "other",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SendError {
    pub class: FailureClass,
    pub message: String,
}

impl SendError {
    pub fn new(class: FailureClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
        }
    }

    /// A request that got no answer (the HTTP sinks: webhook, Dask, OTLP
    /// over HTTP): a timeout, a refused connection, or anything else.
    pub(crate) fn from_reqwest(error: reqwest::Error) -> Self {
        let class = if error.is_timeout() {
            FailureClass::Timeout
        } else if error.is_connect() {
            FailureClass::Connect
        } else {
            FailureClass::Other
        };
        // The source chain says why (refused, reset, …); Display alone does not.
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::new(class, message)
    }
}

/// Somewhere events go. `send` returns `Ok` only once the far end has
/// acknowledged every event of the batch.
pub trait Sink: Send + 'static {
    /// Metric label and cursor key.
    fn name(&self) -> &str;
    fn delivery(&self) -> &Delivery;
    fn send(&mut self, batch: &[Event]) -> impl Future<Output = Result<(), SendError>> + Send;
}

/// The pauses between attempts: exponential from `retry_initial`, capped
/// at `retry_max`, each with random jitter, never giving up.
pub(crate) fn backoff(delivery: &Delivery) -> impl Iterator<Item = Duration> + Send + use<> {
    ExponentialBuilder::new()
        .with_min_delay(delivery.retry_initial)
        .with_max_delay(delivery.retry_max)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Delivers until `shutdown` turns true. Events in flight when it does are
/// sent again at the next start (at least once).
pub async fn run<S: Sink>(
    sink: S,
    outbox: Outbox,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
) {
    run_beating(sink, outbox, metrics, shutdown, None).await;
}

/// Sends `batch` until the far end takes it (`Some(false)`) or refuses it
/// for good (`Some(true)`), pausing with backoff between failed attempts;
/// `None` at shutdown.
async fn send_until_taken<S: Sink>(
    sink: &mut S,
    batch: &[Event],
    metrics: &Metrics,
    shutdown: &mut watch::Receiver<bool>,
    beat: &impl Fn(),
) -> Option<bool> {
    let name = sink.name().to_string();
    let delivery = *sink.delivery();
    let (first, last) = (batch[0].seq, batch[batch.len() - 1].seq);
    let retries = metrics.sink_retries.with_label_values(&[name.as_str()]);
    let mut pauses = backoff(&delivery);
    loop {
        beat();
        let result = tokio::select! {
            result = sink.send(batch) => result,
            _ = shutdown.changed() => return None,
        };
        let Err(error) = result else {
            return Some(false);
        };
        metrics
            .sink_failures
            .with_label_values(&[name.as_str(), error.class.as_str()])
            .inc();
        if error.class == FailureClass::Refused {
            warn!(sink = %name, first_seq = first, last_seq = last, events = batch.len(), %error, "batch refused for good");
            return Some(true);
        }
        let pause = pauses.next().unwrap_or(delivery.retry_max);
        warn!(
            sink = %name,
            first_seq = first,
            last_seq = last,
            class = error.class.as_str(),
            %error,
            retry_in = ?pause,
            "delivery failed; will retry"
        );
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return None,
        }
        retries.inc();
    }
}

/// The period a sink's loop beats at, at least (see [`run_beating`]): a
/// send takes up to `timeout`, a pause up to `retry_max`.
pub(crate) fn beat_period(delivery: &Delivery) -> Duration {
    (delivery.timeout + delivery.retry_max).max(IDLE_BEAT)
}

/// [`run`], beating `beat` at every attempt and pause, and every
/// [`IDLE_BEAT`] while there is nothing to send.
pub(crate) async fn run_beating<S: Sink>(
    mut sink: S,
    outbox: Outbox,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
    beat: Option<Beat>,
) {
    let beat = || {
        if let Some(b) = &beat {
            b.beat();
        }
    };
    let name = sink.name().to_string();
    let delivery = *sink.delivery();
    let mut acked = outbox.register_sink(&name);
    // Events per batch now: halved while the far end refuses batches,
    // doubled back after each one it takes.
    let mut limit = delivery.batch_size;
    let mut newest = outbox.subscribe();
    info!(sink = %name, acked_seq = acked, "delivery started");
    let backlog = metrics.sink_backlog.with_label_values(&[name.as_str()]);
    let delivered = metrics.sink_delivered.with_label_values(&[name.as_str()]);
    backlog.set(outbox.backlog(&name) as i64);
    loop {
        beat();
        if *shutdown.borrow() {
            return;
        }
        // Read at once (an event queued for the writer is read from
        // memory); the backlog, which may count in the database, is set
        // after a batch is acknowledged and before waiting, never between
        // an event's wake-up and its send.
        let batch = cut_to_bytes(outbox.read(acked, limit), delivery.batch_bytes);
        let Some(last) = batch.last().map(|e| e.seq) else {
            backlog.set(outbox.backlog(&name) as i64);
            tokio::select! {
                changed = newest.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(IDLE_BEAT) => {}
            }
            continue;
        };
        let first = batch[0].seq;
        let refused =
            match send_until_taken(&mut sink, &batch, &metrics, &mut shutdown, &beat).await {
                Some(refused) => refused,
                None => return,
            };
        if refused && batch.len() > 1 {
            // Smaller batches: the offending event ends up alone.
            limit = batch.len() / 2;
            continue;
        }
        if refused {
            // One event the far end will never take: parked, so that the
            // ones after it are not held for ever.
            warn!(sink = %name, seq = first, id = %batch[0].id, kind = batch[0].body.kind.as_str(), "event refused for good: parked (skipped by this sink)");
            metrics.events_dropped.with_label_values(&["refused"]).inc();
        } else {
            delivered.inc_by(batch.len() as u64);
            metrics.timeline.sent(&name, &batch);
            limit = (limit * 2).min(delivery.batch_size);
        }
        outbox.ack(&name, last);
        acked = last;
        backlog.set(outbox.backlog(&name) as i64);
        debug!(sink = %name, first_seq = first, last_seq = last, "batch acknowledged");
    }
}

/// The first events of `batch` whose JSON fits in `max` bytes together
/// (one event at least: one larger than `max` goes alone, and the far end
/// says whether it takes it).
fn cut_to_bytes(mut batch: Vec<Event>, max: usize) -> Vec<Event> {
    let mut total = 0;
    let fits = batch
        .iter()
        .position(|event| {
            // A JSON array: the events and a comma between each.
            total += serde_json::to_vec(event).map_or(0, |v| v.len()) + 1;
            total > max + 1
        })
        .unwrap_or(batch.len());
    batch.truncate(fits.max(1));
    batch
}

#[cfg(test)]
mod tests {
    use std::{
        collections::VecDeque,
        sync::{Arc, Mutex},
    };

    use tokio::time::Instant;

    use super::*;
    use crate::model::event::{EventBody, EventKind};

    /// When a batch was sent, and the seqs in it.
    type Calls = Arc<Mutex<Vec<(Instant, Vec<u64>)>>>;

    /// Fails as scripted, records what it was given and when.
    struct ScriptedSink {
        delivery: Delivery,
        failures: VecDeque<FailureClass>,
        calls: Calls,
    }

    impl Sink for ScriptedSink {
        fn name(&self) -> &str {
            "scripted"
        }
        fn delivery(&self) -> &Delivery {
            &self.delivery
        }
        async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
            let seqs = batch.iter().map(|e| e.seq).collect();
            self.calls.lock().unwrap().push((Instant::now(), seqs));
            match self.failures.pop_front() {
                Some(class) => Err(SendError::new(class, "scripted failure")),
                None => Ok(()),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_batches_are_retried_in_order_with_growing_capped_backoff() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics.clone());
        for _ in 0..5 {
            outbox.append(EventBody::new(EventKind::OomKill), None);
        }
        let delivery = Delivery {
            batch_size: 3,
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(8),
            ..Delivery::default()
        };
        let calls: Calls = Arc::default();
        let sink = ScriptedSink {
            delivery,
            failures: [FailureClass::Connect; 7].into(),
            calls: Arc::clone(&calls),
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(sink, outbox.clone(), metrics.clone(), stopped));
        let start = Instant::now();
        for _ in 0..1000 {
            if outbox.backlog("scripted") == 0 && calls.lock().unwrap().len() == 9 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();

        let calls = calls.lock().unwrap();
        let batches: Vec<&Vec<u64>> = calls.iter().map(|(_, b)| b).collect();
        // The same first batch until it is acknowledged, then the rest.
        assert_eq!(batches.len(), 9, "{batches:?}");
        assert!(batches[..8].iter().all(|b| **b == [1, 2, 3]), "{batches:?}");
        assert_eq!(*batches[8], [4, 5]);
        // Pauses grow, stay within jitter bounds, and are capped.
        let pauses: Vec<Duration> = calls.windows(2).take(7).map(|w| w[1].0 - w[0].0).collect();
        for (i, pause) in pauses.iter().enumerate() {
            let base = Duration::from_secs(1 << i.min(3));
            assert!(
                *pause >= base && *pause <= base * 2 + Duration::from_millis(1),
                "pause {i} is {pause:?}: {pauses:?}"
            );
        }
        assert!(start.elapsed() < Duration::from_secs(120));
        assert_eq!(
            metrics
                .sink_failures
                .with_label_values(&["scripted", "connect"])
                .get(),
            7
        );
        assert_eq!(
            metrics.sink_retries.with_label_values(&["scripted"]).get(),
            7
        );
        assert_eq!(
            metrics
                .sink_delivered
                .with_label_values(&["scripted"])
                .get(),
            5
        );
        assert_eq!(outbox.status().sinks["scripted"].acked_seq, 5);
    }

    /// The backlog gauge is set when delivery starts (a far end down from
    /// the start still shows what waits), after each acknowledgement and
    /// before waiting; never between an event's wake-up and its send.
    #[tokio::test(start_paused = true)]
    async fn the_backlog_gauge_shows_what_waits_and_empties_with_delivery() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics.clone());
        for _ in 0..5 {
            outbox.append(EventBody::new(EventKind::OomKill), None);
        }
        let delivery = Delivery {
            batch_size: 2,
            retry_initial: Duration::from_secs(10),
            retry_max: Duration::from_secs(10),
            ..Delivery::default()
        };
        let calls: Calls = Arc::default();
        let sink = ScriptedSink {
            delivery,
            failures: [FailureClass::Connect; 2].into(),
            calls: Arc::clone(&calls),
        };
        let gauge = metrics.sink_backlog.with_label_values(&["scripted"]);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(sink, outbox.clone(), metrics.clone(), stopped));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.lock().unwrap().len(), 1, "the first attempt failed");
        assert_eq!(gauge.get(), 5, "set at start, while the far end is down");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(outbox.backlog("scripted"), 0);
        assert_eq!(gauge.get(), 0, "emptied with delivery");
        outbox.append(EventBody::new(EventKind::OomKill), None);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(gauge.get(), 0, "the new event was sent and acknowledged");
        assert_eq!(calls.lock().unwrap().last().unwrap().1, [6]);
        stop.send(true).unwrap();
        task.await.unwrap();
    }
}

#[cfg(test)]
mod refused_tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::model::event::{EventBody, EventKind};

    /// Refuses (for good) any batch of more than 2 events, and any batch
    /// holding seq 5; takes the rest.
    struct Picky {
        delivery: Delivery,
        taken: Arc<Mutex<Vec<u64>>>,
    }

    impl Sink for Picky {
        fn name(&self) -> &str {
            "picky"
        }
        fn delivery(&self) -> &Delivery {
            &self.delivery
        }
        async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
            if batch.len() > 2 || batch.iter().any(|e| e.seq == 5) {
                return Err(SendError::new(FailureClass::Refused, "413"));
            }
            self.taken
                .lock()
                .unwrap()
                .extend(batch.iter().map(|e| e.seq));
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refused_batches_are_split_and_an_event_refused_alone_is_parked() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics.clone());
        for _ in 0..9 {
            outbox.append(EventBody::new(EventKind::TaskStarted), None);
        }
        let taken = Arc::new(Mutex::new(Vec::new()));
        let sink = Picky {
            delivery: Delivery {
                batch_size: 8,
                ..Delivery::default()
            },
            taken: Arc::clone(&taken),
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(sink, outbox.clone(), metrics.clone(), stopped));
        for _ in 0..100 {
            if outbox.backlog("picky") == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();
        assert_eq!(
            *taken.lock().unwrap(),
            [1, 2, 3, 4, 6, 7, 8, 9],
            "in order, 5 parked"
        );
        assert_eq!(
            metrics.events_dropped.with_label_values(&["refused"]).get(),
            1
        );
        assert_eq!(outbox.backlog("picky"), 0, "nothing held for ever");
    }

    /// A batch's seqs and its size as JSON.
    type Taken = (Vec<u64>, usize);

    /// Takes every batch; keeps each one's seqs and size.
    struct Recording {
        delivery: Delivery,
        batches: Arc<Mutex<Vec<Taken>>>,
    }

    impl Sink for Recording {
        fn name(&self) -> &str {
            "recording"
        }
        fn delivery(&self) -> &Delivery {
            &self.delivery
        }
        async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
            let bytes = serde_json::to_vec(batch).unwrap().len();
            let seqs = batch.iter().map(|e| e.seq).collect();
            self.batches.lock().unwrap().push((seqs, bytes));
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn batches_are_cut_by_bytes_and_a_larger_event_goes_alone() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics.clone());
        for i in 0..12 {
            let mut body = EventBody::new(EventKind::TaskStarted);
            // ~3 KiB each; the 7th ~20 KiB, over the bound by itself.
            let size = if i == 6 { 20 << 10 } else { 3 << 10 };
            body.reason = Some("x".repeat(size));
            outbox.append(body, None);
        }
        let batches = Arc::new(Mutex::new(Vec::new()));
        let sink = Recording {
            delivery: Delivery {
                batch_size: 100,
                batch_bytes: 8 << 10,
                ..Delivery::default()
            },
            batches: Arc::clone(&batches),
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(sink, outbox.clone(), metrics.clone(), stopped));
        for _ in 0..100 {
            if outbox.backlog("recording") == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();
        let batches = batches.lock().unwrap();
        let seqs: Vec<u64> = batches.iter().flat_map(|(s, _)| s.clone()).collect();
        assert_eq!(
            seqs,
            (1..=12).collect::<Vec<_>>(),
            "every event, in order, once"
        );
        for (seqs, bytes) in batches.iter() {
            if seqs == &[7] {
                assert!(*bytes > 8 << 10, "the large one alone: {bytes}");
            } else {
                assert!(*bytes <= 8 << 10, "{seqs:?}: {bytes} bytes");
                // Two fit in 8 KiB: only the last one is alone.
                assert!(
                    seqs.len() == 2 || seqs == &[12],
                    "cut no smaller than needed: {seqs:?}"
                );
            }
        }
    }
}
