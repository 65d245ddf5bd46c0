//! The cgroup files `bench predict` writes and reads, on either hierarchy:
//! cgroup v1's memory controller (this host) or cgroup v2's unified one
//! (the Debian kernels `bench predict-v2` boots). The trace is the same
//! either way: usage, inactive and active file cache, the kill counter,
//! and memory pressure (the host's on v1, where no cgroup has its own; the
//! cgroup's `memory.pressure` on v2).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use super::trace::Sample;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fs {
    V1,
    V2,
}

impl Fs {
    /// The hierarchy this machine keeps its memory controller in.
    pub(super) fn detect() -> anyhow::Result<Fs> {
        let unified = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers");
        if unified.is_ok_and(|c| c.split_whitespace().any(|w| w == "memory")) {
            Ok(Fs::V2)
        } else if Path::new("/sys/fs/cgroup/memory/memory.usage_in_bytes").exists() {
            Ok(Fs::V1)
        } else {
            bail!(
                "no memory cgroup controller at /sys/fs/cgroup (v2) or /sys/fs/cgroup/memory (v1)"
            )
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Fs::V1 => "cgroup v1",
            Fs::V2 => "cgroup v2",
        }
    }

    pub(super) fn root(self) -> PathBuf {
        PathBuf::from(match self {
            Fs::V1 => "/sys/fs/cgroup/memory",
            Fs::V2 => "/sys/fs/cgroup",
        })
    }

    /// Makes `dir`; with `children`, enables the memory controller for the
    /// cgroups made inside it (v2; v1's controller is in every cgroup).
    pub(super) fn mkdir(self, dir: &Path, children: bool) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
        if children && self == Fs::V2 {
            write(&dir.join("cgroup.subtree_control"), "+memory")?;
        }
        Ok(())
    }

    /// The kernel's hard limit (no swap here beyond it).
    pub(super) fn set_limit(self, dir: &Path, bytes: u64) -> anyhow::Result<()> {
        let file = match self {
            Fs::V1 => "memory.limit_in_bytes",
            Fs::V2 => "memory.max",
        };
        write(&dir.join(file), &bytes.to_string())
    }

    /// v2's `memory.high`, where the kernel throttles growth.
    pub(super) fn set_high(self, dir: &Path, bytes: u64) -> anyhow::Result<()> {
        if self == Fs::V1 {
            bail!("cgroup v1 has no memory.high");
        }
        write(&dir.join("memory.high"), &bytes.to_string())
    }

    /// One read of `dir`'s usage and file cache, stamped `t`.
    pub(super) fn sample(self, dir: &Path, t: f64) -> Option<Sample> {
        let (usage, prefix) = match self {
            Fs::V1 => ("memory.usage_in_bytes", "total_"),
            Fs::V2 => ("memory.current", ""),
        };
        let usage = std::fs::read_to_string(dir.join(usage))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
        let field = |key: &str| {
            stat.lines()
                .find_map(|l| {
                    l.strip_prefix(prefix)?
                        .strip_prefix(key)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(0)
        };
        Some(Sample {
            t,
            usage,
            inactive_file: field("inactive_file"),
            active_file: field("active_file"),
        })
    }

    /// OOM kills the kernel counted in `dir` (v1 `memory.oom_control`,
    /// v2 `memory.events`: both `oom_kill N`).
    pub(super) fn oom_kills(self, dir: &Path) -> u64 {
        let file = match self {
            Fs::V1 => "memory.oom_control",
            Fs::V2 => "memory.events",
        };
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| super::super::delay::oom_control_kills(&text))
            .unwrap_or(0)
    }

    /// Memory pressure (`some avg10`, %) as systemd-oomd would read it for
    /// `dir`: its own `memory.pressure` on v2, the host's on v1.
    pub(super) fn pressure(self, dir: &Path) -> Option<f64> {
        let file = match self {
            Fs::V1 => PathBuf::from("/proc/pressure/memory"),
            Fs::V2 => dir.join("memory.pressure"),
        };
        let text = std::fs::read_to_string(file).ok()?;
        text.lines()
            .find(|l| l.starts_with("some "))?
            .split_whitespace()
            .find_map(|w| w.strip_prefix("avg10="))?
            .parse()
            .ok()
    }
}

fn write(file: &Path, value: &str) -> anyhow::Result<()> {
    std::fs::write(file, value).with_context(|| format!("write {value} to {}", file.display()))
}

/// Removes `dir` and every cgroup under it, deepest first (each empty by
/// then; a cgroup's own files cannot be removed and need not be).
pub(super) fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_hierarchies_read_the_same_sample() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("memory.usage_in_bytes"), "300\n").unwrap();
        std::fs::write(dir.path().join("memory.current"), "300\n").unwrap();
        std::fs::write(
            dir.path().join("memory.stat"),
            "inactive_file 7\nactive_file 9\ntotal_inactive_file 70\ntotal_active_file 90\n\
             anon 5\n",
        )
        .unwrap();
        let v1 = Fs::V1.sample(dir.path(), 1.0).expect("v1");
        let v2 = Fs::V2.sample(dir.path(), 1.0).expect("v2");
        // v1 counts the subtree in `total_*`; v2's keys are the subtree's.
        assert_eq!((v1.usage, v1.inactive_file, v1.active_file), (300, 70, 90));
        assert_eq!((v2.usage, v2.inactive_file, v2.active_file), (300, 7, 9));
    }

    #[test]
    fn kills_are_read_from_either_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("memory.events"),
            "low 0\nhigh 40\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        assert_eq!(Fs::V1.oom_kills(dir.path()), 2);
        assert_eq!(Fs::V2.oom_kills(dir.path()), 1);
        assert_eq!(Fs::V2.oom_kills(&dir.path().join("gone")), 0);
    }
}
