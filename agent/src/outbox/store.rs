//! The outbox's SQLite file (`<state dir>/outbox.sqlite`, WAL): events,
//! each sink's cursor, and the kernel's OOM counters seen at the last run.
//!
//! Plain storage: numbering, bounds and what to do when a write fails are
//! the outbox's business (outbox.rs).
//!
//! Every database has an **epoch** (a UUIDv7 made when the database is,
//! or when a database of an older build is first opened): seqs of two
//! databases are not comparable, the epoch says which database a seq is of.
//!
//! A database SQLite calls corrupt (at open, or `PRAGMA quick_check` right
//! after) is **set aside**, not fatal: the file and its `-wal`/`-shm` are
//! renamed `outbox.sqlite.corrupt-<unix seconds>` (with `-wal`/`-shm`
//! after that, so `sqlite3` opens the set-aside copy whole) and a fresh
//! database is made. Any other failure (permissions, a lock held by another
//! agent) stays fatal.
//!
//! Longer than 600 lines: every SQL statement of the outbox's database, next
//! to the schema and its versions, so that an upgrade can be checked against
//! each query in one file.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs, io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use rusqlite::{Connection, ErrorCode, OptionalExtension as _, params};

use crate::model::{
    event::{Event, Priority},
    spec::TaskRequest,
};

/// The database file inside the state directory.
pub(crate) const FILE_NAME: &str = "outbox.sqlite";

/// How long a statement waits for a lock held by another connection
/// (there is one writer, so only a second agent on the same dir waits).
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

const SCHEMA: &str = "
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
CREATE TABLE IF NOT EXISTS meta_text (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
";

/// `meta` key of the highest seq ever stored: kept apart from the events
/// table so that pruning the newest row can never make a seq come back.
const LAST_SEQ: &str = "last_seq";
/// `meta` key set once OOM counters were saved at least once.
const OOM_BASELINE: &str = "oom_baseline";
/// `meta` key of the highest seq the outbox may hand out before it
/// persists a new reservation (see the outbox's numbering).
const RESERVED_SEQ: &str = "reserved_seq";
/// `meta_text` key of the database's epoch.
const EPOCH: &str = "epoch";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create state directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the outbox database {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the outbox database {path} is corrupt and cannot be set aside")]
    SetAside {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the outbox database {path} was corrupt and set aside as {aside}, and the fresh one \
         made in its place is corrupt at once ({error}): the disk is failing"
    )]
    FreshCorrupt {
        path: PathBuf,
        aside: PathBuf,
        error: String,
    },
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    #[error("stored event does not parse: {0}")]
    Json(#[from] serde_json::Error),
}

/// A stored row that did not parse: its seq, and why.
pub(crate) type SetAside = (u64, String);

pub(crate) struct Store {
    conn: Connection,
    epoch: String,
}

/// A corrupt database that [`Store::open`] set aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Quarantined {
    /// Where the database was.
    pub(crate) file: PathBuf,
    /// Where it is now (its `-wal`/`-shm`, when there were any, beside it).
    pub(crate) aside: PathBuf,
    /// What SQLite said.
    pub(crate) error: String,
}

/// Why a database could not be opened.
enum OpenFailure {
    /// SQLite says the file is not a sound database: set it aside.
    Corrupt(String),
    /// Anything else (permissions, a lock, a full disk): fatal.
    Other(rusqlite::Error),
}

impl From<rusqlite::Error> for OpenFailure {
    fn from(error: rusqlite::Error) -> Self {
        match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                Self::Corrupt(error.to_string())
            }
            _ => Self::Other(error),
        }
    }
}

impl Store {
    /// Opens (creating when needed) `dir/outbox.sqlite`, and `dir` itself.
    /// A corrupt database is set aside and a fresh one made: what was set
    /// aside is the second value.
    pub(crate) fn open(dir: &Path) -> Result<(Self, Option<Quarantined>), StoreError> {
        fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let fatal = |path: &Path, source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        match connect(&path) {
            Ok(store) => Ok((store, None)),
            Err(OpenFailure::Other(source)) => Err(fatal(&path, source)),
            Err(OpenFailure::Corrupt(error)) => {
                let aside = set_aside(&path).map_err(|source| StoreError::SetAside {
                    path: path.clone(),
                    source,
                })?;
                let store = connect(&path).map_err(|failure| match failure {
                    OpenFailure::Other(source) => fatal(&path, source),
                    OpenFailure::Corrupt(error) => StoreError::FreshCorrupt {
                        path: path.clone(),
                        aside: aside.clone(),
                        error,
                    },
                })?;
                Ok((
                    store,
                    Some(Quarantined {
                        file: path,
                        aside,
                        error,
                    }),
                ))
            }
        }
    }

