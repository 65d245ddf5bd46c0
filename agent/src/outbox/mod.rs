//! The outbox: every event is numbered and written to the state directory
//! (SQLite, see store.rs) before anything reads or ships it.
//!
//! - `seq` is per database, strictly increasing, and never handed out
//!   twice, even across a crash: numbers are reserved in blocks of
//!   [`SEQ_BLOCK`] persisted ahead (`reserved_seq` in the database) before
//!   any of them is handed out, and an open goes on above the reservation.
//!   A restart may so skip numbers (gaps); it never reuses one. When no
//!   reservation can be persisted (disk full) and the reserved numbers are
//!   used up, new events wait in memory **unnumbered** (seq 0, seen by no
//!   reader or sink) until a reservation can be written, then get their
//!   numbers in order: late, never twice.
//! - Each database has an epoch (store.rs); every event carries it. A
//!   corrupt database is set aside at open and a fresh one made (new
//!   epoch, seqs from 1): [`Outbox::set_aside`] says what was, for
//!   `/health`, `agent_started` and the sinks' action gate.
//! - Bounded by count (`outbox_capacity`) and age (`outbox_max_age`), with
//!   the policy [`DROP_POLICY`]: heartbeats go first, then normal events;
//!   `oom_kill`, `worker_unhealthy` and `task_rejected` only when no event
//!   of a lower priority is left; oldest first within a priority. Each
//!   removed event not yet acknowledged by every sink is counted in
//!   `memwatch_events_dropped_total{reason="outbox_full"|"expired"}`.
//! - When the state directory cannot be written (disk full, read-only), the
//!   agent keeps going: events wait in a bounded queue in memory (same
//!   policy, `reason="unpersisted_full"`), `/health` says `degraded`, and the
//!   queue is written out as soon as a write succeeds again.
//! - Each sink has a cursor (the last seq it acknowledged), stored in the
//!   same file, so that one slow sink does not hold another.

use std::{
    collections::{BTreeMap, VecDeque},
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};

pub(crate) mod store;

pub(crate) use self::store::Quarantined;
use self::store::{Store, StoreError};
use crate::{
    model::{
        event::{Event, EventBody, EventKind},
        spec::TaskRequest,
    },
    telemetry::Metrics,
};

/// Default number of events kept.
pub(crate) const DEFAULT_CAPACITY: usize = 100_000;
/// Default bytes of event JSON kept: ~100,000 events of 1.3 KiB, or a week
/// of heartbeats every 30 s at 6 KiB each.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 128 << 20;
/// Default age after which an event is removed (seven days).
pub(crate) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Events held in memory while the state directory cannot be written.
pub(crate) const PENDING_CAPACITY: usize = 10_000;
/// The name of the policy applied when a bound is reached.
pub(crate) const DROP_POLICY: &str = "drop_low_priority_first";
/// Seqs reserved (persisted) at a time; a new block is reserved once less
/// than half of one is left. A restart skips at most this many numbers.
pub(crate) const SEQ_BLOCK: u64 = 1024;
/// The seq of an event held in memory before it could be numbered.
const UNNUMBERED: u64 = 0;

/// How big the outbox may grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_events: u64,
    /// Bytes of event JSON kept (the rows' size; the file is somewhat larger).
    pub max_bytes: u64,
    pub max_age: Duration,
    /// Events held in memory while writes fail.
    pub pending: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_events: DEFAULT_CAPACITY as u64,
            max_bytes: DEFAULT_MAX_BYTES,
            max_age: DEFAULT_MAX_AGE,
            pending: PENDING_CAPACITY,
        }
    }
}

