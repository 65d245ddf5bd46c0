//! The cgroup v1 thresholds rival: kernel-notified eventfds on
//! `memory.usage_in_bytes` and `memory.oom_control` (see the module above).

use std::{
    collections::{BTreeMap, HashMap},
    ffi::CString,
    fs::File,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::SystemTime,
};

use anyhow::Context as _;

use super::{TICK_MS, Thread};

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
pub(crate) struct Thresholds(Thread<ThresholdsSeen>);

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
        Ok(Thresholds(Thread::spawn(move |stop| waiter.run(stop))))
    }

    pub(crate) fn finish(mut self) -> anyhow::Result<ThresholdsSeen> {
        self.0.finish()
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
