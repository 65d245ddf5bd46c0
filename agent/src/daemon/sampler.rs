//! Reads worker and task memory from the kernel's own files: the cgroup
//! counters and /proc. The only I/O the watchdog's figures come from.

use std::{
    collections::{HashMap, HashSet},
    io,
    path::Path,
};

use procfs::Current as _;

use crate::{cgroup::memory, model::spec::MemorySource, watchdog::policy::Sample};

/// Reads memory figures; a trait so the agent loop can be tested with fakes.
pub(crate) trait MemoryReader: Send + Sync {
    fn read(&self, source: &MemorySource) -> io::Result<u64>;
    /// The cgroup's own soft cap: v2 `memory.high`, v1 `memory.soft_limit_in_bytes`.
    fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64>;
}

/// Reads the running system.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SystemReader;

impl MemoryReader for SystemReader {
    fn read(&self, source: &MemorySource) -> io::Result<u64> {
        match source {
            MemorySource::Cgroup(path) => memory::working_set(path),
            MemorySource::Pid(pid) => processes_rss(|p| p.pid == *pid as i32),
            MemorySource::Process(text) => {
                let me = std::process::id() as i32;
                processes_rss(|p| p.pid != me && p.cmdline.contains(text.as_str()))
            }
            MemorySource::Host => host_used(),
        }
    }

    fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64> {
        memory::soft_cap(cgroup)
    }
}

/// Reads every source; unreadable ones are left out of the sample (the
/// watchdog skips their checks rather than act on a guess).
pub(crate) fn sample(
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
pub(crate) mod fake {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    pub(crate) struct FakeReader {
        pub memory: Mutex<HashMap<MemorySource, u64>>,
        pub caps: Mutex<HashMap<std::path::PathBuf, u64>>,
    }

    impl FakeReader {
        pub(crate) fn set(&self, source: MemorySource, bytes: u64) {
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