/// A snapshot for `/health`, `/v1/status` and heartbeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutboxStatus {
    /// The database's epoch: seqs are comparable only within one.
    #[serde(default)]
    pub epoch: String,
    /// A corrupt database set aside at this start, and where it went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_aside: Option<String>,
    pub last_seq: u64,
    /// Events in the database.
    pub stored: u64,
    /// Events held in memory because the state directory cannot be written.
    pub pending: u64,
    /// Why the last write failed, while writes fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist_error: Option<String>,
    pub sinks: BTreeMap<String, SinkStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SinkStatus {
    pub acked_seq: u64,
    /// Events this sink has not acknowledged yet.
    pub backlog: u64,
}

#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Mutex<Inner>>,
    host: Arc<str>,
    metrics: Metrics,
    /// The newest seq, for readers that wait for more (sinks, `events --follow`).
    newest: watch::Sender<u64>,
    /// The database's epoch.
    epoch: Arc<str>,
    /// The corrupt database set aside when this one was opened.
    set_aside: Option<Arc<Quarantined>>,
}

struct Inner {
    store: Store,
    limits: Limits,
    next_seq: u64,
    /// The highest seq persisted as reserved in this run: numbers from
    /// `next_seq` up to it may be handed out without writing.
    reserved: u64,
    /// Rows in the store (kept here so appends need no COUNT).
    stored: u64,
    /// Bytes of event JSON in the store (likewise).
    stored_bytes: u64,
    /// Not yet written, oldest first; all newer than anything stored. The
    /// unnumbered ones (seq [`UNNUMBERED`]) are the newest.
    pending: VecDeque<Event>,
    persist_error: Option<String>,
    cursors: BTreeMap<String, u64>,
    /// Cursors moved while the store could not be written.
    cursors_dirty: bool,
}

impl Outbox {
    /// Opens the durable outbox in `state_dir` (created when missing). A
    /// corrupt database is set aside (see store.rs), counted, and said in
    /// an `event_quarantined` event and [`Outbox::set_aside`].
    pub fn open(
        state_dir: &Path,
        host: impl Into<Arc<str>>,
        limits: Limits,
        metrics: Metrics,
    ) -> Result<Self, StoreError> {
        let (store, set_aside) = Store::open(state_dir)?;
        let mut outbox = Self::with_store(store, host, limits, metrics)?;
        if let Some(q) = set_aside {
            warn!(file = %q.file.display(), aside = %q.aside.display(), error = %q.error, epoch = %outbox.epoch, "the outbox database is corrupt: set aside, started afresh");
            outbox
                .metrics
                .state_quarantined
                .with_label_values(&["outbox"])
                .inc();
            let q = Arc::new(q);
            outbox.set_aside = Some(Arc::clone(&q));
            let mut body = EventBody::new(EventKind::EventQuarantined);
            body.reason = Some(outbox.describe_set_aside(&q));
            outbox.append(body, None);
        }
        Ok(outbox)
    }

    /// What was set aside, said for people (the `/health` reason).
    fn describe_set_aside(&self, q: &Quarantined) -> String {
        format!(
            "the outbox database {} was corrupt ({}): set aside as {} (kept for inspection) and \
             started afresh with epoch {}; the events, cursors and kept state of the last run are \
             in that file only",
            q.file.display(),
            q.error,
            q.aside.display(),
            self.epoch
        )
    }

    /// The corrupt database set aside when this outbox was opened, if any.
    pub(crate) fn set_aside(&self) -> Option<&Quarantined> {
        self.set_aside.as_deref()
    }

    /// The database's epoch: seqs of two epochs are not comparable.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// An outbox in memory only, bounded to `capacity` events (tests).
    pub fn new(host: impl Into<Arc<str>>, capacity: usize, metrics: Metrics) -> Self {
        let limits = Limits {
            max_events: capacity.max(1) as u64,
            ..Limits::default()
        };
        let store = Store::in_memory().expect("an in-memory SQLite database");
        Self::with_store(store, host, limits, metrics).expect("a fresh in-memory outbox")
    }

