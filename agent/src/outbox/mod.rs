//! The outbox: every event is numbered at once and written to the state
//! directory (SQLite, see store.rs) by a writer thread, many events to one
//! commit (writer.rs); sinks are woken at append and send an event while
//! it is being written, and the cursor stored for each never passes the
//! newest stored event (docs/delivery.md, "Sent before stored"). Appending never
//! waits for the disk, nor does [`Outbox::status`]; calls that read or
//! write the database from async code move off the runtime's workers
//! first, so a disk that hangs stalls the loops that need it, never the
//! API (`/live` then names them). A reader may see an event still queued
//! for the writer; its seq is final all the same.
//!
//! - `seq` is per database, strictly increasing, and never handed out
//!   twice, even across a crash: numbers are reserved in blocks of
//!   [`SEQ_BLOCK`] persisted ahead (`reserved_seq` in the database) before
//!   any of them is handed out, and an open goes on above the reservation.
//!   A restart may so skip numbers (gaps); it never reuses one. The writer
//!   keeps a block reserved ahead, so appends number without writing. When
//!   no reservation can be persisted (disk full) and the reserved numbers
//!   are used up, new events wait in memory **unnumbered** (seq 0, seen by
//!   no reader or sink) until a reservation can be written, then get their
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
//!
//! Longer than 600 lines: the numbering, the bound and the in-memory queue
//! share one lock (`Core`); keeping them in one file keeps the guarantees
//! above checkable in one reading. The SQLite part is store.rs, the writer
//! thread writer.rs.

use std::{
    collections::{BTreeMap, VecDeque},
    path::Path,
    sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, TryLockError},
    time::Duration,
};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::{runtime::RuntimeFlavor, sync::watch};
use tracing::warn;

pub(crate) mod store;
mod writer;

pub(crate) use self::store::Quarantined;
use self::{
    store::{KeptTask, Store, StoreError},
    writer::unnumbered,
};
use crate::{
    model::{
        event::{Event, EventBody, EventKind},
        spec::TaskRequest,
    },
    telemetry::{
        Metrics,
        liveness::{Beat, Liveness},
    },
};

/// Default number of events kept.
pub(crate) const DEFAULT_CAPACITY: usize = 100_000;
/// Default bytes of event JSON kept: ~100,000 events of 1.3 KiB, or a week
/// of heartbeats every 30 s at 6 KiB each.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 128 << 20;
/// Default age after which an event is removed (seven days).
pub(crate) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Events queued in memory for the writer at most: while the state
/// directory cannot be written, the drop policy keeps to it; while it can,
/// an append waits (at most [`APPEND_WAIT`]) for room instead.
pub(crate) const PENDING_CAPACITY: usize = 10_000;
/// How long an append waits for the writer to make room in a full queue.
const APPEND_WAIT: Duration = Duration::from_secs(1);
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
    /// Events queued in memory (the bound while writes fail).
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

/// The outbox: cheap to clone, shared by every part of the agent.
#[derive(Clone)]
pub struct Outbox {
    /// First, so that dropping the last clone stops the writer (which
    /// writes what is left) before the database is closed.
    writer: Arc<writer::Handle>,
    core: Arc<Core>,
}

/// What the clones share. Lock order: `store`, then `mem`; `mem` is never
/// held while the database is written, so appending never waits for a disk.
struct Core {
    store: Mutex<Store>,
    mem: Mutex<Mem>,
    /// Signalled when the writer has taken events off the queue.
    room: Condvar,
    host: Arc<str>,
    metrics: Metrics,
    /// The newest seq stored and synced ([`Outbox::stored`] waits on it).
    newest: watch::Sender<u64>,
    /// The newest seq handed out, for readers that wait for more (the
    /// sinks): told at append, before the event is stored.
    numbered: watch::Sender<u64>,
    /// The database's epoch.
    epoch: Arc<str>,
    /// The corrupt database set aside when this one was opened.
    set_aside: OnceLock<Quarantined>,
    /// The writer's liveness beat, once the agent watches it.
    beat: Mutex<Option<Beat>>,
}

