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
    let mut chain = level(cgroup, used);
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
    let own_max = chain
        .iter()
        .filter(|l| l.cgroup == cgroup)
        .map(|l| l.bytes)
        .min();
    let high = read_limit(cgroup, "memory.high").filter(|&h| own_max.is_some_and(|m| h < m));
    (chain, high)
}

/// The ancestors' limits read in one round, by cgroup.
#[derive(Debug, Default)]
pub(crate) struct ChainShared {
    levels: std::collections::HashMap<PathBuf, Vec<ChainLimit>>,
}

/// A finite limit in `file` of `dir` (none when unreadable or unlimited).
fn read_limit(dir: &Path, file: &str) -> Option<u64> {
    let text = fs::read_to_string(dir.join(file)).ok()?;
    text.trim().parse().ok().filter(|&v| v < UNLIMITED)
}

/// `dir`'s own finite limits, `used` (its unreclaimable memory) against
/// each.
fn level(dir: &Path, used: u64) -> Vec<ChainLimit> {
    let mut limits = Vec::new();
    for limit in [
        read_limit(dir, "memory.limit_in_bytes"),
        read_limit(dir, "memory.max"),
    ]
    .into_iter()
    .flatten()
    {
        limits.push(ChainLimit {
            cgroup: dir.to_path_buf(),
            bytes: limit,
            used,
        });
    }
    if let (Some(limit), Some(memsw)) = (
        read_limit(dir, "memory.memsw.limit_in_bytes"),
        read_limit(dir, "memory.memsw.usage_in_bytes"),
    ) {
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
                ("memory.limit_in_bytes", NO_LIMIT),
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

        let dir = root.path().join("v2");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("memory.max"), "268435456\n").unwrap();
        fs::write(dir.join("memory.current"), "104857600\n").unwrap();
        fs::write(dir.join("memory.high"), "241172480\n").unwrap();
        fs::write(dir.join("memory.stat"), "anon 104857600\n").unwrap();
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
