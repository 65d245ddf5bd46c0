//! An OOM storm, shared by `cargo xtask bench storm` and the CI test
//! `tests/chaos/storm.rs`: worker threads each own a few small memory
//! cgroups and fork, one after another and round their cgroups, a hog that
//! moves itself into the cgroup and wants more than its limit: the kernel
//! kills it at once. (A fork without exec: an exec'd memhog cost 13.3 ms of
//! CPU per kill against 9.3 ms, and could not reach 5,000 kills a minute on
//! 2 busy cores.) The truth is what the storm itself caused: the pid of
//! every child, the cgroup it was put in, and which died of SIGKILL.

use std::{
    ffi::{CStr, CString},
    io,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

/// The hogs' process name (the `comm` of their `oom_kill` events).
pub const HOG_COMM: &CStr = c"stormhog";

/// One child the storm started.
pub struct Child {
    pub pid: u32,
    pub cgroup: PathBuf,
    /// Died of SIGKILL: the OOM killer's (the storm sends no signals).
    pub killed: bool,
}

/// How fast and how long.
#[derive(Clone, Copy)]
pub struct Pace {
    /// Kills a minute all workers together are paced to.
    pub per_minute: u32,
    /// How many workers share that rate.
    pub workers: usize,
    pub duration: Duration,
    /// What each hog wants (more than its cgroup's limit).
    pub hog_mib: u64,
}

/// Starts hogs one after another round `dirs` (memory cgroups), paced to
/// this worker's share of the rate, until `pace.duration` has passed since
/// `started` or `stop` is set. Bounded: each child ends by itself.
pub fn worker(
    dirs: &[PathBuf],
    started: Instant,
    pace: Pace,
    stop: &AtomicBool,
) -> io::Result<Vec<Child>> {
    let period = Duration::from_secs(60) * pace.workers as u32 / pace.per_minute.max(1);
    let procs: Vec<CString> = dirs
        .iter()
        .map(|d| CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()))
        .collect::<Result<_, _>>()
        .map_err(io::Error::other)?;
    let mut children = Vec::new();
    let mut next = started;
    for n in 0.. {
        let now = Instant::now();
        if now >= started + pace.duration || stop.load(Ordering::Relaxed) {
            break;
        }
        if next > now {
            thread::sleep(next - now);
        }
        next += period;
        let slot = n % dirs.len();
        let pid = hog(&procs[slot], pace.hog_mib)?;
        let mut status = 0;
        // Bounded by the child itself: it exits once it has touched its
        // memory, if the kernel has not killed it before.
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            return Err(io::Error::last_os_error());
        }
        let killed = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL;
        children.push(Child {
            pid: pid as u32,
            cgroup: dirs[slot].clone(),
            killed,
        });
    }
    Ok(children)
}

/// Forks a hog: the child moves itself into the cgroup of `procs` (its
/// `cgroup.procs`), names itself [`HOG_COMM`], and touches `mib` MiB of
/// fresh anonymous memory, a page at a time, then exits. No exec: a kill
/// costs the kernel's OOM path and the faults, little more.
fn hog(procs: &CStr, mib: u64) -> io::Result<libc::pid_t> {
    let bytes = mib << 20;
    // SAFETY: after fork the child (a copy of one thread of a multi-threaded
    // process) makes only async-signal-safe system calls on memory prepared
    // before the fork, writes to its own fresh mapping, and _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(pid);
    }
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        // "0" is the writing process itself.
        if fd < 0 || libc::write(fd, c"0".as_ptr().cast(), 1) != 1 {
            libc::_exit(2);
        }
        libc::close(fd);
        libc::prctl(libc::PR_SET_NAME, HOG_COMM.as_ptr());
        let memory = libc::mmap(
            std::ptr::null_mut(),
            bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if memory == libc::MAP_FAILED {
            libc::_exit(3);
        }
        let memory = memory.cast::<u8>();
        for offset in (0..bytes as usize).step_by(4096) {
            std::ptr::write_volatile(memory.add(offset), 1);
        }
        libc::_exit(0);
    }
}