struct Mem {
    limits: Limits,
    next_seq: u64,
    /// The highest seq persisted as reserved in this run: numbers from
    /// `next_seq` up to it may be handed out without writing.
    reserved: u64,
    /// Rows in the store (kept here so appends need no COUNT).
    stored: u64,
    /// The highest seq in the store (0: none).
    newest_stored: u64,
    /// Bytes of event JSON in the store (likewise).
    stored_bytes: u64,
    /// Not yet written, oldest first; all newer than anything stored. The
    /// unnumbered ones (seq [`UNNUMBERED`]) are the newest.
    pending: VecDeque<Event>,
    /// How many of the first `pending` events a write round is writing
    /// now: the drop policy leaves them alone.
    in_flight: usize,
    persist_error: Option<String>,
    cursors: BTreeMap<String, u64>,
    /// Cursors moved since they were last stored.
    cursors_dirty: bool,
    /// An expiry asked for by [`Outbox::expire`], for the writer thread:
    /// events stored before this (ms since the epoch) are removed.
    expire_before: Option<i64>,
    /// Changes to the kept tasks not yet written, oldest first: written
    /// with the events of the same round (a registration costs one sync,
    /// shared with its `task_started`). At most [`MAX_KEPT_QUEUED`].
    kept: VecDeque<KeptTask>,
}

