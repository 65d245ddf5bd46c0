//! The kernel log rival: `/dev/kmsg` read as node-problem-detector and
//! cAdvisor read it (see the module above).

use std::{
    fs::File,
    io::{self, Read as _, Seek as _, SeekFrom},
    os::{
        fd::{AsRawFd as _, RawFd},
        unix::fs::OpenOptionsExt as _,
    },
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::SystemTime,
};

use anyhow::Context as _;

use super::{TICK_MS, Thread};

/// The largest record `/dev/kmsg` returns (the kernel's limit for one
/// record with its prefix); a smaller buffer gets EINVAL.
const KMSG_RECORD: usize = 8192;

/// The OOM killer's per-kill line: `<why>: Killed process PID (comm)
/// total-vm:…kB, anon-rss:…kB, file-rss:…kB, shmem-rss:…kB, …`.
#[derive(Debug, PartialEq)]
pub(crate) struct KillLine {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    /// anon + file + shmem RSS.
    pub(crate) rss_kib: u64,
}

/// The OOM killer's summary line: `oom-kill:constraint=…,nodemask=…,
/// cpuset=…,mems_allowed=…,oom_memcg=…,task_memcg=…,task=…,pid=…,uid=…`
/// (`global_oom` instead of `oom_memcg=…` when the host ran out).
#[derive(Debug, PartialEq)]
pub(crate) struct Summary {
    pub(crate) pid: u32,
    pub(crate) task: String,
    /// The victim's memory cgroup, as a path under the hierarchy's root.
    pub(crate) task_memcg: String,
    /// The cgroup whose limit was hit; `None` for a global OOM.
    pub(crate) oom_memcg: Option<String>,
}

/// The message of a `/dev/kmsg` record: `prio,seq,usec,flags[,…];message`,
/// then dictionary lines (` KEY=value`), which are dropped.
fn kmsg_message(record: &str) -> Option<&str> {
    let (_, rest) = record.split_once(';')?;
    Some(rest.split('\n').next().unwrap_or(rest))
}

fn kill_line(message: &str) -> Option<KillLine> {
    let (_, rest) = message.split_once("Killed process ")?;
    let (pid, rest) = rest.split_once(" (")?;
    // The comm may hold spaces or parentheses: it ends before the figures.
    let (comm, figures) = rest.split_once(") total-vm:")?;
    let kib = |key: &str| -> Option<u64> {
        let (_, after) = figures.split_once(key)?;
        after.split_once("kB")?.0.parse().ok()
    };
    Some(KillLine {
        pid: pid.parse().ok()?,
        comm: comm.to_string(),
        rss_kib: kib("anon-rss:")? + kib("file-rss:")? + kib("shmem-rss:")?,
    })
}

fn summary_line(message: &str) -> Option<Summary> {
    let rest = message.strip_prefix("oom-kill:")?;
    // Fields are read from the end: earlier ones (mems_allowed=0,2) may
    // hold commas of their own.
    let (rest, _uid) = rest.rsplit_once(",uid=")?;
    let (rest, pid) = rest.rsplit_once(",pid=")?;
    let (rest, task) = rest.rsplit_once(",task=")?;
    let (rest, task_memcg) = rest.rsplit_once(",task_memcg=")?;
    let oom_memcg = rest.rsplit_once(",oom_memcg=").map(|(_, m)| m.to_string());
    Some(Summary {
        pid: pid.parse().ok()?,
        task: task.to_string(),
        task_memcg: task_memcg.to_string(),
        oom_memcg,
    })
}

/// What the kmsg reader got, each line with the moment it was read.
#[derive(Default)]
pub(crate) struct KmsgSeen {
    pub(crate) kills: Vec<(KillLine, SystemTime)>,
    pub(crate) summaries: Vec<(Summary, SystemTime)>,
    /// Records read (of any kind).
    pub(crate) records: usize,
    /// Times the reader fell behind and the kernel had overwritten records
    /// it had not read (EPIPE).
    pub(crate) overruns: usize,
}

impl KmsgSeen {
    /// When the kill line of `pid` was read.
    pub(crate) fn kill(&self, pid: u32) -> Option<SystemTime> {
        self.kills
            .iter()
            .find(|(k, _)| k.pid == pid)
            .map(|(_, at)| *at)
    }

