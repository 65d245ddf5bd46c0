//! Reads worker and task memory from the kernel's own files: the cgroup
//! counters and /proc. The only I/O the watchdog's figures come from.

use std::{
    collections::{HashMap, HashSet},
    fs, io,
    path::Path,
};

use procfs::Current as _;

use crate::{model::spec::MemorySource, watchdog::policy::Sample};

/// Reads memory figures; a trait so the agent loop can be tested with fakes.
pub trait MemoryReader: Send + Sync {
    fn read(&self, source: &MemorySource) -> io::Result<u64>;
    /// The cgroup's own soft cap: v2 `memory.high`, v1 `memory.soft_limit_in_bytes`.
    fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64>;
}

/// Reads the running system.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemReader;

impl MemoryReader for SystemReader {
    fn read(&self, source: &MemorySource) -> io::Result<u64> {
        match source {
            MemorySource::Cgroup(path) => cgroup_working_set(path),
            MemorySource::Pid(pid) => processes_rss(|p| p.pid == *pid as i32),
            MemorySource::Process(text) => {
                let me = std::process::id() as i32;
                processes_rss(|p| p.pid != me && p.cmdline.contains(text.as_str()))
            }
            MemorySource::Host => host_used(),
        }
    }

    fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64> {
        // Values this large mean "no limit" on v1 (PAGE_COUNTER_MAX pages).
        const UNLIMITED: u64 = 1 << 62;
        let text = fs::read_to_string(cgroup.join("memory.high"))
            .or_else(|_| fs::read_to_string(cgroup.join("memory.soft_limit_in_bytes")))
            .ok()?;
        text.trim().parse::<u64>().ok().filter(|&v| v < UNLIMITED)
    }
}

/// Reads every source; unreadable ones are left out of the sample (the
/// watchdog skips their checks rather than act on a guess).
pub fn sample(
    reader: &dyn MemoryReader,
    workers: &[(String, MemorySource)],
    tasks: &[(String, MemorySource)],
) -> Sample {
    let read = |list: &[(String, MemorySource)]| -> HashMap<String, u64> {
        list.iter()
            .filter_map(|(name, source)| match reader.read(source) {
                Ok(bytes) => Some((name.clone(), bytes)),
                Err(error) => {
                    tracing::debug!(%name, ?source, %error, "memory not readable");
                    None
                }
            })
            .collect()
    };
    Sample {
        workers: read(workers),
        tasks: read(tasks),
    }
}

/// Usage minus inactive file cache: what kubelet calls the working set. The
/// page cache the kernel can drop at once is not memory a worker "holds".
pub fn cgroup_working_set(cgroup: &Path) -> io::Result<u64> {
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
pub fn stat_value(stat: &str, key: &str) -> Option<u64> {
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

struct Proc {
    pid: i32,
    ppid: i32,
    rss_pages: u64,
    cmdline: String,
}

/// Resident memory of the processes matching `root` and all their descendants.
fn processes_rss(root: impl Fn(&Proc) -> bool) -> io::Result<u64> {
    let procs: Vec<Proc> = procfs::process::all_processes()
        .map_err(io::Error::other)?
        .flatten()
        .filter_map(|p| {
            let stat = p.stat().ok()?;
            Some(Proc {
                pid: stat.pid,
                ppid: stat.ppid,
                rss_pages: stat.rss,
                cmdline: p.cmdline().map(|c| c.join(" ")).unwrap_or_default(),
            })
        })
        .collect();
    let mut members: HashSet<i32> = procs.iter().filter(|p| root(p)).map(|p| p.pid).collect();
    if members.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no such process"));
    }
    // Add descendants until nothing changes (bounded by the process count).
    loop {
        let before = members.len();
        members.extend(
            procs
                .iter()
                .filter(|p| members.contains(&p.ppid))
                .map(|p| p.pid)
                .collect::<Vec<_>>(),
        );
        if members.len() == before {
            break;
        }
    }
    let page = procfs::page_size();
    Ok(procs
        .iter()
        .filter(|p| members.contains(&p.pid))
        .map(|p| p.rss_pages * page)
        .sum())
}

fn host_used() -> io::Result<u64> {
    let info = procfs::Meminfo::current().map_err(io::Error::other)?;
    let available = info.mem_available.unwrap_or(info.mem_free);
    Ok(info.mem_total.saturating_sub(available))
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
        assert_eq!(cgroup_working_set(dir.path()).unwrap(), 700);

        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("memory.current"), "2000\n").unwrap();
        fs::write(
            dir.path().join("memory.stat"),
            "anon 1500\ninactive_file 500\n",
        )
        .unwrap();
        assert_eq!(cgroup_working_set(dir.path()).unwrap(), 1500);
    }

    #[test]
    fn soft_cap_from_the_cgroup_ignores_unlimited() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("memory.soft_limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(SystemReader.cgroup_soft_cap(dir.path()), None);
        fs::write(dir.path().join("memory.soft_limit_in_bytes"), "67108864\n").unwrap();
        assert_eq!(SystemReader.cgroup_soft_cap(dir.path()), Some(64 << 20));
        fs::write(dir.path().join("memory.high"), "max\n").unwrap();
        assert_eq!(
            SystemReader.cgroup_soft_cap(dir.path()),
            None,
            "v2 `max` is no cap"
        );
    }

    #[test]
    fn this_process_and_the_host_have_memory() {
        let me = SystemReader
            .read(&MemorySource::Pid(std::process::id()))
            .unwrap();
        assert!(me > 1 << 20, "own RSS {me}");
        let host = SystemReader.read(&MemorySource::Host).unwrap();
        assert!(host >= me);
        let gone = SystemReader.read(&MemorySource::Pid(u32::MAX / 2));
        assert_eq!(gone.unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}

/// A reader with set figures, for tests of everything above the sampler.
#[cfg(test)]
pub mod fake {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    pub struct FakeReader {
        pub memory: Mutex<HashMap<MemorySource, u64>>,
        pub caps: Mutex<HashMap<std::path::PathBuf, u64>>,
    }

    impl FakeReader {
        pub fn set(&self, source: MemorySource, bytes: u64) {
            self.memory.lock().unwrap().insert(source, bytes);
        }
    }

    impl MemoryReader for FakeReader {
        fn read(&self, source: &MemorySource) -> io::Result<u64> {
            self.memory
                .lock()
                .unwrap()
                .get(source)
                .copied()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not set"))
        }

        fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64> {
            self.caps.lock().unwrap().get(cgroup).copied()
        }
    }
}
