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
        limits::{self, ChainLimit},
        memory,
        pressure::{self, PressureError},
    },
    model::{
        FastMap,
        pressure::{MemoryEvents, Pressure},
        spec::MemorySource,
    },
    watchdog::policy::Sample,
};

/// Reads memory figures; a trait so the agent loop can be tested with fakes.
pub(crate) trait MemoryReader: Send + Sync {
    fn read(&self, source: &MemorySource) -> io::Result<u64>;
    /// Reads many sources at once (by default one by one).
    fn read_many(&self, sources: &[(String, MemorySource)]) -> Vec<(String, io::Result<u64>)> {
        sources
            .iter()
            .map(|(name, source)| (name.clone(), self.read(source)))
            .collect()
    }
    /// The cgroup's own soft cap: v2 `memory.high`, v1 `memory.soft_limit_in_bytes`.
    fn cgroup_soft_cap(&self, cgroup: &Path) -> Option<u64>;
    /// The host's memory PSI (`/proc/pressure/memory`); `None` without PSI.
    fn host_pressure(&self) -> Option<Pressure>;
    /// A cgroup's memory PSI (`memory.pressure`, v2 only); `None` without.
    fn cgroup_pressure(&self, cgroup: &Path) -> Option<Pressure>;
    /// A cgroup's memory event counters (v2 `memory.events`, v1 equivalents).
    fn memory_events(&self, cgroup: &Path) -> Option<MemoryEvents>;
    /// For the kill predictor: the cgroup's unreclaimable memory, every
    /// finite limit from it up to `root`, and its `memory.high` when below
    /// its limit. `None` (the default) when unreadable: nothing predicted.
    fn predict_figures(&self, cgroup: &Path, root: &Path) -> Option<PredictFigures> {
        let _ = (cgroup, root);
        None
    }
    /// A cgroup's usage, file cache included: one small read that tells
    /// whether its predictor figures can have moved since they were read.
    /// `None` (the default): read them again.
    fn cgroup_usage(&self, cgroup: &Path) -> Option<u64> {
        let _ = cgroup;
        None
    }
    /// [`predict_figures`](Self::predict_figures) of each of `cgroups`, in
    /// order, as one round: what they share (an ancestor's limits, the
    /// host's memory) may be read once for all.
    fn predict_figures_all(&self, cgroups: &[&Path], root: &Path) -> Vec<Option<PredictFigures>> {
        cgroups
            .iter()
            .map(|c| self.predict_figures(c, root))
            .collect()
    }
    /// Whether the limits (and `memory.high`) of `kept`, a cgroup's
    /// [`PredictFigures`] read before, still stand: only the limit files
    /// are read, an ancestor's once per `shared`. `false` (the default):
    /// read it in full.
    fn limits_stand(
        &self,
        cgroup: &Path,
        kept: &PredictFigures,
        root: &Path,
        shared: &mut limits::LimitsShared,
    ) -> bool {
        let _ = (cgroup, kept, root, shared);
        false
    }
}

