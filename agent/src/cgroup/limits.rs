//! Which limit an OOM kill hit: the victim's own memory cgroup, one of its
//! ancestors, or none (the whole host ran out).
//!
//! The kernel does not hand the limit cgroup to any tracepoint (it lives in
//! `struct oom_control`, on the stack of `out_of_memory`), so it is read
//! back from the cgroup files right after the kill: walking up from the
//! victim's cgroup, the first one with a finite limit whose peak usage
//! reached it (within a charge batch) is the one whose limit was hit. A
//! charge fails only when usage plus the charge exceeds the limit, so the
//! limit cgroup's peak is always that close; a cgroup that never came near
//! its limit cannot be it.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::model::event::OomConstraint;

/// How close to the limit the peak must be: a 2 MiB huge page, the largest
/// single charge the fault path makes.
pub(crate) const SLACK_BYTES: u64 = 2 << 20;
/// At or above this, a v1 limit is "unlimited" (PAGE_COUNTER_MAX pages).
const UNLIMITED: u64 = 1 << 62;

/// `(constraint, limit_cgroup)` for a victim in `victim_cgroup`, searching
/// no higher than `root` (the hierarchy's mount point, never itself limited).
pub(crate) fn oom_limit(victim_cgroup: &Path, root: &Path) -> (OomConstraint, Option<PathBuf>) {
    let mut dir = Some(victim_cgroup);
    while let Some(cgroup) = dir.filter(|d| d.starts_with(root) && *d != root) {
        if at_limit(cgroup) {
            return (OomConstraint::Cgroup, Some(cgroup.to_path_buf()));
        }
        dir = cgroup.parent();
    }
    (OomConstraint::Global, None)
}

/// One finite limit above a cgroup (its own or an ancestor's), with the
/// unreclaimable usage that counts against it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChainLimit {
    pub cgroup: PathBuf,
    pub bytes: u64,
    pub used: u64,
}

/// Every finite limit from `cgroup` up to (not including) `root`: v1
/// `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes` (memory plus
/// swap), v2 `memory.max`. `used` is the cgroup's own unreclaimable memory,
/// read by the caller; each ancestor's figures are read once per `shared`
/// (a sampling round: the ancestors of many tasks are one worker's). A
/// cgroup whose figures cannot be read is left out. Also the cgroup's own
/// `memory.high` when it sits below its limit.
pub(crate) fn limit_chain(
    cgroup: &Path,
    used: u64,
    root: &Path,
    shared: &mut ChainShared,
) -> (Vec<ChainLimit>, Option<u64>) {
    if !cgroup.starts_with(root) || cgroup == root {
        return (Vec::new(), None);
    }
    let own = Own::read(cgroup);
    let mut chain = level_of(cgroup, own, used);
    let mut dir = cgroup.parent();
    while let Some(d) = dir.filter(|d| d.starts_with(root) && *d != root) {
        let limits = shared.levels.entry(d.to_path_buf()).or_insert_with(|| {
            super::memory::unreclaimable(d)
                .ok()
                .map(|used| level(d, used))
                .unwrap_or_default()
        });
        chain.extend(limits.iter().cloned());
        dir = d.parent();
    }
    (chain, own.high(cgroup))
}

/// The ancestors' limits read in one round, by cgroup.
#[derive(Debug, Default)]
pub(crate) struct ChainShared {
    levels: std::collections::HashMap<PathBuf, Vec<ChainLimit>>,
}

/// A finite limit in `file` of `dir` (none when unreadable or unlimited).
fn read_limit(dir: &Path, file: &str) -> Option<u64> {
    limit_file(dir, file).ok().flatten()
}

/// The limit in `file` of `dir`: `Err` when it cannot be read (not this
/// cgroup version's file), `Ok(None)` when unlimited. One small read, no
/// size query before it (see [`super::memory::read_u64`]).
fn limit_file(dir: &Path, file: &str) -> std::io::Result<Option<u64>> {
    match super::memory::read_u64(&dir.join(file)) {
        Ok(v) => Ok(Some(v).filter(|&v| v < UNLIMITED)),
        // v2's "max", or anything else that is not a number: no limit.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Ok(None),
        Err(e) => Err(e),
    }
}

