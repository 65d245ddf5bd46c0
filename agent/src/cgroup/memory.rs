//! A cgroup's memory figures: its working set and its own soft cap.

use std::{fs, io, path::Path};

/// Usage minus inactive file cache: what kubelet calls the working set. The
/// page cache the kernel can drop at once is not memory a worker "holds".
pub fn working_set(cgroup: &Path) -> io::Result<u64> {
    let (usage_file, inactive_key) = if cgroup.join("memory.current").exists() {
        ("memory.current", "inactive_file")
    } else {
        ("memory.usage_in_bytes", "total_inactive_file")
    };
    let usage = read_u64(&cgroup.join(usage_file))?;
    let stat = fs::read_to_string(cgroup.join("memory.stat"))?;
    let inactive = stat_value(&stat, inactive_key).unwrap_or(0);
    Ok(usage.saturating_sub(inactive))
}

/// The value of `key` in a `memory.stat`-style file.
pub(crate) fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_u64(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// The cgroup's own soft cap: v2 `memory.high`, v1 `memory.soft_limit_in_bytes`;
/// `None` when unset or unlimited.
pub(crate) fn soft_cap(cgroup: &Path) -> Option<u64> {
    // Values this large mean "no limit" on v1 (PAGE_COUNTER_MAX pages).
    const UNLIMITED: u64 = 1 << 62;
    let text = fs::read_to_string(cgroup.join("memory.high"))
        .or_else(|_| fs::read_to_string(cgroup.join("memory.soft_limit_in_bytes")))
        .ok()?;
    text.trim().parse::<u64>().ok().filter(|&v| v < UNLIMITED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn working_set_subtracts_inactive_file_v1_and_v2() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(
            dir.path().join("memory.stat"),
            "cache 5\ntotal_inactive_file 300\n",
        )
        .unwrap();
        assert_eq!(working_set(dir.path()).unwrap(), 700);

        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("memory.current"), "2000\n").unwrap();
        fs::write(
            dir.path().join("memory.stat"),
            "anon 1500\ninactive_file 500\n",
        )
        .unwrap();
        assert_eq!(working_set(dir.path()).unwrap(), 1500);
    }

    #[test]
    fn soft_cap_from_the_cgroup_ignores_unlimited() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("memory.soft_limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(soft_cap(dir.path()), None);
        fs::write(dir.path().join("memory.soft_limit_in_bytes"), "67108864\n").unwrap();
        assert_eq!(soft_cap(dir.path()), Some(64 << 20));
        fs::write(dir.path().join("memory.high"), "max\n").unwrap();
        assert_eq!(soft_cap(dir.path()), None, "v2 `max` is no cap");
    }
}