/// What [`MemoryReader::predict_figures`] reads of one cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PredictFigures {
    pub unreclaimable: u64,
    pub limits: Vec<ChainLimit>,
    pub high: Option<u64>,
    /// The host's memory and what is used of it (MemTotal − MemAvailable).
    pub host: Option<(u64, u64)>,
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
            MemorySource::Pid(pid) => match subtree_rss(*pid as i32)? {
                Some(bytes) => Ok(bytes),
                None => ProcessTable::load(false)?.rss(source),
            },
            MemorySource::Process(_) => ProcessTable::load(true)?.rss(source),
            MemorySource::Host => host_used(),
        }
    }

    /// Pid and process sources share one walk of /proc when there are
    /// several (a tick): the walk costs the same for one as for a thousand.
    fn read_many(&self, sources: &[(String, MemorySource)]) -> Vec<(String, io::Result<u64>)> {
        let by_process =
            |s: &MemorySource| matches!(s, MemorySource::Pid(_) | MemorySource::Process(_));
        let walked = sources.iter().filter(|(_, s)| by_process(s)).count();
        let table = (walked > 1).then(|| {
            let cmdline = sources
                .iter()
                .any(|(_, s)| matches!(s, MemorySource::Process(_)));
            ProcessTable::load(cmdline)
        });
        sources
            .iter()
            .map(|(name, source)| {
                let bytes = match &table {
                    Some(Ok(table)) if by_process(source) => table.rss(source),
                    Some(Err(error)) if by_process(source) => {
                        Err(io::Error::new(error.kind(), error.to_string()))
                    }
                    _ => self.read(source),
                };
                (name.clone(), bytes)
            })
            .collect()
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

    fn predict_figures(&self, cgroup: &Path, root: &Path) -> Option<PredictFigures> {
        self.predict_figures_all(&[cgroup], root).pop().flatten()
    }

    fn cgroup_usage(&self, cgroup: &Path) -> Option<u64> {
        memory::usage(cgroup).ok()
    }

    fn limits_stand(
        &self,
        cgroup: &Path,
        kept: &PredictFigures,
        root: &Path,
        shared: &mut limits::LimitsShared,
    ) -> bool {
        limits::limits_stand(cgroup, &kept.limits, kept.high, root, shared)
    }

    /// The host's memory is read once, and each ancestor's limits once, for
    /// the whole round (a worker's thousands of task cgroups share both).
    fn predict_figures_all(&self, cgroups: &[&Path], root: &Path) -> Vec<Option<PredictFigures>> {
        // Nothing to read (no cgroup followed, or every one kept): not even
        // the host's memory.
        if cgroups.is_empty() {
            return Vec::new();
        }
        let host = procfs::Meminfo::current().ok().map(|info| {
            let available = info.mem_available.unwrap_or(info.mem_free);
            (info.mem_total, info.mem_total.saturating_sub(available))
        });
        let mut shared = limits::ChainShared::default();
        cgroups
            .iter()
            .map(|cgroup| {
                let unreclaimable = memory::unreclaimable(cgroup).ok()?;
                let (limits, high) = limits::limit_chain(cgroup, unreclaimable, root, &mut shared);
                Some(PredictFigures {
                    unreclaimable,
                    limits,
                    high,
                    host,
                })
            })
            .collect()
    }
}