/// `dir`'s own finite limits, in [`level`]'s order: its memory limit (v1
/// `memory.limit_in_bytes`, else v2 `memory.max`), and v1's memory plus
/// swap limit; and whether it is a v2 cgroup. A v1 cgroup costs no failed
/// open of a v2 file, nor the reverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Own {
    memory: Option<u64>,
    memsw: Option<u64>,
    v2: bool,
}

impl Own {
    fn read(dir: &Path) -> Own {
        match limit_file(dir, "memory.limit_in_bytes") {
            Ok(memory) => Own {
                memory,
                // v1 keeps memory.limit_in_bytes <= memory.memsw.limit_in_bytes
                // (memcontrol-v1's resize refuses a write that breaks it): no
                // memory limit, no memory+swap one, and no read of it.
                memsw: memory.and_then(|_| read_limit(dir, "memory.memsw.limit_in_bytes")),
                v2: false,
            },
            Err(_) => Own {
                memory: read_limit(dir, "memory.max"),
                memsw: None,
                v2: true,
            },
        }
    }

    fn bytes(self) -> impl Iterator<Item = u64> {
        self.memory.into_iter().chain(self.memsw)
    }

    /// The cgroup's `memory.high` when below its limit (v2 only: a v1
    /// cgroup has none, and costs no failed open for it).
    fn high(self, dir: &Path) -> Option<u64> {
        let max = self.bytes().min()?;
        self.v2
            .then(|| read_limit(dir, "memory.high"))
            .flatten()
            .filter(|&h| h < max)
    }
}

/// `dir`'s own finite limits, `used` (its unreclaimable memory) against
/// each.
fn level(dir: &Path, used: u64) -> Vec<ChainLimit> {
    level_of(dir, Own::read(dir), used)
}

/// [`level`] from `dir`'s limit files read already.
fn level_of(dir: &Path, own: Own, used: u64) -> Vec<ChainLimit> {
    let mut limits: Vec<ChainLimit> = own
        .memory
        .map(|bytes| ChainLimit {
            cgroup: dir.to_path_buf(),
            bytes,
            used,
        })
        .into_iter()
        .collect();
    if let Some(limit) = own.memsw
        && let Some(memsw) = read_limit(dir, "memory.memsw.usage_in_bytes")
    {
        // Swap counts against it too: memsw usage less the clean cache, as
        // in `used`.
        let usage = read_limit(dir, "memory.usage_in_bytes").unwrap_or(0);
        let swap = memsw.saturating_sub(usage);
        limits.push(ChainLimit {
            cgroup: dir.to_path_buf(),
            bytes: limit,
            used: used + swap,
        });
    }
    limits
}

/// Whether the limits of `kept` (a [`limit_chain`] of `cgroup` read
/// before) and its `memory.high` still stand: only the limit files are
/// read, not the cgroup's memory (no `memory.stat`), and an ancestor's once
/// per `shared`. A cgroup whose memory did not move (the kernel says so)
/// and whose limits stand has the figures it had.
pub(crate) fn limits_stand(
    cgroup: &Path,
    kept: &[ChainLimit],
    kept_high: Option<u64>,
    root: &Path,
    shared: &mut LimitsShared,
) -> bool {
    let mut now: Vec<(&Path, u64)> = Vec::with_capacity(kept.len());
    let own = Own::read(cgroup);
    now.extend(own.bytes().map(|bytes| (cgroup, bytes)));
    let mut dir = cgroup.parent();
    while let Some(d) = dir.filter(|d| d.starts_with(root) && *d != root) {
        let above = *shared
            .levels
            .entry(d.to_path_buf())
            .or_insert_with(|| Own::read(d));
        now.extend(above.bytes().map(|bytes| (d, bytes)));
        dir = d.parent();
    }
    own.high(cgroup) == kept_high
        && now.len() == kept.len()
        && now
            .iter()
            .zip(kept)
            .all(|((d, bytes), k)| *d == k.cgroup && *bytes == k.bytes)
}

/// The ancestors' limit files read in one round, by cgroup.
#[derive(Debug, Default)]
pub(crate) struct LimitsShared {
    levels: std::collections::HashMap<PathBuf, Own>,
}

