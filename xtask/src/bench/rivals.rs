//! The stronger rivals memwatch is measured against in `bench delay` and
//! `bench storm`, beside the plain pollers: what other watchers rely on,
//! written small and run on the same workloads in the same run.
//!
//! - [`Kmsg`] reads the kernel log from `/dev/kmsg`, as node-problem-detector
//!   and cAdvisor (the kubelet's OOM events) do: from its end, one record a
//!   read, the OOM killer's lines parsed. The per-kill line (`Killed process
//!   PID (comm) … anon-rss:…kB …`) is printed for every kill; the
//!   `oom-kill:` summary line (Linux ≥ 4.19), the only one naming the
//!   victim's cgroup, is printed under the OOM killer's rate limit (10 per
//!   5 s, shared by the whole host, with the header dump). Nothing in the log
//!   names a task or a worker, and a soft-cap crossing logs nothing.
//! - [`Thresholds`] has the kernel notify it, cgroup v1 (this host's memory
//!   hierarchy): an eventfd per cgroup registered through
//!   `cgroup.event_control` on `memory.usage_in_bytes` with a threshold (the
//!   soft cap), and one on `memory.oom_control` (the OOM condition, raised
//!   before a victim is chosen). One thread waits on all of them with epoll
//!   and stamps the wake-up; new cgroups are found with inotify on their
//!   parents and registered as they appear. A notification names only the
//!   cgroup it was registered on: no pid, no comm, no RSS.
//!
//! Both stamp what they see with `SystemTime::now()` the moment they get it,
//! the same clock as the webhook receiver's arrivals.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::CString,
    fs::File,
    io::{self, Read as _, Seek as _, SeekFrom},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::fs::OpenOptionsExt as _,
    },
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::SystemTime,
};

use anyhow::Context as _;

/// How long (ms) the rivals' threads wait for the kernel before they look
/// at their stop flag again.
const TICK_MS: i32 = 50;
/// The largest record `/dev/kmsg` returns (the kernel's limit for one
/// record with its prefix); a smaller buffer gets EINVAL.
const KMSG_RECORD: usize = 8192;

