//! Reads worker and task memory from the kernel's own files: the cgroup
//! counters and /proc. The only I/O the watchdog's figures come from.

use std::{
    collections::{HashMap, HashSet},
    io,
    path::Path,
};

use procfs::Current as _;

use crate::{
    cgroup::{
        memory,
        pressure::{self, PressureError},
    },
    model::{
        pressure::{MemoryEvents, Pressure},
        spec::MemorySource,
    },
    watchdog::policy::Sample,
};

/// Reads memory figures; a trait so the agent loop can be tested with fakes.
pub(crate) trait MemoryReader: Send + Sync {
    fn read(&self, source: &MemorySource) -> io::Result<u64>;
    /// The cgroup's own soft cap: v2 `memory.high`, v1 `memory.soft_limit_in_bytes`.
    fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64>;
    /// The host's memory PSI (`/proc/pressure/memory`); `None` without PSI.
    fn host_pressure(&self) -> Option<Pressure>;
    /// A cgroup's memory PSI (`memory.pressure`, v2 only); `None` without.
    fn cgroup_pressure(&self, cgroup: &Path) -> Option<Pressure>;
    /// A cgroup's memory event counters (v2 `memory.events`, v1 equivalents).
    fn memory_events(&self, cgroup: &Path) -> Option<MemoryEvents>;
}

/// A PSI reading, with errors other than "no PSI here" logged.
fn psi(file: &str, read: Result<Pressure, PressureError>) -> Option<Pressure> {
    match read {
        Ok(pressure) => Some(pressure),
        Err(PressureError::Unsupported(_)) => None,
        Err(error) => {
            tracing::debug!(file, %error, "pressure not readable");
            None
        }
    }
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

    fn host_pressure(&self) -> Option<Pressure> {
        psi(pressure::HOST_PRESSURE, pressure::host())
    }

    fn cgroup_pressure(&self, cgroup: &Path) -> Option<Pressure> {
        psi("memory.pressure", pressure::of_cgroup(cgroup))
    }

    fn memory_events(&self, cgroup: &Path) -> Option<MemoryEvents> {
        pressure::memory_events(cgroup)
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
        ..Sample::default()
    }
}

/// Adds the kernel's figures of every cgroup worker to a sample: its PSI
/// and its memory event counters (a few small files each, read on the
/// sampler's tick).
pub(crate) fn kernel_figures(
    reader: &dyn MemoryReader,
    workers: &[(String, MemorySource)],
    sample: &mut Sample,
) {
    for (name, source) in workers {
        let MemorySource::Cgroup(cgroup) = source else {
            continue;
        };
        if let Some(pressure) = reader.cgroup_pressure(cgroup) {
            sample.pressure.insert(name.clone(), pressure);
        }
        if let Some(events) = reader.memory_events(cgroup) {
            sample.memory_events.insert(name.clone(), events);
        }
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
        pub host_pressure: Mutex<Option<Pressure>>,
        /// PSI and memory.events by cgroup: parsed from fixture text, as
        /// the real files would be.
        pub pressure: Mutex<HashMap<std::path::PathBuf, Pressure>>,
        pub events: Mutex<HashMap<std::path::PathBuf, MemoryEvents>>,
    }

    impl FakeReader {
        pub(crate) fn set(&self, source: MemorySource, bytes: u64) {
            self.memory.lock().unwrap().insert(source, bytes);
        }

        /// A cgroup's `memory.pressure`, as its text.
        pub(crate) fn set_pressure(&self, cgroup: &Path, text: &str) {
            let parsed = pressure::parse(text).pressure.expect("a PSI fixture");
            self.pressure
                .lock()
                .unwrap()
                .insert(cgroup.to_path_buf(), parsed);
        }

        /// A cgroup's `memory.events`, as its text.
        pub(crate) fn set_events(&self, cgroup: &Path, text: &str) {
            self.events
                .lock()
                .unwrap()
                .insert(cgroup.to_path_buf(), pressure::parse_memory_events(text));
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

        fn host_pressure(&self) -> Option<Pressure> {
            *self.host_pressure.lock().unwrap()
        }

        fn cgroup_pressure(&self, cgroup: &Path) -> Option<Pressure> {
            self.pressure.lock().unwrap().get(cgroup).copied()
        }

        fn memory_events(&self, cgroup: &Path) -> Option<MemoryEvents> {
            self.events.lock().unwrap().get(cgroup).cloned()
        }
    }
}