/// Changes to the kept tasks queued at most; one more first writes the
/// queue in the caller's thread (order kept, nothing dropped).
const MAX_KEPT_QUEUED: usize = 16_384;

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
        let outbox = Self::with_store(store, host, limits, metrics)?;
        if let Some(q) = set_aside {
            warn!(file = %q.file.display(), aside = %q.aside.display(), error = %q.error, epoch = %outbox.core.epoch, "the outbox database is corrupt: set aside, started afresh");
            outbox
                .core
                .metrics
                .state_quarantined
                .with_label_values(&["outbox"])
                .inc();
            let mut body = EventBody::new(EventKind::EventQuarantined);
            body.reason = Some(outbox.describe_set_aside(&q));
            let _ = outbox.core.set_aside.set(q);
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
            self.core.epoch
        )
    }

    /// The corrupt database set aside when this outbox was opened, if any.
    pub(crate) fn set_aside(&self) -> Option<&Quarantined> {
        self.core.set_aside.get()
    }

    /// The database's epoch: seqs of two epochs are not comparable.
    pub fn epoch(&self) -> &str {
        &self.core.epoch
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
        let newest_stored = store.newest_stored()?;
        let stored_bytes = store.bytes()?;
        let epoch: Arc<str> = store.epoch().into();
        // The first block, so that appends number at once; without it
        // (a full disk) events wait unnumbered for the writer.
        let reserved = match store.reserve_seqs(last + SEQ_BLOCK) {
            Ok(()) => last + SEQ_BLOCK,
            Err(error) => {
                warn!(%error, "cannot reserve seqs; new events wait in memory unnumbered");
                last
            }
        };
        let core = Arc::new(Core {
            store: Mutex::new(store),
            mem: Mutex::new(Mem {
                limits,
                next_seq: last + 1,
                reserved,
                stored,
                newest_stored,
                stored_bytes,
                pending: VecDeque::new(),
                in_flight: 0,
                persist_error: None,
                cursors: BTreeMap::new(),
                cursors_dirty: false,
                expire_before: None,
                kept: VecDeque::new(),
            }),
            room: Condvar::new(),
            host: host.into(),
            metrics,
            newest: watch::channel(last).0,
            numbered: watch::channel(last).0,
            epoch,
            set_aside: OnceLock::new(),
            beat: Mutex::new(None),
        });
        let outbox = Self {
            writer: Arc::new(writer::Handle::spawn(Arc::clone(&core))),
            core,
        };
        outbox.prune_expired(Utc::now());
        outbox.core.metrics.outbox_stored.set(stored as i64);
        Ok(outbox)
    }

    /// Numbers an event and queues it for the writer thread, which stores
    /// it within milliseconds, many events to one commit (see writer.rs).
    /// `time` is when it happened; `None` means now.
    ///
    /// Never waits for the disk and never fails: when the state directory
    /// cannot be written the event waits in memory (see the module docs).
    pub fn append(&self, body: EventBody, time: Option<DateTime<Utc>>) -> Event {
        self.append_read(body, time, None)
    }

    /// [`Outbox::append`] for an event read (or decided) at `read`: its
    /// delay is followed from there (`memwatch_event_delay_seconds`),
    /// stamped before any sink is told of it, so none sends it unstamped.
    pub fn append_read(
        &self,
        body: EventBody,
        time: Option<DateTime<Utc>>,
        read: Option<std::time::Instant>,
    ) -> Event {
        let kind = body.kind;
        self.wait_for_room();
        let event = {
            let mut mem = self.core.mem();
            let seq = take_seq(&mut mem);
            let event = Event {
                id: uuid::Uuid::now_v7().to_string(),
                seq,
                time: time.unwrap_or_else(Utc::now),
                host: self.core.host.to_string(),
                epoch: Some(self.core.epoch.to_string()),
                body,
            };
            mem.pending.push_back(event.clone());
            if mem.persist_error.is_some() {
                // Counted once: those made before writes failed are
                // counted by the round that found out (writer.rs).
                self.core.metrics.outbox_unpersisted.inc();
            }
            self.core.bound_pending(&mut mem);
            event
        };
        self.core
            .metrics
            .events
            .with_label_values(&[kind.as_str()])
            .inc();
        if let Some(read) = read {
            self.core.metrics.timeline.read(&event, read);
        }
        self.writer.wake();
        if event.seq != UNNUMBERED {
            self.core.numbered(event.seq);
        }
        event
    }

    /// A burst faster than the disk: while the queue is full and writes
    /// succeed, waits (at most [`APPEND_WAIT`]) for the writer to make
    /// room rather than drop; once writes fail, the drop policy applies.
    fn wait_for_room(&self) {
        let full = |mem: &Mem| {
            mem.pending.len() >= mem.limits.pending.max(1) && mem.persist_error.is_none()
        };
        if !full(&self.core.mem()) {
            return;
        }
        off_runtime(|| {
            let deadline = std::time::Instant::now() + APPEND_WAIT;
            let mut mem = self.core.mem();
            while full(&mem) {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                self.writer.wake();
                mem = self
                    .core
                    .room
                    .wait_timeout(mem, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        })
    }

    /// Up to `limit` events with `seq > after`, oldest first: those stored,
    /// then those still waiting for the writer.
    ///
    /// Never waits for a write in progress when every event after `after`
    /// is still queued (a sink that keeps up): the sinks send an event
    /// while the writer syncs it, and only their cursors wait for the
    /// disk (see [`Outbox::ack`]).
    pub fn read(&self, after: u64, limit: usize) -> Vec<Event> {
        {
            let mem = self.core.mem();
            if after >= mem.newest_stored {
                // Nothing stored is newer; what the writer is writing is
                // still in the queue until it is stored.
                return queued_after(&mem, after, limit)
                    .map(|e| self.with_epoch(e))
                    .collect();
            }
        }
        let (events, set_aside) = off_runtime(|| {
            let store = self.core.store();
            let (mut events, set_aside) = match store.read(after, limit) {
                Ok(read) => read,
                Err(error) => {
                    warn!(%error, after, "cannot read the outbox database");
                    (Vec::new(), Vec::new())
                }
            };
            let mem = self.core.mem();
            let room = limit.saturating_sub(events.len());
            events.extend(queued_after(&mem, after, room));
            (events, set_aside)
        });
        let events: Vec<Event> = events.into_iter().map(|e| self.with_epoch(e)).collect();
        // Said after the locks are let go: saying it appends.
        for (seq, error) in set_aside {
            warn!(seq, %error, "an outbox row does not parse: set aside, the sinks go on");
            self.core
                .metrics
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

    /// Rows written by a build before epochs are of this database.
    fn with_epoch(&self, mut event: Event) -> Event {
        if event.epoch.is_none() {
            event.epoch = Some(self.core.epoch.to_string());
        }
        event
    }

    /// Waits (at most `bound`) until every event numbered so far is stored
    /// and synced: the writer's group commit, one fsync for every caller
    /// waiting. True when so; false at once while the state directory
    /// cannot be written (events then wait in memory, `/health` says
    /// degraded), or when `bound` passes first. A write is acknowledged
    /// (the API's 2xx) only after this, so a crash never loses what an
    /// answer confirmed.
    pub async fn stored(&self, bound: Duration) -> bool {
        let target = {
            let mem = self.core.mem();
            if mem.persist_error.is_some() || unnumbered(&mem) > 0 {
                return false;
            }
            mem.next_seq - 1
        };
        let mut newest = self.core.newest.subscribe();
        let wait = async {
            loop {
                if *newest.borrow_and_update() >= target {
                    return true;
                }
                if self.core.mem().persist_error.is_some() {
                    return false;
                }
                self.writer.wake();
                if newest.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(bound, wait).await.unwrap_or(false)
    }

    /// Watches the newest seq handed out: it moves at append, before the
    /// event is stored (a reader then finds it with [`Outbox::read`]).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.core.numbered.subscribe()
    }

    pub fn host(&self) -> &str {
        &self.core.host
    }

    /// Lets `liveness` watch the writer thread: a write that blocks (a
    /// frozen or hung state directory) stalls it, and `/live` says so.
    pub(crate) fn watch_writer(&self, liveness: &Liveness) {
        let beat = liveness.register("outbox writer", writer::IDLE_WAKE);
        *self.core.beat.lock().unwrap_or_else(|e| e.into_inner()) = Some(beat);
    }

    /// Makes `sink` known and returns its cursor: the last seq it
    /// acknowledged (0 for a sink never seen, which then gets everything kept).
    pub fn register_sink(&self, sink: &str) -> u64 {
        let seq = match off_runtime(|| self.core.store().cursor(sink)) {
            Ok(seq) => seq.unwrap_or(0),
            Err(error) => {
                warn!(%error, sink, "cannot read the sink's cursor; starting from the oldest event kept");
                0
            }
        };
        self.core.mem().cursors.insert(sink.to_string(), seq);
        seq
    }

    /// `sink` acknowledged every event up to `seq`. The sink may be ahead
    /// of the writer (it sends what is queued): the cursor the writer
    /// stores never passes the newest stored event, so that after a crash
    /// the sink resends what it had sent of the stored events, never skips
    /// one (writer.rs).
    pub fn ack(&self, sink: &str, seq: u64) {
        let mut mem = self.core.mem();
        mem.cursors.insert(sink.to_string(), seq);
        mem.cursors_dirty = true;
        drop(mem);
        self.writer.wake();
    }

    /// Events `sink` has not acknowledged yet.
    /// Counts `sink`'s backlog in the database unless a write holds it.
    /// Off the async runtime: even a read may wait for a frozen disk (a
    /// read transaction marks the shared-memory index of the log, a page
    /// write the kernel holds while the file system is frozen).
    pub fn backlog(&self, sink: &str) -> u64 {
        off_runtime(|| {
            let store = self.core.try_store();
            let mem = self.core.mem();
            let acked = mem.cursors.get(sink).copied().unwrap_or(0);
            sink_backlog(store.as_deref(), &mem, acked)
        })
    }

    /// A snapshot that never touches the disk (the API answers it while a
    /// disk hangs): each sink's backlog is the stored events after its
    /// cursor as the newest stored seq and the row count give them (exact
    /// but for events the drop policy removed between), plus the queue.
    pub fn status(&self) -> OutboxStatus {
        let mem = self.core.mem();
        let cursors: Vec<(String, u64)> =
            mem.cursors.iter().map(|(k, &v)| (k.clone(), v)).collect();
        let sinks = cursors
            .into_iter()
            .map(|(name, acked_seq)| {
                let backlog = sink_backlog(None, &mem, acked_seq);
                (name, SinkStatus { acked_seq, backlog })
            })
            .collect();
        OutboxStatus {
            epoch: self.core.epoch.to_string(),
            set_aside: self.set_aside().map(|q| self.describe_set_aside(q)),
            last_seq: mem.next_seq - 1,
            stored: mem.stored,
            pending: mem.pending.len() as u64,
            persist_error: mem.persist_error.clone(),
            sinks,
        }
    }

    /// The kernel OOM-kill counters saved by the last run (see reconcile.rs);
    /// `None` when never saved or unreadable.
    pub fn saved_oom_counts(&self) -> Option<BTreeMap<String, u64>> {
        match off_runtime(|| self.core.store().oom_counts()) {
            Ok(counts) => counts,
            Err(error) => {
                warn!(%error, "cannot read the saved OOM counters");
                None
            }
        }
    }

    /// Saves the kernel OOM-kill counters; false when it could not.
    pub fn save_oom_counts(&self, counts: &BTreeMap<String, u64>) -> bool {
        match off_runtime(|| self.core.store().save_oom_counts(counts)) {
            Ok(()) => true,
            Err(error) => {
                warn!(%error, "cannot save the OOM counters");
                false
            }
        }
    }

    /// Keeps a running task in the state directory (see [`TaskRequest`]);
    /// false when it could not.
    /// Keeps a running task: queued, written with the next round of
    /// events (its `task_started` among them), in order with its removal.
    pub(crate) fn save_task(&self, task: &TaskRequest) {
        self.keep(KeptTask::Save(task.clone()));
    }

    pub(crate) fn remove_task(&self, task_id: &str) {
        self.keep(KeptTask::Remove(task_id.to_string()));
    }

    fn keep(&self, change: KeptTask) {
        let full = self.core.mem().kept.len() >= MAX_KEPT_QUEUED;
        if full {
            // The writer is behind (a slow disk): write the queue here
            // first, so the bound holds and the order too.
            warn!("the kept tasks' queue is full; writing it now");
            off_runtime(|| self.core.write_all());
        }
        self.core.mem().kept.push_back(change);
        self.writer.wake();
    }

    /// The running tasks the last run kept (after writing what is queued).
    pub(crate) fn saved_tasks(&self) -> Vec<TaskRequest> {
        off_runtime(|| {
            self.core.write_all();
            self.core.store().tasks()
        })
        .unwrap_or_else(|error| {
            warn!(%error, "cannot read the kept tasks");
            Vec::new()
        })
    }

    /// Keeps `worker` as unhealthy (its cause as JSON) across restarts.
    pub(crate) fn keep_unhealthy(&self, worker: &str, cause: serde_json::Value) {
        if let Err(error) = off_runtime(|| self.core.store().keep_unhealthy(worker, cause)) {
            warn!(%error, %worker, "cannot keep the worker's health");
        }
    }

    pub(crate) fn forget_unhealthy(&self, worker: &str) {
        if let Err(error) = off_runtime(|| self.core.store().forget_unhealthy(worker)) {
            warn!(%error, %worker, "cannot forget the worker's kept health");
        }
    }

    /// The workers the last run left unhealthy, with their causes.
    pub(crate) fn unhealthy_workers(&self) -> Vec<(String, serde_json::Value)> {
        off_runtime(|| self.core.store().unhealthy_workers()).unwrap_or_else(|error| {
            warn!(%error, "cannot read the kept worker health");
            Vec::new()
        })
    }

    /// Writes out now, on the caller's thread, what waits in memory (and
    /// moved cursors), as the writer thread would. Returns whether
    /// everything is written. For shutdown and tests: the writer thread
    /// does this by itself.
    pub fn maintain(&self) -> bool {
        off_runtime(|| self.core.write_all())
    }

    /// The main loop's periodic call; never waits for the disk. Without
    /// a writer thread (it could not start) it writes what is queued here.
    pub fn tick(&self) {
        if self.writer.runs() {
            self.writer.wake();
        } else {
            off_runtime(|| self.core.write_all());
        }
    }

    /// Removes events stored before `now - max_age` (see the policy) on the
    /// writer thread, so a state directory that hangs holds up the writer
    /// and never the caller; without a writer thread, here.
    pub fn expire(&self, now: DateTime<Utc>) {
        if self.writer.runs() {
            self.core.mem().expire_before = Some(self.core.cutoff(now));
            self.writer.wake();
        } else {
            self.prune_expired(now);
        }
    }

    /// Removes events stored before `now - max_age` (see the policy) now,
    /// on the caller's thread.
    pub fn prune_expired(&self, now: DateTime<Utc>) {
        let cutoff = self.core.cutoff(now);
        off_runtime(|| self.core.remove_before(cutoff));
    }

    #[cfg(test)]
    pub(crate) fn store(&self) -> MutexGuard<'_, Store> {
        self.core.store()
    }
}

impl Core {
    /// The expiry cutoff at `now`, in ms since the epoch.
    fn cutoff(&self, now: DateTime<Utc>) -> i64 {
        let max_age =
            chrono::Duration::from_std(self.mem().limits.max_age).unwrap_or(chrono::Duration::MAX);
        now.checked_sub_signed(max_age)
            .map_or(i64::MIN, |t| t.timestamp_millis())
    }

    /// Removes the events stored before `cutoff` (ms since the epoch).
    fn remove_before(&self, cutoff: i64) {
        let mut store = self.store();
        match store.remove_stored_before(cutoff) {
            Ok(seqs) => self.removed(&store, &seqs, None, "expired"),
            Err(error) => warn!(%error, "cannot remove expired events"),
        }
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The database, unless a write holds it now.
    fn try_store(&self) -> Option<MutexGuard<'_, Store>> {
        match self.store.try_lock() {
            Ok(store) => Some(store),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn mem(&self) -> MutexGuard<'_, Mem> {
        self.mem.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies the drop policy to the in-memory queue, sparing the events
    /// a write round is writing.
    fn bound_pending(&self, mem: &mut Mem) {
        while mem.pending.len() > mem.limits.pending.max(1) {
            // The first (oldest) event of the lowest priority present.
            let Some(victim) = mem
                .pending
                .iter()
                .enumerate()
                .skip(mem.in_flight)
                .min_by_key(|(i, e)| (e.body.kind.priority(), *i))
                .map(|(i, _)| i)
            else {
                break;
            };
            let event = mem.pending.remove(victim).expect("index in range");
            self.count_dropped(mem, &[event.seq], "unpersisted_full");
        }
        self.metrics.outbox_pending.set(mem.pending.len() as i64);
    }

    /// Accounts for removed rows: `freed` bytes of JSON, or when not known
    /// (expiry, a rare sweep) the store is measured again.
    fn removed(&self, store: &Store, seqs: &[u64], freed: Option<u64>, reason: &'static str) {
        if seqs.is_empty() {
            return;
        }
        let measured = match freed {
            Some(_) => None,
            None => Some(store.bytes()),
        };
        let mut mem = self.mem();
        mem.stored = mem.stored.saturating_sub(seqs.len() as u64);
        match (freed, measured) {
            (Some(bytes), _) => mem.stored_bytes = mem.stored_bytes.saturating_sub(bytes),
            (None, Some(Ok(bytes))) => mem.stored_bytes = bytes,
            (None, Some(Err(error))) => warn!(%error, "cannot measure the outbox"),
            (None, None) => {}
        }
        self.metrics.outbox_stored.set(mem.stored as i64);
        self.metrics
            .outbox_stored_bytes
            .set(mem.stored_bytes as i64);
        self.count_dropped(&mem, seqs, reason);
    }

    /// Counts the events in `seqs` that some sink (or, without sinks, a
    /// reader of `/v1/events`) had not received: those are lost (an
    /// unnumbered one always is).
    fn count_dropped(&self, mem: &Mem, seqs: &[u64], reason: &'static str) {
        let delivered_up_to = mem.cursors.values().copied().min().unwrap_or(0);
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
}

/// Up to `limit` of the queued events numbered above `after`, oldest first.
fn queued_after(mem: &Mem, after: u64, limit: usize) -> impl Iterator<Item = Event> + '_ {
    mem.pending
        .iter()
        .filter(move |e| e.seq != UNNUMBERED && e.seq > after)
        .take(limit)
        .cloned()
}

impl Core {
    /// Tells the readers waiting for more that `seq` was handed out.
    fn numbered(&self, seq: u64) {
        self.numbered.send_if_modified(|newest| {
            let grew = seq > *newest;
            *newest = (*newest).max(seq);
            grew
        });
    }
}

/// The next seq, or [`UNNUMBERED`] while events wait unnumbered or no
/// reserved number is left (the writer reserves more: see writer.rs).
fn take_seq(mem: &mut Mem) -> u64 {
    let waiting = mem.pending.back().is_some_and(|e| e.seq == UNNUMBERED);
    if waiting || mem.next_seq > mem.reserved {
        return UNNUMBERED;
    }
    let seq = mem.next_seq;
    mem.next_seq += 1;
    seq
}

/// Events `sink` (acknowledged up to `acked`) has not received: counted
/// in `store` when given, else the stored seqs above `acked` (at most the
/// rows stored: exact but for events dropped between), plus the queue.
fn sink_backlog(store: Option<&Store>, mem: &Mem, acked: u64) -> u64 {
    let pending = mem
        .pending
        .iter()
        .filter(|e| e.seq == UNNUMBERED || e.seq > acked)
        .count() as u64;
    let stored = match store.map(|s| s.count_after(acked)) {
        Some(Ok(n)) => n,
        _ => mem.newest_stored.saturating_sub(acked).min(mem.stored),
    };
    stored + pending
}

/// Runs `f`, which may wait for the disk, without holding up the async
/// runtime's other tasks (the API's `/live` among them): on a
/// multi-threaded runtime the worker hands its tasks on first.
fn off_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests;
