//! The kernel's OOM-kill counters: v1 `memory.oom_control`, v2
//! `memory.events.local` or `memory.events` (the line `oom_kill N`).

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use tracing::warn;

use super::{CgroupVersion, MemoryHierarchy};

/// Most cgroups looked at in one scan (a bound on a runaway hierarchy).
pub(crate) const MAX_CGROUPS: usize = 100_000;

/// The kernel's OOM-kill counter of every memory cgroup, by path.
pub(crate) fn read_oom_counts(hierarchy: &MemoryHierarchy) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let mut stack: Vec<PathBuf> = vec![hierarchy.root.clone()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        seen += 1;
        if seen > MAX_CGROUPS {
            warn!(
                max = MAX_CGROUPS,
                "too many memory cgroups; OOM counters of the rest are not read"
            );
            break;
        }
        if let Some(kills) = oom_kills(&dir, hierarchy.version) {
            counts.insert(dir.display().to_string(), kills);
        }
        // Cgroups come and go while we walk: a vanished one is skipped.
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    counts
}

/// `oom_kill N` of one cgroup: kills of its own tasks only (v2's
/// `memory.events` also counts those of every descendant).
pub(crate) fn oom_kills(dir: &Path, version: CgroupVersion) -> Option<u64> {
    let files: &[&str] = match version {
        CgroupVersion::V1 => &["memory.oom_control"],
        CgroupVersion::V2 => &["memory.events.local", "memory.events"],
    };
    files.iter().find_map(|file| {
        let text = fs::read_to_string(dir.join(file)).ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    })
}

/// The kernel's OOM-kill count for a cgroup's own tasks (see
/// [`oom_kills`]), whichever cgroup version it is on.
pub(crate) fn oom_kill_count(cgroup: &Path) -> Option<u64> {
    let version = if cgroup.join("memory.oom_control").exists() {
        CgroupVersion::V1
    } else {
        CgroupVersion::V2
    };
    oom_kills(cgroup, version)
}

/// Cgroups whose kill counter grew between two readings, as
/// `(cgroup, before, after)`. A cgroup new since `before` started at 0; a
/// counter that went down is a new cgroup under an old name.
pub(crate) fn grown<'a>(
    before: &BTreeMap<String, u64>,
    now: &'a BTreeMap<String, u64>,
) -> Vec<(&'a str, u64, u64)> {
    now.iter()
        .filter_map(|(cgroup, &kills)| {
            let was = before.get(cgroup).copied().unwrap_or(0);
            let was = if kills < was { 0 } else { was };
            (kills > was).then_some((cgroup.as_str(), was, kills))
        })
        .collect()
}

/// The host-wide OOM-kill count (`oom_kill` of /proc/vmstat, Linux 4.13+):
/// every kill, global or of a cgroup's limit, counted once.
pub(crate) fn host_oom_kills() -> Option<u64> {
    host_oom_kills_in(&fs::read_to_string("/proc/vmstat").ok()?)
}

fn host_oom_kills_in(vmstat: &str) -> Option<u64> {
    vmstat
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::temp_hierarchy as hierarchy;

    #[test]
    fn the_host_wide_count_is_vmstats_oom_kill_line() {
        assert_eq!(host_oom_kills_in("pgfault 9\noom_kill 3\nfoo 1\n"), Some(3));
        assert_eq!(host_oom_kills_in("pgfault 9\n"), None);
        assert!(host_oom_kills().is_some(), "this kernel has the line");
    }

    #[test]
    fn reads_v1_oom_control_counters_recursively() {
        let (dir, h) = hierarchy(CgroupVersion::V1);
        let job = dir.path().join("slurm/job_7");
        fs::create_dir_all(&job).unwrap();
        fs::write(
            dir.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
        )
        .unwrap();
        fs::write(
            job.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        let counts = read_oom_counts(&h);
        assert_eq!(counts.len(), 2, "{counts:?}");
        assert_eq!(counts[&dir.path().display().to_string()], 4);
        assert_eq!(counts[&job.display().to_string()], 1);
    }

    #[test]
    fn v2_prefers_the_local_counter() {
        let (dir, h) = hierarchy(CgroupVersion::V2);
        fs::write(dir.path().join("memory.events"), "oom 5\noom_kill 5\n").unwrap();
        fs::write(
            dir.path().join("memory.events.local"),
            "oom 1\noom_kill 2\n",
        )
        .unwrap();
        assert_eq!(read_oom_counts(&h)[&dir.path().display().to_string()], 2);
    }
}
