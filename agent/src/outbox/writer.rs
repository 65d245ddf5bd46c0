//! The outbox's writer thread: group commit off the async runtime.
//!
//! [`Outbox::append`](super::Outbox::append) only numbers an event and
//! queues it in memory; this thread writes what is queued, every event
//! waiting at once in one transaction (one fsync for many events), keeps
//! a block of seqs reserved ahead so appends never wait for a reservation,
//! stores moved cursors, and applies the count and byte budgets. A disk
//! that blocks (a frozen or hung state directory) holds up this thread
//! only: the ring-buffer readers, the API and `/live` go on, and `/live`
//! names the writer once it has been silent too long.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender},
    },
    thread::JoinHandle,
    time::Duration,
};

use chrono::Utc;
use tracing::{info, warn};

use super::{
    Core, Mem, SEQ_BLOCK, UNNUMBERED,
    store::{KeptTask, Store},
};
use crate::model::event::Event;

/// The writer wakes at least this often (and beats its liveness).
pub(super) const IDLE_WAKE: Duration = Duration::from_secs(1);
/// Events written in one transaction at most.
const WRITE_BATCH: usize = 1024;
/// Rounds one call to [`Core::write_all`] makes at most (each writes up
/// to [`WRITE_BATCH`] events), so a caller never loops for ever.
const MAX_ROUNDS: usize = 64;

/// The writer thread, owned by the outbox's clones: when the last one is
/// dropped, the thread writes what is left and ends, and the drop waits
/// for it (so a dropped outbox is written and closed).
pub(super) struct Handle {
    /// Wakes the thread (a full channel means it is awake already);
    /// dropping it ends the thread.
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    core: Arc<Core>,
}

impl Handle {
    pub(super) fn spawn(core: Arc<Core>) -> Self {
        let (wake, woken) = mpsc::sync_channel(1);
        let for_thread = Arc::clone(&core);
        let spawned = std::thread::Builder::new()
            .name("outbox-writer".into())
            .spawn(move || run(&for_thread, &woken));
        let thread = spawned
            .map_err(|error| {
                // Appends still queue; `maintain` (every counter tick) writes them.
                warn!(%error, "cannot start the outbox writer thread; events are written by the main loop");
            })
            .ok();
        Self {
            wake: Some(wake),
            thread,
            core,
        }
    }

    /// Whether the writer thread runs (it may have failed to start).
    pub(super) fn runs(&self) -> bool {
        self.thread.is_some()
    }

    pub(super) fn wake(&self) {
        if let Some(wake) = &self.wake {
            let _ = wake.try_send(());
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        drop(self.wake.take());
        match self.thread.take() {
            Some(thread) => {
                let _ = thread.join();
            }
            None => {
                self.core.write_all();
            }
        }
    }
}

/// The thread's loop: a round whenever woken, and every [`IDLE_WAKE`];
/// a last one when the outbox is dropped.
fn run(core: &Core, woken: &Receiver<()>) {
    loop {
        let last = matches!(
            woken.recv_timeout(IDLE_WAKE),
            Err(RecvTimeoutError::Disconnected)
        );
        let written = core.write_all();
        let expire = core.mem().expire_before.take();
        if let Some(cutoff) = expire {
            core.remove_before(cutoff);
        }
        if last {
            if !written {
                warn!(
                    pending = core.mem().pending.len(),
                    "events held in memory are lost: the state directory is not writable"
                );
            }
            return;
        }
        if let Some(beat) = core.beat.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            beat.beat();
        }
    }
}

impl Core {
    /// Writes everything queued (in rounds of [`WRITE_BATCH`], at most
    /// [`MAX_ROUNDS`]); true when nothing is left unwritten.
    pub(super) fn write_all(&self) -> bool {
        let mut store = self.store();
        for _ in 0..MAX_ROUNDS {
            if !self.write_round(&mut store) {
                break;
            }
        }
        let mem = self.mem();
        mem.pending.is_empty() && mem.kept.is_empty() && !mem.cursors_dirty
    }

    /// One round: reserve seqs when they run low (and number the events
    /// that waited for them), write the queued events in one transaction,
    /// apply the budgets, store moved cursors. True when it wrote events
    /// and more may be queued.
    pub(super) fn write_round(&self, store: &mut Store) -> bool {
        self.reserve(store);
        let (batch, kept, cursors) = {
            let mut mem = self.mem();
            let numbered = mem
                .pending
                .iter()
                .take_while(|e| e.seq != UNNUMBERED)
                .take(WRITE_BATCH)
                .count();
            mem.in_flight = numbered;
            let batch: Vec<Event> = mem.pending.iter().take(numbered).cloned().collect();
            let kept: Vec<KeptTask> = mem.kept.iter().take(WRITE_BATCH).cloned().collect();
            let cursors = mem.cursors_dirty.then(|| mem.cursors.clone());
            (batch, kept, cursors)
        };
        let wrote =
            !(batch.is_empty() && kept.is_empty()) && self.write_batch(store, &batch, &kept);
        if let Some(cursors) = cursors
            && self.mem().persist_error.is_none()
        {
            // A sink sends what is queued, so it may have acknowledged
            // events not stored yet: its stored cursor waits for them (the
            // cursor stays dirty, stored again once they are).
            let newest_stored = self.mem().newest_stored;
            let cursors: BTreeMap<String, u64> = cursors
                .into_iter()
                .map(|(sink, seq)| (sink, seq.min(newest_stored)))
                .collect();
            match store.set_cursors(&cursors) {
                Ok(()) => {
                    let mut mem = self.mem();
                    // Moved again meanwhile: stored next round.
                    mem.cursors_dirty = mem.cursors != cursors;
                }
                Err(error) => warn!(%error, "cannot store the sinks' cursors; will retry"),
            }
        }
        let mem = self.mem();
        self.metrics.outbox_pending.set(mem.pending.len() as i64);
        wrote && !(mem.pending.is_empty() && mem.kept.is_empty())
    }