    fn with_store(
        store: Store,
        host: impl Into<Arc<str>>,
        limits: Limits,
        metrics: Metrics,
    ) -> Result<Self, StoreError> {
        // The last run may have handed out every number it reserved.
        let last = store.last_seq()?;
        let stored = store.count()?;
        let stored_bytes = store.bytes()?;
        let epoch: Arc<str> = store.epoch().into();
        let outbox = Self {
            inner: Arc::new(Mutex::new(Inner {
                store,
                limits,
                next_seq: last + 1,
                reserved: last,
                stored,
                stored_bytes,
                pending: VecDeque::new(),
                persist_error: None,
                cursors: BTreeMap::new(),
                cursors_dirty: false,
            })),
            host: host.into(),
            metrics,
            newest: watch::channel(last).0,
            epoch,
            set_aside: None,
        };
        outbox.prune_expired(Utc::now());
        outbox.metrics.outbox_stored.set(stored as i64);
        Ok(outbox)
    }

    /// Numbers and stores an event. `time` is when it happened; `None` means now.
    ///
    /// Never fails: when the state directory cannot be written the event
    /// waits in memory (see the module docs).
    pub fn append(&self, body: EventBody, time: Option<DateTime<Utc>>) -> Event {
        let kind = body.kind;
        let event = {
            let mut inner = self.lock();
            let seq = self.take_seq(&mut inner);
            let event = Event {
                id: uuid::Uuid::now_v7().to_string(),
                seq,
                time: time.unwrap_or_else(Utc::now),
                host: self.host.to_string(),
                epoch: Some(self.epoch.to_string()),
                body,
            };
            inner.pending.push_back(event.clone());
            if !self.flush(&mut inner) {
                self.metrics.outbox_unpersisted.inc();
                self.bound_pending(&mut inner);
            }
            event
        };
        self.metrics
            .events
            .with_label_values(&[kind.as_str()])
            .inc();
        if event.seq != UNNUMBERED {
            self.newest.send_replace(event.seq);
        }
        event
    }

    /// The next seq, or [`UNNUMBERED`] while events wait unnumbered or no
    /// reserved number is left (see the module docs).
    fn take_seq(&self, inner: &mut Inner) -> u64 {
        self.number_pending(inner);
        if inner.pending.back().is_some_and(|e| e.seq == UNNUMBERED) || !self.reserve(inner, 1) {
            return UNNUMBERED;
        }
        let seq = inner.next_seq;
        inner.next_seq += 1;
        seq
    }

    /// Makes sure `n` numbers from `next_seq` are reserved, persisting a
    /// new block when less than half of one (beyond `n`) is left. False
    /// when fewer than `n` are and no reservation can be written.
    fn reserve(&self, inner: &mut Inner, n: u64) -> bool {
        let left = (inner.reserved + 1).saturating_sub(inner.next_seq);
        if left >= n + SEQ_BLOCK / 2 {
            return true;
        }
        let until = inner.next_seq + n - 1 + SEQ_BLOCK;
        match inner.store.reserve_seqs(until) {
            Ok(()) => {
                inner.reserved = until;
                true
            }
            Err(error) => {
                if left < n && inner.persist_error.is_none() {
                    warn!(%error, "cannot reserve seqs; new events wait in memory unnumbered");
                    inner.persist_error = Some(error.to_string());
                }
                left >= n
            }
        }
    }

    /// Numbers the events waiting unnumbered, in order, once numbers can
    /// be reserved for them all.
    fn number_pending(&self, inner: &mut Inner) {
        let unnumbered = inner
            .pending
            .iter()
            .rev()
            .take_while(|e| e.seq == UNNUMBERED)
            .count();
        if unnumbered == 0 || !self.reserve(inner, unnumbered as u64) {
            return;
        }
        let first = inner.pending.len() - unnumbered;
        let mut seq = inner.next_seq;
        for event in inner.pending.range_mut(first..) {
            event.seq = seq;
            seq += 1;
        }
        inner.next_seq = seq;
        info!(
            events = unnumbered,
            "events held unnumbered in memory are numbered"
        );
        self.newest.send_replace(seq - 1);
    }