/// The cgroup has a finite limit and its peak usage reached it.
fn at_limit(cgroup: &Path) -> bool {
    let read = |file: &str| -> Option<u64> {
        let text = fs::read_to_string(cgroup.join(file)).ok()?;
        text.trim().parse().ok()
    };
    // v1: memory.limit_in_bytes and memory.max_usage_in_bytes (also the
    // memory+swap pair, whose limit may be the one hit).
    let v1 = [
        ("memory.limit_in_bytes", "memory.max_usage_in_bytes"),
        (
            "memory.memsw.limit_in_bytes",
            "memory.memsw.max_usage_in_bytes",
        ),
    ];
    // v2: memory.max ("max" parses as none) and memory.peak (5.19+), else
    // memory.current.
    let v2_peak = read("memory.peak").or_else(|| read("memory.current"));
    let pairs = v1
        .iter()
        .map(|(limit, peak)| (read(limit), read(peak)))
        .chain(std::iter::once((read("memory.max"), v2_peak)));
    pairs.into_iter().any(|pair| match pair {
        (Some(limit), Some(peak)) if limit < UNLIMITED => peak.saturating_add(SLACK_BYTES) >= limit,
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cgroup(root: &Path, rel: &str, files: &[(&str, u64)]) -> PathBuf {
        let dir = root.join(rel);
        fs::create_dir_all(&dir).unwrap();
        for (file, value) in files {
            fs::write(dir.join(file), format!("{value}\n")).unwrap();
        }
        dir
    }

    const MIB: u64 = 1 << 20;
    const NO_LIMIT: u64 = 9223372036854771712;

    /// A v2 cgroup `v2` in `root`: `memory.max` 256 MiB, 100 MiB used (all
    /// anonymous), and `memory.high` as `high` says.
    fn v2_cgroup(root: &Path, high: &str) -> PathBuf {
        let dir = cgroup(
            root,
            "v2",
            &[("memory.max", 256 * MIB), ("memory.current", 100 * MIB)],
        );
        fs::write(dir.join("memory.high"), format!("{high}\n")).unwrap();
        fs::write(dir.join("memory.stat"), "anon 104857600\n").unwrap();
        dir
    }

    #[test]
    fn nested_victim_names_the_parent_whose_limit_was_hit() {
        let root = tempfile::tempdir().unwrap();
        cgroup(
            root.path(),
            "p",
            &[
                ("memory.limit_in_bytes", 64 * MIB),
                ("memory.max_usage_in_bytes", 64 * MIB),
            ],
        );
        let child = cgroup(
            root.path(),
            "p/c",
            &[
                ("memory.limit_in_bytes", NO_LIMIT),
                ("memory.max_usage_in_bytes", 64 * MIB),
            ],
        );
        assert_eq!(
            oom_limit(&child, root.path()),
            (OomConstraint::Cgroup, Some(root.path().join("p")))
        );
    }

    #[test]
    fn own_limit_wins_over_an_ancestors() {
        let root = tempfile::tempdir().unwrap();
        cgroup(
            root.path(),
            "p",
            &[
                ("memory.limit_in_bytes", 512 * MIB),
                ("memory.max_usage_in_bytes", 100 * MIB),
            ],
        );
        let child = cgroup(
            root.path(),
            "p/c",
            &[
                ("memory.limit_in_bytes", 64 * MIB),
                ("memory.max_usage_in_bytes", 63 * MIB),
            ],
        );
        assert_eq!(
            oom_limit(&child, root.path()),
            (OomConstraint::Cgroup, Some(child.clone()))
        );
    }

    #[test]
    fn far_from_every_limit_is_a_global_oom() {
        let root = tempfile::tempdir().unwrap();
        let child = cgroup(
            root.path(),
            "c",
            &[
                ("memory.limit_in_bytes", 512 * MIB),
                ("memory.max_usage_in_bytes", 100 * MIB),
            ],
        );
        assert_eq!(
            oom_limit(&child, root.path()),
            (OomConstraint::Global, None)
        );
    }

    /// The chain of one cgroup, alone in its round.
    fn chain_of(cgroup: &Path, root: &Path) -> (Vec<ChainLimit>, Option<u64>) {
        let used = crate::cgroup::memory::unreclaimable(cgroup).unwrap();
        limit_chain(cgroup, used, root, &mut ChainShared::default())
    }

    /// Two tasks of one worker in one round: the worker's figures are read
    /// once, for the first; the second gets the same (a change between
    /// them is seen next round).
    #[test]
    fn an_ancestor_is_read_once_per_round() {
        let root = tempfile::tempdir().unwrap();
        let worker = cgroup(
            root.path(),
            "w",
            &[
                ("memory.limit_in_bytes", 512 * MIB),
                ("memory.usage_in_bytes", 300 * MIB),
            ],
        );
        fs::write(worker.join("memory.stat"), "").unwrap();
        let mut shared = ChainShared::default();
        let of = |task: &str, shared: &mut ChainShared| {
            let dir = cgroup(root.path(), task, &[("memory.usage_in_bytes", MIB)]);
            fs::write(dir.join("memory.stat"), "").unwrap();
            limit_chain(&dir, MIB, root.path(), shared).0
        };
        let first = of("w/t1", &mut shared);
        fs::write(
            worker.join("memory.usage_in_bytes"),
            (400 * MIB).to_string(),
        )
        .unwrap();
        let second = of("w/t2", &mut shared);
        assert_eq!(first.last(), second.last());
        assert_eq!(second.last().map(|l| l.used), Some(300 * MIB));
        let next_round = of("w/t2", &mut ChainShared::default());
        assert_eq!(next_round.last().map(|l| l.used), Some(400 * MIB));
    }

    /// v1 keeps the memory+swap limit at or above the memory limit, so a
    /// cgroup with no memory limit has no memory+swap one either: its
    /// `memory.memsw.limit_in_bytes` is not read (half of an idle task
    /// cgroup's limit checks). A file saying otherwise (the kernel would
    /// have refused the write) is not looked at.
    #[test]
    fn no_memory_limit_means_no_memsw_read() {
        let root = tempfile::tempdir().unwrap();
        let task = cgroup(
            root.path(),
            "t",
            &[
                ("memory.limit_in_bytes", NO_LIMIT),
                ("memory.memsw.limit_in_bytes", 64 * MIB),
            ],
        );
        assert_eq!(Own::read(&task).bytes().count(), 0);
        fs::write(task.join("memory.limit_in_bytes"), (32 * MIB).to_string()).unwrap();
        assert_eq!(
            Own::read(&task).bytes().collect::<Vec<_>>(),
            [32 * MIB, 64 * MIB]
        );
    }

    /// A chain read before stands while no limit file above the cgroup
    /// changed, whatever its memory did; a limit written on it, on an
    /// ancestor (seen in the next round: an ancestor is read once per
    /// round), or a v2 `memory.high` set, and it does not. Its memory is
    /// not read for it.
    #[test]
    fn limits_stand_until_a_limit_file_above_changes() {
        let root = tempfile::tempdir().unwrap();
        let worker = cgroup(
            root.path(),
            "w",
            &[
                ("memory.limit_in_bytes", 512 * MIB),
                ("memory.usage_in_bytes", 300 * MIB),
                ("memory.memsw.limit_in_bytes", 1024 * MIB),
                ("memory.memsw.usage_in_bytes", 300 * MIB),
            ],
        );
        fs::write(worker.join("memory.stat"), "").unwrap();
        let task = cgroup(
            root.path(),
            "w/t",
            &[
                ("memory.limit_in_bytes", NO_LIMIT),
                ("memory.usage_in_bytes", MIB),
            ],
        );
        fs::write(task.join("memory.stat"), "").unwrap();
        let (kept, high) = chain_of(&task, root.path());
        assert_eq!(
            kept.len(),
            2,
            "the worker's memory and memsw limits: {kept:?}"
        );
        let stands =
            |shared: &mut LimitsShared| limits_stand(&task, &kept, high, root.path(), shared);
        assert!(stands(&mut LimitsShared::default()));
        // Its memory is not looked at: unreadable, the limits still stand.
        fs::remove_file(task.join("memory.stat")).unwrap();
        fs::write(task.join("memory.usage_in_bytes"), "100000000\n").unwrap();
        assert!(stands(&mut LimitsShared::default()));

        let mut shared = LimitsShared::default();
        assert!(stands(&mut shared));
        fs::write(
            worker.join("memory.limit_in_bytes"),
            (256 * MIB).to_string(),
        )
        .unwrap();
        assert!(stands(&mut shared), "an ancestor is read once per round");
        assert!(
            !stands(&mut LimitsShared::default()),
            "the worker's limit changed"
        );
        fs::write(
            worker.join("memory.limit_in_bytes"),
            (512 * MIB).to_string(),
        )
        .unwrap();
        fs::write(task.join("memory.limit_in_bytes"), (64 * MIB).to_string()).unwrap();
        assert!(
            !stands(&mut LimitsShared::default()),
            "its own limit was set"
        );
        fs::write(task.join("memory.limit_in_bytes"), NO_LIMIT.to_string()).unwrap();
        assert!(stands(&mut LimitsShared::default()));

        // v2: memory.max and memory.high.
        let dir = v2_cgroup(root.path(), "max");
        let (kept, high) = chain_of(&dir, root.path());
        assert_eq!(high, None);
        let stands = || limits_stand(&dir, &kept, high, root.path(), &mut LimitsShared::default());
        assert!(stands());
        fs::write(dir.join("memory.high"), "241172480\n").unwrap();
        assert!(!stands(), "memory.high set below memory.max");
        fs::write(dir.join("memory.high"), "max\n").unwrap();
        fs::write(dir.join("memory.max"), "max\n").unwrap();
        assert!(!stands(), "memory.max lifted");
    }

    #[test]
    fn the_chain_has_every_finite_limit_up_to_the_root_and_high_below_max() {
        let root = tempfile::tempdir().unwrap();
        let stat = |dir: &Path, file_bytes: u64| {
            fs::write(
                dir.join("memory.stat"),
                format!("total_inactive_file {file_bytes}\n"),
            )
            .unwrap();
        };
        let parent = cgroup(
            root.path(),
            "p",
            &[
                ("memory.limit_in_bytes", 512 * MIB),
                ("memory.usage_in_bytes", 300 * MIB),
            ],
        );
        stat(&parent, 100 * MIB);
        let child = cgroup(
            root.path(),
            "p/c",
            &[
                // memsw below no memory limit: the kernel refuses that.
                ("memory.limit_in_bytes", 900 * MIB),
                ("memory.usage_in_bytes", 150 * MIB),
                ("memory.memsw.limit_in_bytes", 1024 * MIB),
                ("memory.memsw.usage_in_bytes", 160 * MIB),
            ],
        );
        stat(&child, 50 * MIB);
        let (chain, high) = chain_of(&child, root.path());
        assert_eq!(
            chain,
            vec![
                ChainLimit {
                    cgroup: child.clone(),
                    bytes: 900 * MIB,
                    used: 100 * MIB
                },
                ChainLimit {
                    cgroup: child.clone(),
                    bytes: 1024 * MIB,
                    used: 110 * MIB
                },
                ChainLimit {
                    cgroup: parent.clone(),
                    bytes: 512 * MIB,
                    used: 200 * MIB
                },
            ]
        );
        assert_eq!(high, None);

        let dir = v2_cgroup(root.path(), "241172480");
        let (chain, high) = chain_of(&dir, root.path());
        assert_eq!(
            chain,
            vec![ChainLimit {
                cgroup: dir.clone(),
                bytes: 256 * MIB,
                used: 100 * MIB
            }]
        );
        assert_eq!(high, Some(230 * MIB), "memory.high below memory.max");
        fs::write(dir.join("memory.high"), "max\n").unwrap();
        assert_eq!(chain_of(&dir, root.path()).1, None);
    }

    #[test]
    fn v2_files_count_too() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("v2");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("memory.max"), "67108864\n").unwrap();
        fs::write(dir.join("memory.peak"), "67100000\n").unwrap();
        assert_eq!(oom_limit(&dir, root.path()).0, OomConstraint::Cgroup);
        fs::write(dir.join("memory.max"), "max\n").unwrap();
        assert_eq!(oom_limit(&dir, root.path()).0, OomConstraint::Global);
    }
}
