//! Epochs: every database has one and its events carry it; a database of
//! the build before epochs keeps its events and gains one.

use super::*;

/// The schema of the build before epochs and seq reservations, as it was.
const SCHEMA_BEFORE_EPOCHS: &str = "
CREATE TABLE IF NOT EXISTS events (
    seq       INTEGER PRIMARY KEY,
    id        TEXT    NOT NULL UNIQUE,
    priority  INTEGER NOT NULL,
    stored_ms INTEGER NOT NULL,
    json      TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS events_drop_order ON events (priority, seq);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (
    sink      TEXT PRIMARY KEY,
    acked_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS oom_counts (
    cgroup TEXT PRIMARY KEY,
    kills  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    seq   INTEGER PRIMARY KEY,
    json  TEXT NOT NULL,
    error TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    json    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS unhealthy_workers (
    name TEXT PRIMARY KEY,
    json TEXT NOT NULL
);
";

#[test]
fn a_database_of_the_build_before_epochs_keeps_its_events_and_gains_an_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(store::FILE_NAME);
    // Seqs 2, 5 and 9 kept (the others pruned), 11 the last handed out.
    let old: Vec<Event> = [2_u64, 5, 9]
        .into_iter()
        .map(|seq| Event {
            id: format!("0192-old-{seq}"),
            seq,
            time: Utc::now(),
            host: "h1".into(),
            epoch: None,
            body: EventBody::new(EventKind::OomKill),
        })
        .collect();
    {
        let conn = rusqlite::Connection::open(&file).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch(SCHEMA_BEFORE_EPOCHS).unwrap();
        for event in &old {
            let json = serde_json::to_string(event).unwrap();
            assert!(!json.contains("epoch"), "the old build's JSON: {json}");
            conn.execute(
                "INSERT INTO events (seq, id, priority, stored_ms, json) VALUES (?1, ?2, 2, ?3, ?4)",
                rusqlite::params![event.seq as i64, event.id, Utc::now().timestamp_millis(), json],
            )
            .unwrap();
        }
        conn.execute("INSERT INTO meta (key, value) VALUES ('last_seq', 11)", [])
            .unwrap();
        conn.execute(
            "INSERT INTO cursors (sink, acked_seq) VALUES ('hook', 5)",
            [],
        )
        .unwrap();
    }

    let (outbox, _) = open(dir.path(), Limits::default());
    assert!(outbox.set_aside().is_none());
    let epoch = outbox.epoch().to_string();
    assert_eq!(uuid::Uuid::parse_str(&epoch).unwrap().get_version_num(), 7);
    let read = outbox.read(0, 100);
    let mut expected = old.clone();
    for event in &mut expected {
        event.epoch = Some(epoch.clone());
    }
    assert_eq!(
        read, expected,
        "every event, its seq and id, now of the epoch"
    );
    assert_eq!(outbox.register_sink("hook"), 5, "cursors kept");
    assert_eq!(outbox.status().last_seq, 11);
    let next = add(&outbox, EventKind::Heartbeat);
    assert_eq!(next, 12, "numbered on from the old last seq");
    drop(outbox);

    let (outbox, _) = open(dir.path(), Limits::default());
    assert_eq!(outbox.epoch(), epoch, "made once, kept");
    assert_eq!(seqs(&outbox), [2, 5, 9, 12]);
}

#[test]
fn an_epoch_is_made_with_every_database_and_carried_by_its_events() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (one, _) = open(a.path(), Limits::default());
    let (two, _) = open(b.path(), Limits::default());
    assert_ne!(one.epoch(), two.epoch());
    let event = one.append(EventBody::new(EventKind::OomKill), None);
    assert_eq!(event.epoch.as_deref(), Some(one.epoch()));
    let json = serde_json::to_value(&event).unwrap();
    assert_eq!(json["epoch"], one.epoch());
    assert_eq!(one.read(0, 10)[0].epoch.as_deref(), Some(one.epoch()));
}
