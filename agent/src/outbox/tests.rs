//! The outbox against a real SQLite file in a temporary directory.

use std::collections::HashSet;

use super::*;
use crate::model::event::EventKind;

fn metrics() -> Metrics {
    Metrics::new(&prometheus::Registry::new()).unwrap()
}

fn open(dir: &Path, limits: Limits) -> (Outbox, Metrics) {
    let metrics = metrics();
    let outbox = Outbox::open(dir, "h1", limits, metrics.clone()).unwrap();
    (outbox, metrics)
}

fn limits(max_events: u64) -> Limits {
    Limits {
        max_events,
        ..Limits::default()
    }
}

fn add(outbox: &Outbox, kind: EventKind) -> u64 {
    outbox.append(EventBody::new(kind), None).seq
}

fn seqs(outbox: &Outbox) -> Vec<u64> {
    outbox.read(0, 1000).iter().map(|e| e.seq).collect()
}

fn dropped(metrics: &Metrics, reason: &str) -> u64 {
    metrics.events_dropped.with_label_values(&[reason]).get()
}

#[test]
fn seq_survives_reopen_and_ids_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let (outbox, _) = open(dir.path(), Limits::default());
        for _ in 0..3 {
            add(&outbox, EventKind::OomKill);
        }
        outbox.read(0, 10)
    };
    assert!(dir.path().join("outbox.sqlite").exists());
    let (outbox, _) = open(dir.path(), Limits::default());
    assert_eq!(
        outbox.read(0, 10),
        before,
        "same events, same ids after reopen"
    );
    assert_eq!(add(&outbox, EventKind::Heartbeat), 4);
    assert_eq!(outbox.status().last_seq, 4);
}

#[test]
fn seq_never_goes_back_even_when_the_newest_events_were_pruned() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (outbox, _) = open(dir.path(), limits(1));
        add(&outbox, EventKind::OomKill); // 1: critical, kept
        add(&outbox, EventKind::Heartbeat); // 2: dropped at once
        assert_eq!(seqs(&outbox), [1]);
    }
    let (outbox, _) = open(dir.path(), limits(1));
    assert_eq!(add(&outbox, EventKind::OomKill), 3);
}

#[test]
fn ids_are_unique() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, _) = open(dir.path(), Limits::default());
    for _ in 0..500 {
        add(&outbox, EventKind::Heartbeat);
    }
    let ids: HashSet<String> = outbox.read(0, 1000).into_iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 500);
}

#[test]
fn read_pages_after_a_seq() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, _) = open(dir.path(), Limits::default());
    for _ in 0..5 {
        add(&outbox, EventKind::OomKill);
    }
    let page =
        |after, limit| -> Vec<u64> { outbox.read(after, limit).iter().map(|e| e.seq).collect() };
    assert_eq!(page(0, 2), [1, 2]);
    assert_eq!(page(2, 10), [3, 4, 5]);
    assert!(page(5, 10).is_empty());
}

#[test]
fn full_outbox_drops_heartbeats_then_normal_events_then_critical_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, metrics) = open(dir.path(), limits(4));
    let oom1 = add(&outbox, EventKind::OomKill);
    let hb1 = add(&outbox, EventKind::Heartbeat);
    let start = add(&outbox, EventKind::TaskStarted);
    let hb2 = add(&outbox, EventKind::Heartbeat);
    assert_eq!(seqs(&outbox), [oom1, hb1, start, hb2]);

    // Full: the oldest heartbeat goes first, then the next one.
    let unhealthy = add(&outbox, EventKind::WorkerUnhealthy);
    assert_eq!(seqs(&outbox), [oom1, start, hb2, unhealthy]);
    let rejected = add(&outbox, EventKind::TaskRejected);
    assert_eq!(seqs(&outbox), [oom1, start, unhealthy, rejected]);
    // No heartbeat left: the normal event goes, never a critical one.
    let oom2 = add(&outbox, EventKind::OomKill);
    assert_eq!(seqs(&outbox), [oom1, unhealthy, rejected, oom2]);
    // Only critical events left: the oldest of them.
    let oom3 = add(&outbox, EventKind::OomKill);
    assert_eq!(seqs(&outbox), [unhealthy, rejected, oom2, oom3]);
    // A new heartbeat is the lowest priority: it is the one dropped.
    add(&outbox, EventKind::Heartbeat);
    assert_eq!(seqs(&outbox), [unhealthy, rejected, oom2, oom3]);

    assert_eq!(dropped(&metrics, "outbox_full"), 5);
    assert_eq!(metrics.outbox_stored.get(), 4);
}

#[test]
fn expiry_keeps_critical_events_while_a_lower_priority_one_remains() {
    let dir = tempfile::tempdir().unwrap();
    let max_age = Duration::from_secs(3600);
    let (outbox, metrics) = open(
        dir.path(),
        Limits {
            max_age,
            ..Limits::default()
        },
    );
    let oom = add(&outbox, EventKind::OomKill);
    let old_hb = add(&outbox, EventKind::Heartbeat);
    std::thread::sleep(Duration::from_millis(30));
    let between = Utc::now();
    std::thread::sleep(Duration::from_millis(30));
    let new_hb = add(&outbox, EventKind::Heartbeat);

    // Everything but the newest heartbeat has expired: the old heartbeat
    // goes, the OOM kill stays while a heartbeat is left.
    outbox.prune_expired(between + max_age);
    assert_eq!(seqs(&outbox), [oom, new_hb]);
    assert!(old_hb < new_hb);
    // Once nothing of a lower priority is left, expired critical events go too.
    outbox.prune_expired(Utc::now() + max_age + chrono::Duration::seconds(1));
    assert!(seqs(&outbox).is_empty());
    assert_eq!(dropped(&metrics, "expired"), 3);
}

