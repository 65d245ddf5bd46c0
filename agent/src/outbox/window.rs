//! The outbox's in-memory window: a sink reads a just-appended event
//! before the fsync that makes it durable.
//!
//! Every event is in the window from its numbering until every sink has
//! acknowledged it (at most [`WINDOW`] stored ones are kept): the queue
//! for the writer (`pending`, numbered and in flight included) and the
//! newest stored events (`recent`). `floor` says how far back it goes:
//! every event with a seq above it that exists (stored or not) is in
//! `recent` or `pending`, so a read after a seq at or above the floor is
//! answered here, without the database (whose lock a write holds through
//! its fsync). A read further back goes to the database.
//!
//! Durability stays where it was: the API acknowledges a write only once
//! stored (`Outbox::stored`), and a sink's **stored** cursor never moves
//! past the highest stored seq ([`to_store`]), so after a crash a sink
//! goes on from an event that was stored, never past one it had not had
//! acknowledged after it was stored. What a sink sends from here before
//! the fsync is the same event (seq, id, body) the writer stores; after a
//! crash before the fsync that event is gone, and its seq is never handed
//! out again (seqs are reserved ahead, see mod.rs). See docs/delivery.md.

use std::collections::BTreeMap;

use super::{Mem, UNNUMBERED};
use crate::model::event::Event;

/// Stored events kept in memory at most, for sinks that have not
/// acknowledged them yet (a sink further behind reads the database).
pub(super) const WINDOW: usize = 256;

/// Up to `limit` events after `after`, oldest first, from memory; `None`
/// when the window does not reach back to `after` (read the database).
pub(super) fn read(mem: &Mem, after: u64, limit: usize) -> Option<Vec<Event>> {
    if after < mem.recent_floor {
        return None;
    }
    let numbered = mem.pending.iter().filter(|e| e.seq != UNNUMBERED);
    Some(
        mem.recent
            .iter()
            .chain(numbered)
            .filter(|e| e.seq > after)
            .take(limit)
            .cloned()
            .collect(),
    )
}

/// `events` (the oldest of `pending`, taken off it) were stored.
pub(super) fn stored(mem: &mut Mem, events: impl IntoIterator<Item = Event>) {
    mem.recent.extend(events);
    trim(mem);
}

/// Lets go of the stored events every sink acknowledged (all of them
/// without sinks), and of the oldest beyond [`WINDOW`]; the floor rises.
pub(super) fn trim(mem: &mut Mem) {
    let acked = mem.cursors.values().copied().min().unwrap_or(u64::MAX);
    while let Some(front) = mem.recent.front() {
        if front.seq > acked && mem.recent.len() <= WINDOW {
            break;
        }
        mem.recent_floor = mem.recent_floor.max(front.seq);
        mem.recent.pop_front();
    }
}

/// The events of `seqs` were removed from the database (drop policy,
/// expiry): the window lets go of them too.
pub(super) fn forget(mem: &mut Mem, seqs: &[u64]) {
    if mem.recent.is_empty() || seqs.is_empty() {
        return;
    }
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    mem.recent.retain(|e| sorted.binary_search(&e.seq).is_err());
}

/// The cursors to store now, when they differ from what the database
/// holds: each sink's acknowledged seq, but never above the highest
/// stored seq (an event acknowledged before it was stored moves the stored
/// cursor once it is stored).
pub(super) fn to_store(mem: &Mem) -> Option<BTreeMap<String, u64>> {
    let clamped: BTreeMap<String, u64> = mem
        .cursors
        .iter()
        .map(|(sink, &acked)| {
            let stored = mem.cursors_stored.get(sink).copied().unwrap_or(0);
            // Never back either: a cursor read at start stays.
            (sink.clone(), acked.min(mem.newest_stored).max(stored))
        })
        .collect();
    (clamped != mem.cursors_stored).then_some(clamped)
}