    /// A store that lives in memory only (tests, and callers that need no
    /// durability).
    pub(crate) fn in_memory() -> Result<Self, StoreError> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(SCHEMA)?;
        let epoch = ensure_epoch(&conn)?;
        Ok(Self { conn, epoch })
    }

    /// The database's epoch (a UUIDv7), made with it or at its first open
    /// by a build that knows epochs.
    pub(crate) fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The highest seq that may have been handed out: the highest ever
    /// stored, or reserved (0 for a new file).
    pub(crate) fn last_seq(&self) -> Result<u64, StoreError> {
        let meta: Option<i64> = self
            .conn
            .query_row(
                "SELECT MAX(value) FROM meta WHERE key IN (?1, ?2)",
                [LAST_SEQ, RESERVED_SEQ],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        let rows: Option<i64> = self
            .conn
            .query_row("SELECT MAX(seq) FROM events", [], |r| r.get(0))?;
        Ok(meta.unwrap_or(0).max(rows.unwrap_or(0)) as u64)
    }

    /// Persists that seqs up to `until` may be handed out: an open after a
    /// crash goes on above it, so a seq handed out is never handed out
    /// again, whether its event was written or not.
    pub(crate) fn reserve_seqs(&self, until: u64) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = MAX(value, excluded.value)",
            params![RESERVED_SEQ, until as i64],
        )?;
        Ok(())
    }

    /// Stores `events` alone (see [`Self::write`]).
    #[cfg(test)]
    pub(crate) fn insert(&mut self, events: &[Event], stored_ms: i64) -> Result<u64, StoreError> {
        self.write(events, &[], stored_ms)
    }

    /// Stores `events` (in seq order) and the changes to the kept tasks
    /// queued with them in one transaction, all or none (one sync of the
    /// log for all); the bytes of event JSON stored.
    pub(crate) fn write(
        &mut self,
        events: &[Event],
        kept: &[KeptTask],
        stored_ms: i64,
    ) -> Result<u64, StoreError> {
        if events.is_empty() && kept.is_empty() {
            return Ok(0);
        }
        let mut bytes = 0;
        let tx = self.conn.transaction()?;
        for change in kept {
            change.apply(&tx)?;
        }
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO events (seq, id, priority, stored_ms, json) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for event in events {
                let json = serde_json::to_string(event)?;
                bytes += json.len() as u64;
                insert.execute(params![
                    event.seq as i64,
                    event.id,
                    event.body.kind.priority() as i64,
                    stored_ms,
                    json,
                ])?;
            }
        }
        if let Some(last) = events.last() {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = MAX(value, excluded.value)",
                params![LAST_SEQ, last.seq as i64],
            )?;
        }
        tx.commit()?;
        Ok(bytes)
    }

    /// Moves the write-ahead log into the database and truncates it: on a
    /// full disk this gives back the log's space, which otherwise only a
    /// successful commit would (SQLite checkpoints after commits).
    pub(crate) fn checkpoint(&self) -> Result<(), StoreError> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    /// Up to `limit` events with `seq > after`, oldest first. A row that
    /// does not parse is moved to the `quarantine` table (kept for
    /// inspection) instead of stalling every reader: its seq and why are in
    /// the second list.
    pub(crate) fn read(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<Event>, Vec<SetAside>), StoreError> {
        let rows: Vec<(i64, String)> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT seq, json FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            stmt.query_map(params![after as i64, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })?
            .collect::<Result<_, _>>()?
        };
        let mut events = Vec::new();
        let mut set_aside = Vec::new();
        for (seq, json) in rows {
            match serde_json::from_str(&json) {
                Ok(event) => events.push(event),
                Err(error) => {
                    let error = error.to_string();
                    self.conn.execute(
                        "INSERT OR REPLACE INTO quarantine (seq, json, error) VALUES (?1, ?2, ?3)",
                        params![seq, json, error],
                    )?;
                    self.conn
                        .execute("DELETE FROM events WHERE seq = ?1", [seq])?;
                    set_aside.push((seq as u64, error));
                }
            }
        }
        Ok((events, set_aside))
    }

    /// Events stored.
    pub(crate) fn count(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
        Ok(n as u64)
    }

    /// The highest seq stored (0: none).
    pub(crate) fn newest_stored(&self) -> Result<u64, StoreError> {
        let n: Option<i64> = self
            .conn
            .query_row("SELECT MAX(seq) FROM events", [], |r| r.get(0))?;
        Ok(n.unwrap_or(0) as u64)
    }

    /// Events stored with `seq > after`.
    pub(crate) fn count_after(&self, after: u64) -> Result<u64, StoreError> {
        let n: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM events WHERE seq > ?1",
            [after as i64],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Removes events in drop order (lowest priority first, oldest first
    /// within one) until at least `n` events and `bytes` bytes of JSON are
    /// gone; returns the seqs removed and the bytes freed.
    pub(crate) fn remove_in_drop_order(
        &mut self,
        n: u64,
        bytes: u64,
    ) -> Result<(Vec<u64>, u64), StoreError> {
        let tx = self.conn.transaction()?;
        let mut seqs = Vec::new();
        let mut freed = 0u64;
        {
            let mut stmt =
                tx.prepare_cached("SELECT seq, length(json) FROM events ORDER BY priority, seq")?;
            let mut rows = stmt.query([])?;
            while (seqs.len() as u64) < n || freed < bytes {
                let Some(row) = rows.next()? else { break };
                seqs.push(row.get::<_, i64>(0)? as u64);
                freed += row.get::<_, i64>(1)? as u64;
            }
        }
        delete_seqs(&tx, &seqs)?;
        tx.commit()?;
        Ok((seqs, freed))
    }

    /// Bytes of event JSON stored.
    pub(crate) fn bytes(&self) -> Result<u64, StoreError> {
        let n: i64 = self.conn.query_row(
            "SELECT COALESCE(SUM(length(json)), 0) FROM events",
            [],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Removes events stored before `cutoff_ms`, critical ones only when no
    /// event of a lower priority is left at all; returns the seqs removed.
    pub(crate) fn remove_stored_before(&mut self, cutoff_ms: i64) -> Result<Vec<u64>, StoreError> {
        let tx = self.conn.transaction()?;
        let critical = Priority::Critical as i64;
        let mut seqs = select_seqs(
            &tx,
            "SELECT seq FROM events WHERE stored_ms < ?1 AND priority < ?2",
            params![cutoff_ms, critical],
        )?;
        delete_seqs(&tx, &seqs)?;
        let lower_left: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM events WHERE priority < ?1)",
            [critical],
            |r| r.get(0),
        )?;
        if !lower_left {
            let old_critical = select_seqs(
                &tx,
                "SELECT seq FROM events WHERE stored_ms < ?1",
                params![cutoff_ms],
            )?;
            delete_seqs(&tx, &old_critical)?;
            seqs.extend(old_critical);
        }
        tx.commit()?;
        Ok(seqs)
    }

    /// The last seq `sink` acknowledged, if it ever did.
    pub(crate) fn cursor(&self, sink: &str) -> Result<Option<u64>, StoreError> {
        Ok(self
            .conn
            .query_row(
                "SELECT acked_seq FROM cursors WHERE sink = ?1",
                [sink],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map(|s| s as u64))
    }

    pub(crate) fn set_cursors(
        &mut self,
        cursors: &BTreeMap<String, u64>,
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        {
            let mut upsert = tx.prepare_cached(
                "INSERT INTO cursors (sink, acked_seq) VALUES (?1, ?2)
                 ON CONFLICT (sink) DO UPDATE SET acked_seq = excluded.acked_seq",
            )?;
            for (sink, seq) in cursors {
                upsert.execute(params![sink, *seq as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The OOM-kill counters saved at the last run, per memory cgroup path;
    /// `None` when none were ever saved (a first run knows nothing).
    pub(crate) fn oom_counts(&self) -> Result<Option<BTreeMap<String, u64>>, StoreError> {
        let baseline: Option<i64> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = ?1",
                [OOM_BASELINE],
                |r| r.get(0),
            )
            .optional()?;
        if baseline.is_none() {
            return Ok(None);
        }
        let mut stmt = self.conn.prepare("SELECT cgroup, kills FROM oom_counts")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        let mut counts = BTreeMap::new();
        for row in rows {
            let (cgroup, kills) = row?;
            counts.insert(cgroup, kills as u64);
        }
        Ok(Some(counts))
    }

    /// Replaces the saved OOM-kill counters.
    pub(crate) fn save_oom_counts(
        &mut self,
        counts: &BTreeMap<String, u64>,
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        tx.execute("DELETE FROM oom_counts", [])?;
        {
            let mut insert =
                tx.prepare_cached("INSERT INTO oom_counts (cgroup, kills) VALUES (?1, ?2)")?;
            for (cgroup, kills) in counts {
                insert.execute(params![cgroup, *kills as i64])?;
            }
        }
        tx.execute(
            "INSERT INTO meta (key, value) VALUES (?1, 1) ON CONFLICT (key) DO NOTHING",
            [OOM_BASELINE],
        )?;
        tx.commit()?;
        Ok(())
    }
}

/// What is kept of a running task; `v` is the record's version.
#[derive(serde::Serialize, serde::Deserialize)]
struct TaskRow {
    v: u32,
    task: TaskRequest,
}

/// The version of [`TaskRow`] this build writes.
const TASK_ROW_VERSION: u32 = 1;

/// A change to the running tasks kept: queued, and written with the
/// events of the same round (see [`Store::write`]).
#[derive(Clone, Debug)]
pub(crate) enum KeptTask {
    /// Keeps a running task (replacing one of the same id).
    Save(TaskRequest),
    /// Forgets an ended task.
    Remove(String),
}

impl KeptTask {
    fn apply(&self, conn: &Connection) -> Result<(), StoreError> {
        match self {
            Self::Save(task) => {
                let json = serde_json::to_string(&TaskRow {
                    v: TASK_ROW_VERSION,
                    task: task.clone(),
                })?;
                conn.execute(
                    "INSERT INTO tasks (task_id, json) VALUES (?1, ?2) \
                     ON CONFLICT (task_id) DO UPDATE SET json = excluded.json",
                    params![task.task_id, json],
                )?;
            }
            Self::Remove(task_id) => {
                conn.execute("DELETE FROM tasks WHERE task_id = ?1", [task_id])?;
            }
        }
        Ok(())
    }
}

impl Store {
    /// The running tasks kept; a row this build cannot read is skipped
    /// (and named in the log), not fatal.
    pub(crate) fn tasks(&self) -> Result<Vec<TaskRequest>, StoreError> {
        let mut stmt = self.conn.prepare("SELECT task_id, json FROM tasks")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut tasks = Vec::new();
        for row in rows {
            let (task_id, json) = row?;
            match serde_json::from_str::<TaskRow>(&json) {
                Ok(row) if row.v <= TASK_ROW_VERSION => tasks.push(row.task),
                Ok(row) => {
                    tracing::warn!(
                        ?task_id,
                        version = row.v,
                        "a kept task of a newer build: skipped"
                    )
                }
                Err(error) => {
                    tracing::warn!(?task_id, %error, "a kept task does not parse: skipped")
                }
            }
        }
        Ok(tasks)
    }
}

/// What is kept of an unhealthy worker: why it is (the watchdog's cause,
/// as JSON); `v` is the record's version.
#[derive(serde::Serialize, serde::Deserialize)]
struct WorkerRow {
    v: u32,
    cause: serde_json::Value,
}

/// The version of [`WorkerRow`] this build writes.
const WORKER_ROW_VERSION: u32 = 1;

impl Store {
    /// Keeps `worker` as unhealthy for `cause` (replacing what was kept).
    pub(crate) fn keep_unhealthy(
        &mut self,
        worker: &str,
        cause: serde_json::Value,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(&WorkerRow {
            v: WORKER_ROW_VERSION,
            cause,
        })?;
        self.conn.execute(
            "INSERT INTO unhealthy_workers (name, json) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET json = excluded.json",
            params![worker, json],
        )?;
        Ok(())
    }

    pub(crate) fn forget_unhealthy(&mut self, worker: &str) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM unhealthy_workers WHERE name = ?1", [worker])?;
        Ok(())
    }

    /// The workers kept as unhealthy, with their causes; a row this build
    /// cannot read is skipped (and named in the log), not fatal.
    pub(crate) fn unhealthy_workers(&self) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, json FROM unhealthy_workers")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut workers = Vec::new();
        for row in rows {
            let (worker, json) = row?;
            match serde_json::from_str::<WorkerRow>(&json) {
                Ok(row) if row.v <= WORKER_ROW_VERSION => workers.push((worker, row.cause)),
                Ok(row) => {
                    tracing::warn!(%worker, version = row.v, "a kept worker health of a newer build: skipped")
                }
                Err(error) => {
                    tracing::warn!(%worker, %error, "a kept worker health does not parse: skipped")
                }
            }
        }
        Ok(workers)
    }
}

#[cfg(test)]
impl Store {
    /// Caps the database at `pages` pages (never below its current size):
    /// a real SQLITE_FULL for tests, without a full disk.
    pub(crate) fn limit_pages(&self, pages: u64) {
        self.conn
            .pragma_update(None, "max_page_count", pages as i64)
            .unwrap();
    }

    /// Makes every write fail (SQLITE_READONLY), reservations included,
    /// as a full disk does (a write that fits in the database's pages
    /// still succeeds under [`Store::limit_pages`]).
    pub(crate) fn refuse_writes(&self, refuse: bool) {
        self.conn.pragma_update(None, "query_only", refuse).unwrap();
    }
}

/// Opens `path` as the outbox database: WAL, `synchronous=FULL`, checked
/// (`PRAGMA quick_check`), its schema made or brought up to date, its
/// epoch made when it has none.
fn connect(path: &Path) -> Result<Store, OpenFailure> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpenFailure::Other(rusqlite::Error::InvalidParameterName(
            format!("journal_mode is {mode}, WAL refused"),
        )));
    }
    // Reads every page of the file once (not the indexes' agreement with
    // the tables, which `integrity_check` adds): on a full outbox (100,000
    // events, 50-137 MiB) 45-130 ms with the file in the page cache, 0.6-2 s
    // from a cold disk (docs/delivery.md). A page SQLite cannot read would
    // otherwise fail some later read or write, and the agent with it.
    let check: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
    if check != "ok" {
        return Err(OpenFailure::Corrupt(format!("quick_check: {check}")));
    }
    // FULL: a committed event survives a power loss, not only a crash
    // of the agent. Events are few (OOM kills, heartbeats); see
    // docs/benchmarks.md for what it costs.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(SCHEMA)?;
    let epoch = ensure_epoch(&conn)?;
    Ok(Store { conn, epoch })
}

/// The database's epoch, made (and stored) when it has none: a new
/// database, or one of a build before epochs (its seqs are kept as they are).
fn ensure_epoch(conn: &Connection) -> rusqlite::Result<String> {
    conn.execute(
        "INSERT INTO meta_text (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
        params![EPOCH, uuid::Uuid::now_v7().to_string()],
    )?;
    conn.query_row("SELECT value FROM meta_text WHERE key = ?1", [EPOCH], |r| {
        r.get(0)
    })
}

/// Renames the database `path` and its `-wal`/`-shm` aside as
/// `<name>.corrupt-<unix seconds>` (`-wal`/`-shm` appended to that), the
/// companions first: a fresh database must never meet an old log. Returns
/// the new name of the database file.
fn set_aside(path: &Path) -> io::Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".corrupt-{secs}"));
    let mut aside = path.with_file_name(&name);
    let mut n = 1;
    while fs::symlink_metadata(&aside).is_ok() {
        let mut numbered = name.clone();
        numbered.push(format!(".{n}"));
        aside = path.with_file_name(numbered);
        n += 1;
    }
    let with = |path: &Path, suffix: &str| {
        let mut name = OsString::from(path.as_os_str());
        name.push(suffix);
        PathBuf::from(name)
    };
    for suffix in ["-wal", "-shm"] {
        match fs::rename(with(path, suffix), with(&aside, suffix)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    fs::rename(path, &aside)?;
    if let Some(dir) = path.parent() {
        // The renames survive a power loss before the fresh database's
        // first commit.
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(aside)
}

fn select_seqs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<u64>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params, |r| r.get::<_, i64>(0))?;
    rows.map(|r| r.map(|s| s as u64)).collect()
}

fn delete_seqs(conn: &Connection, seqs: &[u64]) -> rusqlite::Result<()> {
    let mut delete = conn.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
    for seq in seqs {
        delete.execute([*seq as i64])?;
    }
    Ok(())
}