/// Sets `stop` and joins `thread`, once: the end of both rivals' threads.
fn stop_and_join<T>(
    stop: &AtomicBool,
    thread: &mut Option<thread::JoinHandle<io::Result<T>>>,
) -> anyhow::Result<Option<T>> {
    stop.store(true, Ordering::Relaxed);
    match thread.take().map(|t| t.join()) {
        None => Ok(None),
        Some(Ok(result)) => Ok(Some(result?)),
        Some(Err(_)) => anyhow::bail!("a rival's thread panicked"),
    }
}

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
pub(crate) struct Kmsg {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<io::Result<KmsgSeen>>>,
}

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
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = thread::spawn(move || read_kmsg(&mut log, &st));
        Ok(Kmsg {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn finish(mut self) -> anyhow::Result<KmsgSeen> {
        Ok(stop_and_join(&self.stop, &mut self.thread)?.unwrap_or_default())
    }
}

impl Drop for Kmsg {
    fn drop(&mut self) {
        let _ = stop_and_join(&self.stop, &mut self.thread);
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

/// What [`Thresholds`] watches.
pub(crate) struct Watch {
    /// Memory cgroups registered at start.
    pub(crate) cgroups: Vec<PathBuf>,
    /// Directories whose new subdirectories (cgroups made after start) are
    /// registered as they appear (inotify).
    pub(crate) parents: Vec<PathBuf>,
    /// The `memory.usage_in_bytes` threshold registered on each cgroup,
    /// if any (the OOM notification is registered always).
    pub(crate) usage_threshold: Option<u64>,
}

/// One notification kind on one cgroup.
#[derive(Clone, Debug)]
pub(crate) struct Wake {
    /// The first wake-up (or, when late, the moment registration found the
    /// event already past).
    pub(crate) first: SystemTime,
    /// Notifications counted (the eventfd's counter summed over reads).
    pub(crate) count: u64,
    /// Each wake-up that read a count, in order (one read may hold more
    /// than one notification: then `count` exceeds their number).
    pub(crate) times: Vec<SystemTime>,
    /// Registered only after the event: found by reading the file once.
    pub(crate) late: bool,
}

/// Per cgroup, what the kernel notified.
#[derive(Clone, Debug, Default)]
pub(crate) struct Notified {
    pub(crate) usage: Option<Wake>,
    pub(crate) oom: Option<Wake>,
}

/// What [`Thresholds`] got: per cgroup, and the registrations that failed
/// (a cgroup removed before it could be registered).
#[derive(Default)]
pub(crate) struct ThresholdsSeen {
    pub(crate) cgroups: BTreeMap<PathBuf, Notified>,
    pub(crate) failed: usize,
}

/// Kernel-notified thresholds of cgroup v1 on a thread of its own, from
/// [`Thresholds::start`] until [`Thresholds::finish`].
pub(crate) struct Thresholds {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<io::Result<ThresholdsSeen>>>,
}

impl Thresholds {
    /// Registers `watch.cgroups` and watches `watch.parents` before it
    /// returns: nothing after the call is missed but what appears and
    /// crosses before its registration (then found late).
    pub(crate) fn start(watch: Watch) -> anyhow::Result<Thresholds> {
        let mut waiter = Waiter::new(watch.usage_threshold).context("epoll/inotify")?;
        for parent in &watch.parents {
            waiter
                .watch_parent(parent)
                .with_context(|| format!("inotify on {}", parent.display()))?;
        }
        for cgroup in &watch.cgroups {
            waiter
                .register(cgroup)
                .with_context(|| format!("register on {}", cgroup.display()))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = thread::spawn(move || waiter.run(&st));
        Ok(Thresholds {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn finish(mut self) -> anyhow::Result<ThresholdsSeen> {
        Ok(stop_and_join(&self.stop, &mut self.thread)?.unwrap_or_default())
    }
}

impl Drop for Thresholds {
    fn drop(&mut self) {
        let _ = stop_and_join(&self.stop, &mut self.thread);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Usage,
    Oom,
}

struct Registration {
    cgroup: PathBuf,
    kind: Kind,
    eventfd: OwnedFd,
}

/// The epoll data of the inotify descriptor (registrations are indices).
const INOTIFY: u64 = u64::MAX;

/// The thread's state: one epoll over the inotify descriptor and every
/// registration's eventfd.
struct Waiter {
    epoll: OwnedFd,
    inotify: OwnedFd,
    parents: HashMap<i32, PathBuf>,
    registrations: Vec<Registration>,
    usage_threshold: Option<u64>,
    seen: ThresholdsSeen,
}

/// `result` of a libc call that returns a descriptor (or -1).
fn owned(result: RawFd) -> io::Result<OwnedFd> {
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned by the kernel, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(result) })
}

impl Waiter {
    fn new(usage_threshold: Option<u64>) -> io::Result<Waiter> {
        // SAFETY: plain system calls with flags only.
        let epoll = owned(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        let inotify = owned(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        let waiter = Waiter {
            epoll,
            inotify,
            parents: HashMap::new(),
            registrations: Vec::new(),
            usage_threshold,
            seen: ThresholdsSeen::default(),
        };
        waiter.add(waiter.inotify.as_raw_fd(), INOTIFY)?;
        Ok(waiter)
    }

    /// Adds `fd` to the epoll set, readable, with `data`.
    fn add(&self, fd: RawFd, data: u64) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: data,
        };
        // SAFETY: valid descriptors and a valid event for EPOLL_CTL_ADD.
        let r =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn watch_parent(&mut self, parent: &Path) -> io::Result<()> {
        let path = CString::new(parent.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        // SAFETY: a valid inotify descriptor and NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                self.inotify.as_raw_fd(),
                path.as_ptr(),
                libc::IN_CREATE | libc::IN_ONLYDIR,
            )
        };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        self.parents.insert(wd, parent.to_path_buf());
        Ok(())
    }

    /// Registers the OOM notification (and the usage threshold, if any) on
    /// `cgroup`, then reads the files once: an event already past is
    /// recorded as late, as a watcher that came late would see it.
    fn register(&mut self, cgroup: &Path) -> io::Result<()> {
        self.register_one(cgroup, Kind::Oom, "memory.oom_control", None)?;
        let oom = std::fs::read_to_string(cgroup.join("memory.oom_control"))?;
        let past = oom
            .lines()
            .any(|l| l == "under_oom 1" || l.strip_prefix("oom_kill ").is_some_and(|n| n != "0"));
        if past {
            self.late(cgroup, Kind::Oom);
        }
        if let Some(threshold) = self.usage_threshold {
            self.register_one(
                cgroup,
                Kind::Usage,
                "memory.usage_in_bytes",
                Some(threshold),
            )?;
            let usage = std::fs::read_to_string(cgroup.join("memory.usage_in_bytes"))?;
            if usage.trim().parse::<u64>().is_ok_and(|u| u > threshold) {
                self.late(cgroup, Kind::Usage);
            }
        }
        Ok(())
    }

    /// `<eventfd> <fd of file> [threshold]` into `cgroup.event_control`.
    fn register_one(
        &mut self,
        cgroup: &Path,
        kind: Kind,
        file: &str,
        threshold: Option<u64>,
    ) -> io::Result<()> {
        // SAFETY: eventfd with flags only.
        let eventfd = owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // The kernel holds the file only while it registers: it may close after.
        let target = File::open(cgroup.join(file))?;
        let mut line = format!("{} {}", eventfd.as_raw_fd(), target.as_raw_fd());
        if let Some(t) = threshold {
            line += &format!(" {t}");
        }
        std::fs::write(cgroup.join("cgroup.event_control"), line)?;
        self.add(eventfd.as_raw_fd(), self.registrations.len() as u64)?;
        self.registrations.push(Registration {
            cgroup: cgroup.to_path_buf(),
            kind,
            eventfd,
        });
        Ok(())
    }

    fn late(&mut self, cgroup: &Path, kind: Kind) {
        let wake = Wake {
            first: SystemTime::now(),
            count: 0,
            times: Vec::new(),
            late: true,
        };
        let notified = self.seen.cgroups.entry(cgroup.to_path_buf()).or_default();
        let slot = match kind {
            Kind::Usage => &mut notified.usage,
            Kind::Oom => &mut notified.oom,
        };
        slot.get_or_insert(wake);
    }

    /// Waits on the epoll set until `stop`; stamps each wake-up.
    fn run(mut self, stop: &AtomicBool) -> io::Result<ThresholdsSeen> {
        const EVENTS: usize = 64;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: `events` holds EVENTS entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    EVENTS as i32,
                    TICK_MS,
                )
            };
            let at = SystemTime::now();
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for event in &events[..n as usize] {
                match event.u64 {
                    INOTIFY => self.new_cgroups()?,
                    i => self.notified(i as usize, at)?,
                }
            }
        }
        Ok(self.seen)
    }

    /// Reads the eventfd of registration `i` (its counter: notifications
    /// since the last read) and records them.
    fn notified(&mut self, i: usize, at: SystemTime) -> io::Result<()> {
        let Some(reg) = self.registrations.get(i) else {
            return Ok(());
        };
        let mut counter = [0u8; 8];
        // SAFETY: reads 8 bytes into an 8-byte buffer.
        let n = unsafe { libc::read(reg.eventfd.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
        if n != 8 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
                _ => Err(e),
            };
        }
        let count = u64::from_ne_bytes(counter);
        let notified = self.seen.cgroups.entry(reg.cgroup.clone()).or_default();
        let slot = match reg.kind {
            Kind::Usage => &mut notified.usage,
            Kind::Oom => &mut notified.oom,
        };
        let wake = slot.get_or_insert(Wake {
            first: at,
            count: 0,
            times: Vec::new(),
            late: false,
        });
        wake.count += count;
        wake.times.push(at);
        Ok(())
    }

    /// Registers each directory made under a watched parent since the last
    /// read; one removed before it could be is counted as failed.
    fn new_cgroups(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 4096];
        // Bounded: the queue holds a finite number of events; WouldBlock ends it.
        loop {
            // SAFETY: reads into a buffer of its stated length.
            let n =
                unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n == 0 {
                return Ok(());
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
                    _ => Err(e),
                };
            }
            for (wd, name) in inotify_names(&buf[..n as usize]) {
                let Some(parent) = self.parents.get(&wd) else {
                    continue;
                };
                let cgroup = parent.join(name);
                if self.register(&cgroup).is_err() {
                    self.seen.failed += 1;
                }
            }
        }
    }
}

/// The (watch, name) of each `inotify_event` in `buf` that names a
/// directory created.
fn inotify_names(buf: &[u8]) -> Vec<(i32, String)> {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let word = |at: usize| u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    let mut names = Vec::new();
    let mut at = 0;
    while at + HEADER <= buf.len() {
        let wd = word(at) as i32;
        let mask = word(at + 4);
        let len = word(at + 12) as usize;
        let name = &buf[(at + HEADER).min(buf.len())..(at + HEADER + len).min(buf.len())];
        let name = name.split(|b| *b == 0).next().unwrap_or_default();
        if mask & libc::IN_CREATE != 0 && mask & libc::IN_ISDIR != 0 && !name.is_empty() {
            names.push((wd, String::from_utf8_lossy(name).into_owned()));
        }
        at += HEADER + len;
    }
    names
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

    #[test]
    fn inotify_events() {
        let mut buf = Vec::new();
        for (wd, mask, name) in [
            (1i32, libc::IN_CREATE | libc::IN_ISDIR, "cg-1"),
            (1, libc::IN_CREATE, "a-file"),
            (2, libc::IN_CREATE | libc::IN_ISDIR, "cg-2"),
        ] {
            let mut padded = name.as_bytes().to_vec();
            padded.resize(16, 0);
            buf.extend(wd.to_ne_bytes());
            buf.extend(mask.to_ne_bytes());
            buf.extend(0u32.to_ne_bytes());
            buf.extend(16u32.to_ne_bytes());
            buf.extend(padded);
        }
        assert_eq!(
            inotify_names(&buf),
            vec![(1, "cg-1".to_string()), (2, "cg-2".to_string())]
        );
    }
}
