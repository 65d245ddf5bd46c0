//! Sinks ahead of the writer: an event is read and announced at append,
//! while the writer is still syncing it (a database held here, as a write
//! in progress holds it); the cursors the writer stores wait for the
//! events they cover; a crash before the sync loses the event but never
//! gives its seq to another; and the main loop's calls (`tick`, `expire`)
//! never wait for a database a write holds.

use std::{sync::mpsc, time::Duration};

use super::{aged, open, seqs};
use crate::{
    model::event::{EventBody, EventKind},
    outbox::{Limits, SEQ_BLOCK},
};

#[test]
fn a_sink_is_woken_and_reads_the_event_while_the_writer_syncs_it() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, _) = open(dir.path(), Limits::default());
    outbox.register_sink("webhook");
    outbox.append(EventBody::new(EventKind::Heartbeat), None);
    assert!(outbox.maintain());
    let mut newest = outbox.subscribe();
    newest.borrow_and_update();
    // A write in progress: the writer holds the database.
    let held = outbox.store();
    let (done, answered) = mpsc::channel();
    let sink = outbox.clone();
    std::thread::spawn(move || {
        let event = sink.append(EventBody::new(EventKind::OomKill), None);
        let woken = newest.has_changed().unwrap_or(false) && *newest.borrow() == event.seq;
        done.send((event, woken, sink.read(1, 100))).unwrap();
    });
    let (event, woken, read) = answered
        .recv_timeout(Duration::from_secs(10))
        .expect("the reader did not wait for the write in progress");
    assert!(woken, "the sinks are told at append");
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!((read[0].seq, &read[0].id), (event.seq, &event.id));
    assert_eq!(read[0].body.kind, EventKind::OomKill);
    assert_eq!(read[0].epoch.as_deref(), Some(outbox.epoch()));
    assert_eq!(outbox.status().stored, 1, "not stored yet");
    drop(held);
    assert!(outbox.maintain());
    let stored = outbox.read(1, 100);
    assert_eq!(stored.len(), 1);
    assert_eq!(
        serde_json::to_value(&stored[0]).unwrap(),
        serde_json::to_value(&read[0]).unwrap(),
        "the stored event is the one sent"
    );
}

#[test]
fn a_cursor_ahead_of_the_writer_is_stored_only_over_stored_events() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, _) = open(dir.path(), Limits::default());
    outbox.register_sink("webhook");
    let mut store = outbox.store();
    // More than one write round holds (WRITE_BATCH, 1024), all sent and
    // acknowledged before the writer stored any.
    let n = 1500;
    for _ in 0..n {
        outbox.append(EventBody::new(EventKind::TaskStarted), None);
    }
    outbox.ack("webhook", n);
    assert!(outbox.core.write_round(&mut store), "more to write");
    let newest = store.newest_stored().unwrap();
    assert!(newest < n, "one round stored {newest}");
    assert_eq!(
        store.cursor("webhook").unwrap(),
        Some(newest),
        "the stored cursor stops at the newest stored event"
    );
    outbox.core.write_round(&mut store);
    assert_eq!(store.newest_stored().unwrap(), n);
    if store.cursor("webhook").unwrap() != Some(n) {
        // Still dirty: the next round stores it.
        outbox.core.write_round(&mut store);
    }
    assert_eq!(store.cursor("webhook").unwrap(), Some(n));
    drop(store);
    assert_eq!(outbox.backlog("webhook"), 0);
}

#[test]
fn a_crash_before_the_sync_loses_the_event_sent_but_never_reuses_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, before) = {
        let (outbox, _) = open(dir.path(), Limits::default());
        outbox.register_sink("webhook");
        outbox.append(EventBody::new(EventKind::Heartbeat), None);
        assert!(outbox.maintain());
        let before = outbox.read(0, 10);
        let held = outbox.store();
        for _ in 0..5 {
            outbox.append(EventBody::new(EventKind::OomKill), None);
        }
        // What a sink sent while the writer was syncing.
        let sent = outbox.read(1, 10);
        assert_eq!(sent.len(), 5);
        outbox.ack("webhook", sent[4].seq);
        // The agent dies here: nothing more is written (the writer stays
        // stuck on the held database, which is never let go).
        std::mem::forget(held);
        std::mem::forget(outbox);
        (sent, before)
    };
    let (outbox, _) = open(dir.path(), Limits::default());
    let cursor = outbox.register_sink("webhook");
    assert!(
        cursor <= before[0].seq,
        "cursor {cursor} passed what was stored"
    );
    let kept = outbox.read(0, 100);
    assert_eq!(kept.len(), 1, "the five sent were never stored: {kept:?}");
    assert_eq!(kept[0].id, before[0].id);
    let after: Vec<u64> = (0..10)
        .map(|_| outbox.append(EventBody::new(EventKind::OomKill), None).seq)
        .collect();
    let highest_sent = sent.last().unwrap().seq;
    assert!(
        after[0] > highest_sent && after[0] <= highest_sent + 2 * SEQ_BLOCK,
        "the first seq after the crash, {}, is above every seq sent before it, {highest_sent}",
        after[0]
    );
    assert!(outbox.maintain());
    assert_eq!(seqs(&outbox).len(), 11);
}

/// A sink told of an event at append sends it at once, perhaps before the
/// recorder's thread runs again: the event's delay is stamped before the
/// sinks are told, so its `read_to_sent` is never lost.
#[test]
fn an_event_is_stamped_before_any_sink_is_told() {
    let metrics = super::metrics();
    let outbox = crate::outbox::Outbox::new("h", 10, metrics.clone());
    let mut newest = outbox.subscribe();
    newest.borrow_and_update();
    let sink = outbox.clone();
    let timeline = metrics.timeline.clone();
    let sender = std::thread::spawn(move || {
        // Spins until told (10 s at most), then sends what it read at once.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if newest.has_changed().unwrap_or(false) {
                let batch = sink.read(0, 10);
                timeline.sent("webhook", &batch);
                return batch.len();
            }
            std::hint::spin_loop();
        }
        0
    });
    let read = std::time::Instant::now();
    outbox.append_read(EventBody::new(EventKind::OomKill), None, Some(read));
    let sent = sender.join().unwrap();
    assert_eq!(sent, 1);
    let sent_count = metrics
        .timeline
        .seconds
        .with_label_values(&["oom_kill", "read_to_sent", "webhook"])
        .get_sample_count();
    assert_eq!(sent_count, 1, "the event was stamped when it was sent");
}

#[test]
fn the_main_loops_calls_never_wait_for_a_held_database() {
    let dir = tempfile::tempdir().unwrap();
    let max_age = Duration::from_secs(3600);
    let (outbox, _) = open(dir.path(), aged(max_age));
    outbox.append(EventBody::new(EventKind::Heartbeat), None);
    outbox.append(EventBody::new(EventKind::Heartbeat), None);
    assert!(outbox.maintain());
    assert_eq!(seqs(&outbox).len(), 2);
    // A write that hangs (a frozen state directory) holds the database.
    let held = outbox.store();
    let (done, answered) = mpsc::channel();
    let main_loop = outbox.clone();
    std::thread::spawn(move || {
        main_loop.tick();
        main_loop.expire(chrono::Utc::now() + max_age * 2);
        done.send(()).unwrap();
    });
    answered
        .recv_timeout(Duration::from_secs(10))
        .expect("tick or expire waited for the held database");
    drop(held);
    // The writer thread removes them once the database is free.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !seqs(&outbox).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the expiry was not done: {:?}",
            seqs(&outbox)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