    /// Up to `limit` events with `seq > after`, oldest first.
    pub fn read(&self, after: u64, limit: usize) -> Vec<Event> {
        let (events, set_aside) = {
            let inner = self.lock();
            let (mut events, set_aside) = match inner.store.read(after, limit) {
                Ok(read) => read,
                Err(error) => {
                    warn!(%error, after, "cannot read the outbox database");
                    (Vec::new(), Vec::new())
                }
            };
            let room = limit.saturating_sub(events.len());
            events.extend(
                inner
                    .pending
                    .iter()
                    .filter(|e| e.seq > after)
                    .take(room)
                    .cloned(),
            );
            // Rows written by a build before epochs are of this database.
            for event in events.iter_mut().filter(|e| e.epoch.is_none()) {
                event.epoch = Some(self.epoch.to_string());
            }
            (events, set_aside)
        };
        // Said after the lock is let go: saying it appends.
        for (seq, error) in set_aside {
            warn!(seq, %error, "an outbox row does not parse: set aside, the sinks go on");
            self.metrics
                .events_dropped
                .with_label_values(&["quarantined"])
                .inc();
            let mut body = EventBody::new(EventKind::EventQuarantined);
            body.reason = Some(format!(
                "event seq {seq} of the outbox does not parse ({error}); set aside in its \
                 quarantine table for inspection, and skipped by every sink"
            ));
            self.append(body, None);
        }
        events
    }

    /// Watches the newest seq.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.newest.subscribe()
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// Makes `sink` known and returns its cursor: the last seq it
    /// acknowledged (0 for a sink never seen, which then gets everything kept).
    pub fn register_sink(&self, sink: &str) -> u64 {
        let mut inner = self.lock();
        let seq = match inner.store.cursor(sink) {
            Ok(seq) => seq.unwrap_or(0),
            Err(error) => {
                warn!(%error, sink, "cannot read the sink's cursor; starting from the oldest event kept");
                0
            }
        };
        inner.cursors.insert(sink.to_string(), seq);
        seq
    }

    /// `sink` acknowledged every event up to `seq`.
    pub fn ack(&self, sink: &str, seq: u64) {
        let mut inner = self.lock();
        inner.cursors.insert(sink.to_string(), seq);
        inner.cursors_dirty = true;
        self.flush(&mut inner);
    }

    /// Events `sink` has not acknowledged yet.
    pub fn backlog(&self, sink: &str) -> u64 {
        let inner = self.lock();
        let acked = inner.cursors.get(sink).copied().unwrap_or(0);
        backlog(&inner, acked)
    }

    pub fn status(&self) -> OutboxStatus {
        let inner = self.lock();
        OutboxStatus {
            epoch: self.epoch.to_string(),
            set_aside: self
                .set_aside
                .as_deref()
                .map(|q| self.describe_set_aside(q)),
            last_seq: inner.next_seq - 1,
            stored: inner.stored,
            pending: inner.pending.len() as u64,
            persist_error: inner.persist_error.clone(),
            sinks: inner
                .cursors
                .iter()
                .map(|(name, &acked_seq)| {
                    let backlog = backlog(&inner, acked_seq);
                    (name.clone(), SinkStatus { acked_seq, backlog })
                })
                .collect(),
        }
    }

    /// The kernel OOM-kill counters saved by the last run (see reconcile.rs);
    /// `None` when never saved or unreadable.
    pub fn saved_oom_counts(&self) -> Option<BTreeMap<String, u64>> {
        match self.lock().store.oom_counts() {
            Ok(counts) => counts,
            Err(error) => {
                warn!(%error, "cannot read the saved OOM counters");
                None
            }
        }
    }