    /// Writes `batch` (the first events queued) and `kept` (the first
    /// changes to the kept tasks queued) in one transaction; true when
    /// written.
    fn write_batch(&self, store: &mut Store, batch: &[Event], kept: &[KeptTask]) -> bool {
        let now_ms = Utc::now().timestamp_millis();
        let mut result = store.write(batch, kept, now_ms);
        if result.is_err() && store.checkpoint().is_ok() {
            // The log's space is free again: one more try.
            result = store.write(batch, kept, now_ms);
        }
        let last = batch.last().map_or(0, |e| e.seq);
        let (over, over_bytes) = {
            let mut mem = self.mem();
            mem.in_flight = 0;
            match result {
                Ok(bytes) => {
                    mem.stored += batch.len() as u64;
                    mem.newest_stored = mem.newest_stored.max(last);
                    mem.stored_bytes += bytes;
                    mem.pending.drain(..batch.len());
                    mem.kept.drain(..kept.len());
                    self.room.notify_all();
                    // Told while the count is still held: whoever reads
                    // `stored` then the newest seq never sees them disagree.
                    self.newest.send_if_modified(|newest| {
                        let grew = last > *newest;
                        *newest = (*newest).max(last);
                        grew
                    });
                    if mem.persist_error.take().is_some() {
                        info!(
                            events = batch.len(),
                            "state directory writable again; events held in memory are now stored"
                        );
                    }
                }
                Err(error) => {
                    self.note_write_failed(&mut mem, error.to_string());
                    return false;
                }
            }
            (
                mem.stored.saturating_sub(mem.limits.max_events),
                mem.stored_bytes.saturating_sub(mem.limits.max_bytes),
            )
        };
        if last > 0 {
            self.metrics.timeline.stored(last);
        }
        if over > 0 || over_bytes > 0 {
            match store.remove_in_drop_order(over, over_bytes) {
                Ok((seqs, freed)) => self.removed(store, &seqs, Some(freed), "outbox_full"),
                Err(error) => warn!(%error, "cannot remove events from a full outbox"),
            }
        }
        // Set once the budgets are applied: the figures never pass them.
        let mem = self.mem();
        self.metrics.outbox_stored.set(mem.stored as i64);
        self.metrics
            .outbox_stored_bytes
            .set(mem.stored_bytes as i64);
        true
    }

    /// Writes cannot be made: every event queued now is counted as
    /// unpersisted once (later ones are counted as they are appended).
    fn note_write_failed(&self, mem: &mut Mem, error: String) {
        if mem.persist_error.is_none() {
            warn!(%error, "cannot write the outbox; holding events in memory");
            self.metrics
                .outbox_unpersisted
                .inc_by(mem.pending.len() as u64);
        }
        mem.persist_error = Some(error);
        // Wakes whoever waits for their events to be stored (`stored`).
        self.newest.send_modify(|_| {});
    }

    /// Keeps a block of seqs reserved ahead of `next_seq` (persisting a
    /// new one once less than half of one is left), then numbers, in
    /// order, the events that waited unnumbered for it.
    fn reserve(&self, store: &Store) {
        let until = {
            let mem = self.mem();
            let unnumbered = unnumbered(&mem);
            let left = (mem.reserved + 1).saturating_sub(mem.next_seq);
            if left >= unnumbered + SEQ_BLOCK / 2 {
                None
            } else {
                Some(mem.next_seq + unnumbered + SEQ_BLOCK)
            }
        };
        if let Some(until) = until {
            let result = store.reserve_seqs(until);
            let mut mem = self.mem();
            match result {
                Ok(()) => mem.reserved = mem.reserved.max(until),
                Err(error) => {
                    if unnumbered(&mem) > 0 || mem.next_seq > mem.reserved {
                        self.note_write_failed(&mut mem, error.to_string());
                    }
                }
            }
        }
        let mut mem = self.mem();
        let waiting = unnumbered(&mem);
        if waiting == 0 || (mem.reserved + 1).saturating_sub(mem.next_seq) < waiting {
            return;
        }
        let first = mem.pending.len() - waiting as usize;
        let mut seq = mem.next_seq;
        for event in mem.pending.range_mut(first..) {
            event.seq = seq;
            seq += 1;
        }
        mem.next_seq = seq;
        self.numbered(seq - 1);
        info!(
            events = waiting,
            "events held unnumbered in memory are numbered"
        );
    }
}

/// Events waiting unnumbered (the newest ones).
pub(super) fn unnumbered(mem: &Mem) -> u64 {
    mem.pending
        .iter()
        .rev()
        .take_while(|e| e.seq == UNNUMBERED)
        .count() as u64
}