#[test]
fn sink_cursors_survive_reopen_and_give_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (outbox, _) = open(dir.path(), Limits::default());
        assert_eq!(outbox.register_sink("a"), 0);
        assert_eq!(outbox.register_sink("b"), 0);
        for _ in 0..5 {
            add(&outbox, EventKind::OomKill);
        }
        outbox.ack("a", 4);
        outbox.ack("b", 1);
        assert_eq!((outbox.backlog("a"), outbox.backlog("b")), (1, 4));
    }
    let (outbox, _) = open(dir.path(), Limits::default());
    assert_eq!(outbox.register_sink("a"), 4);
    assert_eq!(outbox.register_sink("b"), 1);
    let status = outbox.status();
    assert_eq!(status.sinks["a"].backlog, 1);
    assert_eq!(status.sinks["b"].acked_seq, 1);
}

#[test]
fn removing_events_every_sink_acknowledged_is_not_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, metrics) = open(dir.path(), limits(2));
    outbox.register_sink("a");
    add(&outbox, EventKind::OomKill);
    add(&outbox, EventKind::OomKill);
    outbox.ack("a", 2);
    add(&outbox, EventKind::OomKill); // removes seq 1, already delivered
    assert_eq!(dropped(&metrics, "outbox_full"), 0);
    add(&outbox, EventKind::OomKill); // removes seq 2, delivered
    add(&outbox, EventKind::OomKill); // removes seq 3, never delivered
    assert_eq!(dropped(&metrics, "outbox_full"), 1);
}

/// Makes the database full for real (SQLITE_FULL): it may not grow past
/// its current size. Appends until one is held in memory; returns the seq
/// of the last event that was written.
fn fill_up(outbox: &Outbox, filler: EventKind) -> u64 {
    outbox.lock().store.limit_pages(1);
    for _ in 0..10_000 {
        let seq = add(outbox, filler);
        if outbox.status().pending > 0 {
            return seq - 1;
        }
    }
    panic!("the database never filled up");
}

#[test]
fn unwritable_store_holds_events_in_memory_then_writes_them_out() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, metrics) = open(dir.path(), Limits::default());
    let written = fill_up(&outbox, EventKind::Heartbeat);
    for _ in 0..49 {
        add(&outbox, EventKind::OomKill);
    }
    let status = outbox.status();
    assert_eq!(status.pending, 50);
    assert!(
        status.persist_error.as_deref().unwrap().contains("full"),
        "{status:?}"
    );
    assert_eq!(metrics.outbox_unpersisted.get(), 50);
    // Readers and sinks still see every event, in order.
    let total = written + 50;
    assert_eq!(seqs(&outbox), (1..=total).collect::<Vec<_>>());
    assert!(!outbox.maintain());

    outbox.lock().store.limit_pages(u32::MAX as u64);
    assert!(outbox.maintain());
    let status = outbox.status();
    assert_eq!((status.pending, status.stored), (0, total));
    assert_eq!(status.persist_error, None);
    drop(outbox);
    let (reopened, _) = open(dir.path(), Limits::default());
    assert_eq!(seqs(&reopened), (1..=total).collect::<Vec<_>>());
}

#[test]
fn memory_queue_is_bounded_by_the_same_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, metrics) = open(
        dir.path(),
        Limits {
            pending: 3,
            ..Limits::default()
        },
    );
    let written = fill_up(&outbox, EventKind::Heartbeat);
    let oom = add(&outbox, EventKind::OomKill);
    let start = add(&outbox, EventKind::TaskStarted);
    let hb = add(&outbox, EventKind::Heartbeat); // drops the held filler heartbeat
    let oom2 = add(&outbox, EventKind::OomKill); // drops `hb`
    let held: Vec<u64> = outbox.read(written, 100).iter().map(|e| e.seq).collect();
    assert_eq!(held, [oom, start, oom2]);
    assert!(hb > start);
    assert_eq!(dropped(&metrics, "unpersisted_full"), 2);
}

#[test]
fn a_row_that_does_not_parse_is_set_aside_and_stalls_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let (outbox, metrics) = open(dir.path(), Limits::default());
    for _ in 0..3 {
        add(&outbox, EventKind::TaskStarted);
    }
    // Another writer (a bug, a disk error) leaves row 2 unreadable.
    let conn = rusqlite::Connection::open(dir.path().join(store::FILE_NAME)).unwrap();
    conn.execute(
        "UPDATE events SET json = '{\"seq\": 2, garbage' WHERE seq = 2",
        [],
    )
    .unwrap();
    drop(conn);
    let first: Vec<u64> = outbox.read(0, 1000).iter().map(|e| e.seq).collect();
    assert_eq!(first, [1, 3], "the others are read");
    assert_eq!(dropped(&metrics, "quarantined"), 1);
    // Said once, as an event every sink gets; the row is kept aside.
    let events = outbox.read(0, 1000);
    let said: Vec<&Event> = events
        .iter()
        .filter(|e| e.body.kind == EventKind::EventQuarantined)
        .collect();
    assert_eq!(said.len(), 1, "{events:?}");
    assert!(said[0].body.reason.as_deref().unwrap().contains("seq 2"));
    let conn = rusqlite::Connection::open(dir.path().join(store::FILE_NAME)).unwrap();
    let kept: i64 = conn
        .query_row("SELECT COUNT(*) FROM quarantine WHERE seq = 2", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(kept, 1);
    assert_eq!(dropped(&metrics, "quarantined"), 1, "not twice");
}