    /// Saves the kernel OOM-kill counters; false when it could not.
    pub fn save_oom_counts(&self, counts: &BTreeMap<String, u64>) -> bool {
        match self.lock().store.save_oom_counts(counts) {
            Ok(()) => true,
            Err(error) => {
                warn!(%error, "cannot save the OOM counters");
                false
            }
        }
    }

    /// Keeps a running task in the state directory (see [`TaskRequest`]);
    /// false when it could not.
    pub(crate) fn save_task(&self, task: &TaskRequest) -> bool {
        self.lock()
            .store
            .save_task(task)
            .map_err(|error| warn!(%error, task_id = ?task.task_id, "cannot keep the task"))
            .is_ok()
    }

    pub(crate) fn remove_task(&self, task_id: &str) {
        if let Err(error) = self.lock().store.remove_task(task_id) {
            warn!(%error, ?task_id, "cannot forget the ended task");
        }
    }

    /// The running tasks the last run kept.
    pub(crate) fn saved_tasks(&self) -> Vec<TaskRequest> {
        self.lock().store.tasks().unwrap_or_else(|error| {
            warn!(%error, "cannot read the kept tasks");
            Vec::new()
        })
    }

    /// Keeps `worker` as unhealthy (its cause as JSON) across restarts.
    pub(crate) fn keep_unhealthy(&self, worker: &str, cause: serde_json::Value) {
        if let Err(error) = self.lock().store.keep_unhealthy(worker, cause) {
            warn!(%error, %worker, "cannot keep the worker's health");
        }
    }

    pub(crate) fn forget_unhealthy(&self, worker: &str) {
        if let Err(error) = self.lock().store.forget_unhealthy(worker) {
            warn!(%error, %worker, "cannot forget the worker's kept health");
        }
    }

    /// The workers the last run left unhealthy, with their causes.
    pub(crate) fn unhealthy_workers(&self) -> Vec<(String, serde_json::Value)> {
        self.lock()
            .store
            .unhealthy_workers()
            .unwrap_or_else(|error| {
                warn!(%error, "cannot read the kept worker health");
                Vec::new()
            })
    }

    /// Periodic upkeep: writes out what waits in memory (and moved
    /// cursors). Returns whether everything is written.
    pub fn maintain(&self) -> bool {
        let mut inner = self.lock();
        self.flush(&mut inner)
    }

    /// Removes events stored before `now - max_age` (see the policy).
    pub fn prune_expired(&self, now: DateTime<Utc>) {
        let mut inner = self.lock();
        let max_age =
            chrono::Duration::from_std(inner.limits.max_age).unwrap_or(chrono::Duration::MAX);
        let cutoff = now
            .checked_sub_signed(max_age)
            .map_or(i64::MIN, |t| t.timestamp_millis());
        match inner.store.remove_stored_before(cutoff) {
            Ok(seqs) => self.removed(&mut inner, &seqs, None, "expired"),
            Err(error) => warn!(%error, "cannot remove expired events"),
        }
    }