    /// Whether a summary line names `pid`'s cgroup as `cgroup` (a full
    /// path in the hierarchy mounted at `root`).
    pub(crate) fn names(&self, pid: u32, root: &Path, cgroup: &Path) -> bool {
        self.summaries
            .iter()
            .any(|(s, _)| s.pid == pid && root.join(s.task_memcg.trim_start_matches('/')) == cgroup)
    }
}

/// A reader of `/dev/kmsg` on a thread of its own, from the end of the log
/// at [`Kmsg::start`] until [`Kmsg::finish`].
pub(crate) struct Kmsg(Thread<KmsgSeen>);

impl Kmsg {
    /// Opens the log and seeks to its end (older records are skipped)
    /// before it returns: every record after the call is read.
    pub(crate) fn start() -> anyhow::Result<Kmsg> {
        let mut log = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .context("open /dev/kmsg")?;
        log.seek(SeekFrom::End(0)).context("seek /dev/kmsg")?;
        Ok(Kmsg(Thread::spawn(move |stop| read_kmsg(&mut log, stop))))
    }

    pub(crate) fn finish(mut self) -> anyhow::Result<KmsgSeen> {
        self.0.finish()
    }
}

/// Reads records as they come until `stop`: each read returns one record.
fn read_kmsg(log: &mut File, stop: &AtomicBool) -> io::Result<KmsgSeen> {
    let mut seen = KmsgSeen::default();
    let mut buf = vec![0u8; KMSG_RECORD];
    while !stop.load(Ordering::Relaxed) {
        if !readable(log.as_raw_fd(), TICK_MS)? {
            continue;
        }
        // Bounded: the log holds a finite number of unread records, and
        // WouldBlock ends the drain.
        loop {
            let n = match log.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                    seen.overruns += 1;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let at = SystemTime::now();
            seen.records += 1;
            let record = String::from_utf8_lossy(&buf[..n]);
            let Some(message) = kmsg_message(&record) else {
                continue;
            };
            if let Some(kill) = kill_line(message) {
                seen.kills.push((kill, at));
            } else if let Some(summary) = summary_line(message) {
                seen.summaries.push((summary, at));
            }
        }
    }
    Ok(seen)
}

/// Waits at most `timeout_ms` for `fd` to be readable.
fn readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, its count 1.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    match n {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmsg_records_and_oom_lines() {
        let kill = "3,1234,129885900,-;Memory cgroup out of memory: Killed process 3869 (tail) \
                    total-vm:19076kB, anon-rss:16256kB, file-rss:1596kB, shmem-rss:0kB, UID:0 \
                    pgtables:76kB oom_score_adj:0\n SUBSYSTEM=x\n";
        let message = kmsg_message(kill).unwrap();
        assert!(message.starts_with("Memory cgroup out of memory"));
        assert_eq!(
            kill_line(message),
            Some(KillLine {
                pid: 3869,
                comm: "tail".into(),
                rss_kib: 16256 + 1596,
            })
        );
        let odd = "Out of memory: Killed process 7 (a) b) total-vm:1kB, anon-rss:2kB, file-rss:3kB, shmem-rss:4kB, UID:0";
        assert_eq!(
            kill_line(odd).map(|k| (k.comm, k.rss_kib)),
            Some(("a) b".into(), 9))
        );

        let summary = "6,1233,129885869,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),\
                       cpuset=/,mems_allowed=0,2,oom_memcg=/probe-x,task_memcg=/probe-x/job,\
                       task=tail,pid=3869,uid=0\n";
        let s = summary_line(kmsg_message(summary).unwrap()).unwrap();
        assert_eq!(s.pid, 3869);
        assert_eq!(s.task, "tail");
        assert_eq!(s.task_memcg, "/probe-x/job");
        assert_eq!(s.oom_memcg.as_deref(), Some("/probe-x"));
        let global = "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,\
                      global_oom,task_memcg=/,task=x,pid=1,uid=0";
        assert_eq!(summary_line(global).unwrap().oom_memcg, None);
        assert_eq!(
            summary_line("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask="),
            None
        );
        assert_eq!(kill_line("oom_reaper: reaped process 3869 (tail)"), None);

        let mut seen = KmsgSeen::default();
        seen.summaries.push((s, SystemTime::UNIX_EPOCH));
        let root = Path::new("/sys/fs/cgroup/memory");
        assert!(seen.names(3869, root, &root.join("probe-x/job")));
        assert!(!seen.names(3869, root, &root.join("probe-x")));
    }
}
