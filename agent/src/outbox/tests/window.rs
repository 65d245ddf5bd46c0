//! The in-memory window (window.rs): sinks read an event before its
//! fsync; the stored cursor never passes the highest stored seq; after a
//! crash before the fsync the event is gone and its seq never comes back.

use std::{sync::mpsc, thread, time::Duration};

use super::*;

const BOUND: Duration = Duration::from_secs(5);

/// The store's gate, shared with the writer thread.
fn gate(outbox: &Outbox) -> Arc<store::gate::Gate> {
    Arc::clone(&outbox.store().gate)
}

fn oom(outbox: &Outbox) -> Event {
    outbox.append(EventBody::new(EventKind::OomKill), None)
}

/// `read` on another thread, failing (not hanging) when it waits for the
/// held commit.
fn read_unblocked(outbox: &Outbox, after: u64) -> Vec<Event> {
    let (tx, rx) = mpsc::channel();
    let reader = outbox.clone();
    thread::spawn(move || {
        let _ = tx.send(reader.read(after, 100));
    });
    rx.recv_timeout(BOUND)
        .expect("read waited for the fsync: the window did not answer it")
}

#[test]
fn a_sink_reads_an_event_while_its_commit_is_held_and_the_api_still_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, _) = open(dir.path(), Limits::default());
    outbox.register_sink("hook");
    let gate = gate(&outbox);
    gate.hold();
    let woken = outbox.subscribe();
    let event = oom(&outbox);
    assert!(gate.wait_for_commit(BOUND), "the writer reached the commit");
    assert!(woken.has_changed().unwrap(), "sinks are woken at numbering");
    assert_eq!(read_unblocked(&outbox, 0), std::slice::from_ref(&event));
    // Not durable yet: what the API's acknowledgement waits for has not moved.
    assert_eq!(*outbox.core.newest.borrow(), 0);
    outbox.ack("hook", event.seq);
    gate.release();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    assert!(runtime.block_on(outbox.stored(BOUND)));
    assert!(outbox.maintain());
    // The body stored is the body sent, byte for byte.
    let stored = outbox.store().read(0, 10).unwrap().0;
    assert_eq!(
        serde_json::to_string(&stored).unwrap(),
        serde_json::to_string(&[event]).unwrap()
    );
}

#[test]
fn the_stored_cursor_waits_for_the_event_and_a_crash_before_the_fsync_loses_it_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let sent = {
        let (outbox, _) = open(dir.path(), Limits::default());
        outbox.register_sink("hook");
        let gate = gate(&outbox);
        gate.hold();
        let first = oom(&outbox);
        assert!(gate.wait_for_commit(BOUND));
        // Appended while the first one's commit is held: not in that batch.
        let second = oom(&outbox);
        let sent = read_unblocked(&outbox, 0);
        assert_eq!(sent, [first.clone(), second.clone()]);
        outbox.ack("hook", second.seq);
        // The first is stored; the writer then stores the cursor, and
        // the second's commit is held again.
        gate.let_one_through();
        // Until the first one is through, the gate counts it waiting.
        let through = (0..500).any(|_| {
            thread::sleep(Duration::from_millis(10));
            let mem = outbox.core.mem();
            mem.newest_stored == first.seq && mem.cursors_stored.get("hook") == Some(&first.seq)
        });
        assert!(through, "the first one and the cursor up to it were stored");
        assert!(gate.wait_for_commit(BOUND), "the second one's commit");
        gate.crash();
        sent
    };
    let (outbox, _) = open(dir.path(), Limits::default());
    let stored = outbox.read(0, 10);
    assert_eq!(stored, sent[..1], "the first was stored, the second lost");
    assert_eq!(
        outbox.register_sink("hook"),
        sent[0].seq,
        "the stored cursor never passed the highest stored seq"
    );
    // The lost seq is never handed out again, with any body.
    let next = oom(&outbox);
    assert!(next.seq > sent[1].seq, "{} after {}", next.seq, sent[1].seq);
}

#[test]
fn a_sink_behind_the_window_reads_the_database_and_dropped_events_leave_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, _) = open(dir.path(), limits(2));
    outbox.register_sink("slow");
    for _ in 0..(crate::outbox::window::WINDOW + 10) {
        add(&outbox, EventKind::OomKill);
    }
    // The budget of 2 keeps the newest two: the window holds no more.
    let all = outbox.read(0, 1000);
    assert_eq!(
        all.len(),
        2,
        "{:?}",
        all.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    assert_eq!(all, outbox.store().read(0, 1000).unwrap().0);
    let last = all[1].seq;
    assert_eq!(outbox.read(last - 1, 10), all[1..]);
}