    /// Tries to write every pending event and moved cursor; true when
    /// nothing is left unwritten.
    fn flush(&self, inner: &mut Inner) -> bool {
        self.number_pending(inner);
        let numbered = inner
            .pending
            .iter()
            .take_while(|e| e.seq != UNNUMBERED)
            .count();
        if numbered > 0 {
            let events: Vec<Event> = inner.pending.iter().take(numbered).cloned().collect();
            let now_ms = Utc::now().timestamp_millis();
            let mut result = inner.store.insert(&events, now_ms);
            if result.is_err() && inner.store.checkpoint().is_ok() {
                // The log's space is free again: one more try.
                result = inner.store.insert(&events, now_ms);
            }
            match result {
                Ok(bytes) => {
                    inner.stored += events.len() as u64;
                    inner.stored_bytes += bytes;
                    inner.pending.drain(..numbered);
                    if inner.persist_error.take().is_some() {
                        info!(
                            events = events.len(),
                            "state directory writable again; events held in memory are now stored"
                        );
                    }
                    let over = inner.stored.saturating_sub(inner.limits.max_events);
                    let over_bytes = inner.stored_bytes.saturating_sub(inner.limits.max_bytes);
                    if over > 0 || over_bytes > 0 {
                        match inner.store.remove_in_drop_order(over, over_bytes) {
                            Ok((seqs, freed)) => {
                                self.removed(inner, &seqs, Some(freed), "outbox_full")
                            }
                            Err(error) => warn!(%error, "cannot remove events from a full outbox"),
                        }
                    }
                }
                Err(error) => {
                    if inner.persist_error.is_none() {
                        warn!(%error, "cannot write the outbox; holding events in memory");
                    }
                    inner.persist_error = Some(error.to_string());
                }
            }
        }
        if inner.cursors_dirty && inner.persist_error.is_none() {
            match inner.store.set_cursors(&inner.cursors) {
                Ok(()) => inner.cursors_dirty = false,
                Err(error) => warn!(%error, "cannot store the sinks' cursors; will retry"),
            }
        }
        self.metrics.outbox_stored.set(inner.stored as i64);
        self.metrics
            .outbox_stored_bytes
            .set(inner.stored_bytes as i64);
        self.metrics.outbox_pending.set(inner.pending.len() as i64);
        inner.pending.is_empty()
    }

    /// Applies the drop policy to the in-memory queue.
    fn bound_pending(&self, inner: &mut Inner) {
        while inner.pending.len() > inner.limits.pending.max(1) {
            // The first (oldest) event of the lowest priority present.
            let victim = inner
                .pending
                .iter()
                .enumerate()
                .min_by_key(|(i, e)| (e.body.kind.priority(), *i))
                .map(|(i, _)| i)
                .expect("a non-empty queue");
            let event = inner.pending.remove(victim).expect("index in range");
            self.count_dropped(inner, &[event.seq], "unpersisted_full");
        }
        self.metrics.outbox_pending.set(inner.pending.len() as i64);
    }

    /// Accounts for removed rows: `freed` bytes of JSON, or when not known
    /// (expiry, a rare sweep) the store is measured again.
    fn removed(&self, inner: &mut Inner, seqs: &[u64], freed: Option<u64>, reason: &'static str) {
        if seqs.is_empty() {
            return;
        }
        inner.stored = inner.stored.saturating_sub(seqs.len() as u64);
        match freed.map_or_else(|| inner.store.bytes(), Ok) {
            Ok(bytes) if freed.is_some() => {
                inner.stored_bytes = inner.stored_bytes.saturating_sub(bytes)
            }
            Ok(bytes) => inner.stored_bytes = bytes,
            Err(error) => warn!(%error, "cannot measure the outbox"),
        }
        self.metrics
            .outbox_stored_bytes
            .set(inner.stored_bytes as i64);
        self.count_dropped(inner, seqs, reason);
    }

    /// Counts the events in `seqs` that some sink (or, without sinks, a
    /// reader of `/v1/events`) had not received: those are lost (an
    /// unnumbered one always is).
    fn count_dropped(&self, inner: &Inner, seqs: &[u64], reason: &'static str) {
        let delivered_up_to = inner.cursors.values().copied().min().unwrap_or(0);
        let lost = seqs
            .iter()
            .filter(|&&s| s == UNNUMBERED || s > delivered_up_to)
            .count() as u64;
        if lost > 0 {
            warn!(lost, reason, policy = DROP_POLICY, "events dropped");
            self.metrics
                .events_dropped
                .with_label_values(&[reason])
                .inc_by(lost);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn backlog(inner: &Inner, acked: u64) -> u64 {
    let stored = inner.store.count_after(acked).unwrap_or(0);
    let pending = inner
        .pending
        .iter()
        .filter(|e| e.seq == UNNUMBERED || e.seq > acked)
        .count() as u64;
    stored + pending
}

#[cfg(test)]
mod tests;
