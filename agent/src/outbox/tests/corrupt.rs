//! Damaged state: a row that does not parse, a corrupt page, random
//! bytes, a log and index left behind, and failures that are not
//! corruption (those stay fatal).

use super::*;

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

/// Garbage over `len` bytes at `offset` of `path` (a fixed pattern: the
/// same on every run).
fn scribble(path: &Path, offset: u64, len: usize) {
    use std::io::{Seek as _, SeekFrom, Write as _};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    let garbage: Vec<u8> = (0..len).map(|i| (i * 7 + 13) as u8).collect();
    file.write_all(&garbage).unwrap();
    file.sync_all().unwrap();
}

/// The files of `dir` set aside as corrupt.
fn set_aside_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".corrupt-"))
        .collect();
    names.sort();
    names
}

/// After a set-aside: the fresh outbox numbers, stores, reads and reopens.
fn assert_fresh_and_working(dir: &Path, outbox: Outbox) {
    let said = outbox.read(0, 10);
    assert_eq!(said.len(), 1, "only the event that says so: {said:?}");
    assert_eq!(said[0].body.kind, EventKind::EventQuarantined);
    let reason = said[0].body.reason.as_deref().unwrap();
    assert!(
        reason.contains("set aside as") && reason.contains(".corrupt-"),
        "{reason}"
    );
    let seq = add(&outbox, EventKind::OomKill);
    assert_eq!(seqs(&outbox), [said[0].seq, seq]);
    let epoch = outbox.epoch().to_string();
    drop(outbox);
    let (reopened, _) = open(dir, Limits::default());
    assert!(reopened.set_aside().is_none(), "sound now");
    assert_eq!(reopened.status().set_aside, None);
    assert_eq!(reopened.epoch(), epoch);
    assert_eq!(seqs(&reopened), [said[0].seq, seq]);
}

#[test]
fn a_database_with_a_corrupt_page_is_set_aside_and_a_fresh_one_made() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(store::FILE_NAME);
    let old_epoch = {
        let (outbox, _) = open(dir.path(), Limits::default());
        for i in 0..3000 {
            let mut body = EventBody::new(EventKind::TaskStarted);
            body.task_id = Some(format!("task-{i}"));
            outbox.append(body, None);
        }
        outbox.epoch().to_string()
    };
    // Closed: the log is checkpointed into the file, and removed.
    let len = std::fs::metadata(&file).unwrap().len();
    assert!(len > 100 * 4096, "{len}");
    let middle = (len / 4096 / 2) * 4096;
    scribble(&file, middle, 4096);

    let (outbox, metrics) = open(dir.path(), Limits::default());
    let set_aside = outbox.set_aside().unwrap().clone();
    assert_eq!(set_aside.file, file);
    assert!(set_aside.aside.exists(), "kept for inspection");
    assert_eq!(std::fs::metadata(&set_aside.aside).unwrap().len(), len);
    assert_eq!(set_aside_files(dir.path()).len(), 1);
    assert_ne!(outbox.epoch(), old_epoch);
    assert_eq!(
        metrics
            .state_quarantined
            .with_label_values(&["outbox"])
            .get(),
        1
    );
    let status = outbox.status();
    assert_eq!(status.epoch, outbox.epoch());
    assert!(
        status
            .set_aside
            .as_deref()
            .unwrap()
            .contains(&*set_aside.aside.to_string_lossy()),
        "{status:?}"
    );
    assert_fresh_and_working(dir.path(), outbox);
}

#[test]
fn a_file_of_random_bytes_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(store::FILE_NAME);
    // xorshift: random-looking, the same on every run.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&file, &bytes).unwrap();

    let (outbox, _) = open(dir.path(), Limits::default());
    let set_aside = outbox.set_aside().unwrap().clone();
    assert!(set_aside.error.contains("not a database"), "{set_aside:?}");
    assert_eq!(std::fs::read(&set_aside.aside).unwrap(), bytes);
    assert!(!outbox.epoch().is_empty());
    assert_fresh_and_working(dir.path(), outbox);
}

#[test]
fn the_log_and_index_of_a_corrupt_database_go_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(store::FILE_NAME);
    {
        let (outbox, _) = open(dir.path(), Limits::default());
        for _ in 0..2000 {
            add(&outbox, EventKind::TaskStarted);
        }
    }
    let len = std::fs::metadata(&file).unwrap().len();
    scribble(&file, (len / 4096 / 2) * 4096, 4096);
    // Another connection keeps the log and its index (else SQLite removes
    // them when the last connection closes).
    let keeper = rusqlite::Connection::open(&file).unwrap();
    let _: i64 = keeper
        .query_row("SELECT COUNT(*) FROM meta", [], |r| r.get(0))
        .unwrap();
    let companion = |path: &Path, suffix: &str| {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        std::path::PathBuf::from(name)
    };
    assert!(companion(&file, "-wal").exists() && companion(&file, "-shm").exists());

    let (outbox, _) = open(dir.path(), Limits::default());
    let aside = outbox.set_aside().unwrap().aside.clone();
    for suffix in ["-wal", "-shm"] {
        assert!(companion(&aside, suffix).exists(), "{suffix} set aside too");
    }
    drop(keeper);
    assert_fresh_and_working(dir.path(), outbox);
}

#[test]
fn a_failure_that_is_not_corruption_stays_fatal() {
    let dir = tempfile::tempdir().unwrap();
    // Where the database should be, a directory: SQLite cannot open it.
    std::fs::create_dir(dir.path().join(store::FILE_NAME)).unwrap();
    let error = Outbox::open(dir.path(), "h1", Limits::default(), metrics())
        .err()
        .expect("not opened");
    assert!(matches!(error, StoreError::Open { .. }), "{error:?}");
    assert!(dir.path().join(store::FILE_NAME).is_dir(), "left alone");
    assert!(set_aside_files(dir.path()).is_empty());
}
