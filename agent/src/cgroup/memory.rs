//! A cgroup's memory figures: its working set and its own soft cap.

use std::{fs, io, path::Path};

/// Usage minus inactive file cache: what kubelet calls the working set. The
/// page cache the kernel can drop at once is not memory a worker "holds".
pub fn working_set(cgroup: &Path) -> io::Result<u64> {
    let (usage, v2) = versioned_usage(cgroup)?;
    let stat = read_stat(cgroup)?;
    let inactive_key = if v2 {
        "inactive_file"
    } else {
        "total_inactive_file"
    };
    let inactive = stat_value(&stat, inactive_key).unwrap_or(0);
    Ok(usage.saturating_sub(inactive))
}

/// The cgroup's usage (`memory.current`, v1 `memory.usage_in_bytes`): one
/// small read, file cache included.
pub(crate) fn usage(cgroup: &Path) -> io::Result<u64> {
    versioned_usage(cgroup).map(|(usage, _)| usage)
}

/// The cgroup's usage, and whether it is a v2 cgroup (`memory.current`
/// answered). The file that answered last is tried first: one open a call
/// on either version, not a failed one or a `stat` before it (at thousands
/// of task cgroups a tick, that was a twentieth of the agent's idle CPU).
fn versioned_usage(cgroup: &Path) -> io::Result<(u64, bool)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static V1_FIRST: AtomicBool = AtomicBool::new(false);
    const FILES: [&str; 2] = ["memory.current", "memory.usage_in_bytes"];
    let first = usize::from(V1_FIRST.load(Ordering::Relaxed));
    match read_u64(&cgroup.join(FILES[first])) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let read = read_u64(&cgroup.join(FILES[1 - first]));
            if read.is_ok() {
                V1_FIRST.store(first == 0, Ordering::Relaxed);
            }
            read.map(|usage| (usage, first == 1))
        }
        read => read.map(|usage| (usage, first == 0)),
    }
}

/// What reclaim cannot free: usage minus clean page cache (active and
/// inactive file not dirty or under writeback), and minus reclaimable slab
/// on v2. Without swap this is what a limit kills for; page cache that the
/// kernel drops first never brings a kill nearer. See docs/design.md,
/// "Predicting the kill".
pub(crate) fn unreclaimable(cgroup: &Path) -> io::Result<u64> {
    let (usage, v2) = versioned_usage(cgroup)?;
    let stat = read_stat(cgroup)?;
    Ok(unreclaimable_of(usage, &stat, v2))
}

/// [`unreclaimable`] from a usage and a `memory.stat` text.
pub(crate) fn unreclaimable_of(usage: u64, stat: &str, v2: bool) -> u64 {
    let keys: [&str; 5] = if v2 {
        [
            "active_file",
            "inactive_file",
            "file_dirty",
            "file_writeback",
            "slab_reclaimable",
        ]
    } else {
        [
            "total_active_file",
            "total_inactive_file",
            "total_dirty",
            "total_writeback",
            "",
        ]
    };
    let [active, inactive, dirty, writeback, slab] = keys.map(|k| stat_value(stat, k).unwrap_or(0));
    let clean_file = (active + inactive).saturating_sub(dirty + writeback);
    usage.saturating_sub(clean_file + slab)
}

/// The value of `key` in a `memory.stat`-style file.
pub(crate) fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The cgroup's `memory.stat`: without the size query (an `fstat` and an
/// `lseek`) that `fs::read_to_string` makes first, which a kernel file
/// cannot answer anyway (it says 0 or 4096). At most 1 MiB.
fn read_stat(cgroup: &Path) -> io::Result<String> {
    use std::io::Read as _;
    let file = fs::File::open(cgroup.join("memory.stat"))?;
    let mut text = String::with_capacity(4096);
    file.take(1 << 20).read_to_string(&mut text)?;
    Ok(text)
}

pub(crate) fn read_u64(path: &Path) -> io::Result<u64> {
    // A number of at most 20 digits: read into a small buffer, without the
    // size query (an fstat) of `fs::read_to_string`.
    use std::io::Read as _;
    let mut buf = [0u8; 32];
    let mut file = fs::File::open(path)?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..])? {
            0 => break,
            n => len += n,
        }
    }
    let text = std::str::from_utf8(&buf[..len]).unwrap_or_default();
    text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e} ({text:?})", path.display()),
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

    /// A v2 cgroup directory: `memory.current` and `memory.stat`.
    fn v2_cgroup(current: &str, stat: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("memory.current"), current).unwrap();
        fs::write(dir.path().join("memory.stat"), stat).unwrap();
        dir
    }

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

        let dir = v2_cgroup("2000\n", "anon 1500\ninactive_file 500\n");
        assert_eq!(working_set(dir.path()).unwrap(), 1500);
    }

    /// v1 and v2 cgroups in turn, either first: each read gives its own
    /// file's number.
    #[test]
    fn usage_reads_whichever_file_the_version_has() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("v1");
        let v2 = root.path().join("v2");
        fs::create_dir_all(&v1).unwrap();
        fs::create_dir_all(&v2).unwrap();
        fs::write(v1.join("memory.usage_in_bytes"), "4096\n").unwrap();
        fs::write(v2.join("memory.current"), "8192\n").unwrap();
        for _ in 0..2 {
            assert_eq!(usage(&v1).unwrap(), 4096);
            assert_eq!(usage(&v2).unwrap(), 8192);
        }
        assert!(usage(root.path()).is_err(), "neither file");
        fs::write(v1.join("memory.usage_in_bytes"), "not a number\n").unwrap();
        let error = usage(&v1).unwrap_err().to_string();
        assert!(error.contains("memory.usage_in_bytes"), "{error}");
    }

    #[test]
    fn unreclaimable_leaves_out_clean_page_cache_v1_and_v2() {
        // v1: 1000 used, 600 file of which 100 dirty and 50 under writeback.
        let v1 = "cache 600\nrss 400\ntotal_active_file 200\ntotal_inactive_file 400\n\
                  total_dirty 100\ntotal_writeback 50\n";
        assert_eq!(unreclaimable_of(1000, v1, false), 550);
        // v2: reclaimable slab is left out too; v1 names are not read.
        let v2 = "anon 300\nactive_file 100\ninactive_file 500\nfile_dirty 0\n\
                  file_writeback 0\nslab_reclaimable 50\ntotal_inactive_file 999\n";
        assert_eq!(unreclaimable_of(1000, v2, true), 350);
        // Page cache growing while anon stays put: the figure stays put.
        for cache in [0u64, 100, 10_000] {
            let stat = format!("total_inactive_file {cache}\n");
            assert_eq!(unreclaimable_of(700 + cache, &stat, false), 700);
        }
        let dir = v2_cgroup("2000\n", "anon 1500\ninactive_file 500\n");
        assert_eq!(unreclaimable(dir.path()).unwrap(), 1500);
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