/// Reads every source; unreadable ones are left out of the sample (the
/// watchdog skips their checks rather than act on a guess).
pub(crate) fn sample(
    reader: &dyn MemoryReader,
    workers: &[(String, MemorySource)],
    tasks: &[(String, MemorySource)],
) -> Sample {
    let read = |list: &[(String, MemorySource)]| -> FastMap<String, u64> {
        reader
            .read_many(list)
            .into_iter()
            .filter_map(|(name, read)| match read {
                Ok(bytes) => Some((name, bytes)),
                Err(error) => {
                    tracing::debug!(%name, %error, "memory not readable");
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

/// Every process at one moment: one walk of /proc.
struct ProcessTable {
    procs: Vec<Proc>,
    /// Indices into `procs` by parent pid.
    children: HashMap<i32, Vec<usize>>,
}

impl ProcessTable {
    /// Reads every process's stat (and command line, when asked).
    fn load(cmdline: bool) -> io::Result<Self> {
        let procs: Vec<Proc> = procfs::process::all_processes()
            .map_err(io::Error::other)?
            .flatten()
            .filter_map(|p| {
                let stat = p.stat().ok()?;
                Some(Proc {
                    pid: stat.pid,
                    ppid: stat.ppid,
                    rss_pages: stat.rss,
                    cmdline: if cmdline {
                        p.cmdline().map(|c| c.join(" ")).unwrap_or_default()
                    } else {
                        String::new()
                    },
                })
            })
            .collect();
        let mut children: HashMap<i32, Vec<usize>> = HashMap::new();
        for (i, p) in procs.iter().enumerate() {
            children.entry(p.ppid).or_default().push(i);
        }
        Ok(Self { procs, children })
    }

    /// Resident memory of a pid or process source: the processes it
    /// names and all their descendants.
    fn rss(&self, source: &MemorySource) -> io::Result<u64> {
        let me = std::process::id() as i32;
        let roots: Vec<usize> = match source {
            MemorySource::Pid(pid) => self
                .procs
                .iter()
                .position(|p| p.pid == *pid as i32)
                .into_iter()
                .collect(),
            MemorySource::Process(text) => (0..self.procs.len())
                .filter(|&i| {
                    let p = &self.procs[i];
                    p.pid != me && p.cmdline.contains(text.as_str())
                })
                .collect(),
            _ => Vec::new(),
        };
        if roots.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such process"));
        }
        let mut members: HashSet<usize> = HashSet::new();
        let mut stack = roots;
        while let Some(i) = stack.pop() {
            if members.insert(i) {
                stack.extend(self.children.get(&self.procs[i].pid).into_iter().flatten());
            }
        }
        let page = procfs::page_size();
        Ok(members
            .iter()
            .map(|&i| self.procs[i].rss_pages * page)
            .sum())
    }
}

/// Whether this kernel lists each thread's children
/// (`/proc/<pid>/task/<tid>/children`, CONFIG_PROC_CHILDREN).
fn children_files() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        let me = std::process::id();
        Path::new(&format!("/proc/{me}/task/{me}/children")).exists()
    })
}

/// Processes followed below one pid at most (a fork bomb stays bounded).
const MAX_SUBTREE: usize = 65_536;

/// Resident memory of `pid` and its descendants, read from the children
/// lists of its threads: the files of that tree only, not of every
/// process. `None` when the kernel keeps no such lists.
fn subtree_rss(pid: i32) -> io::Result<Option<u64>> {
    if !children_files() {
        return Ok(None);
    }
    let page = procfs::page_size();
    let mut total = 0;
    let mut stack = vec![pid];
    let mut seen = HashSet::new();
    while let Some(p) = stack.pop() {
        if seen.len() >= MAX_SUBTREE || !seen.insert(p) {
            continue;
        }
        let stat = procfs::process::Process::new(p).and_then(|proc| proc.stat());
        let stat = match stat {
            Ok(stat) => stat,
            Err(_) if p == pid => {
                return Err(io::Error::new(io::ErrorKind::NotFound, "no such process"));
            }
            // A child that ended meanwhile.
            Err(_) => continue,
        };
        total += stat.rss * page;
        let Ok(threads) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for thread in threads.flatten() {
            if let Ok(list) = std::fs::read_to_string(thread.path().join("children")) {
                stack.extend(
                    list.split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
    }
    Ok(Some(total))
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

    /// A shell with two children: its tree read from the children lists
    /// (one registration) is what one walk of /proc finds (a tick), and
    /// holds the children; a gone pid is NotFound either way.
    #[test]
    fn a_process_tree_reads_alike_from_its_children_lists_and_from_the_walk() {
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & sleep 60 & wait"])
            .spawn()
            .unwrap();
        let pid = shell.id() as i32;
        let list = format!("/proc/{pid}/task/{pid}/children");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let children: Vec<i32> = loop {
            let text = std::fs::read_to_string(&list).unwrap_or_default();
            let pids: Vec<i32> = text
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            // Both forks have become `sleep`: a child between fork and
            // exec still has the shell's pages, and the two reads below
            // would count it at two sizes.
            let execed = |p: &i32| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
            };
            if (pids.len() == 2 && pids.iter().all(execed)) || std::time::Instant::now() > deadline
            {
                break pids;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let source = MemorySource::Pid(pid as u32);
        let own = procfs::process::Process::new(pid)
            .unwrap()
            .stat()
            .unwrap()
            .rss
            * procfs::page_size();
        // Read both ways until a read by the lists agrees before and after
        // the walk (bounded): a page the shell touches between the reads
        // is the process's, not either reader's.
        let (listed, many) = {
            let mut tries = 0;
            loop {
                let before = subtree_rss(pid)
                    .unwrap()
                    .expect("this kernel lists children");
                let many = SystemReader.read_many(&[
                    ("tree".into(), source.clone()),
                    ("gone".into(), MemorySource::Pid(u32::MAX / 2)),
                ]);
                let after = subtree_rss(pid).unwrap().expect("listed again");
                tries += 1;
                if before == after || tries == 20 {
                    break (after, many);
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        };
        for child in &children {
            let _ = std::process::Command::new("kill")
                .arg(child.to_string())
                .status();
        }
        let _ = shell.kill();
        let _ = shell.wait();
        assert_eq!(children.len(), 2, "the shell's two sleeps");
        let walked = many[0].1.as_ref().unwrap();
        assert!(
            listed > own,
            "children counted: tree {listed}, shell alone {own}"
        );
        assert!(
            listed.abs_diff(*walked) <= 256 << 10,
            "children lists {listed}, walk {walked}"
        );
        assert_eq!(
            many[1].1.as_ref().unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}

/// A reader with set figures, for tests of everything above the sampler.
#[cfg(test)]
pub(crate) mod fake;
