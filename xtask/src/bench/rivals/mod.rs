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

mod kmsg;
mod thresholds;

use std::{
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
};

pub(crate) use self::{
    kmsg::{Kmsg, KmsgSeen},
    thresholds::{Thresholds, ThresholdsSeen, Watch},
};

/// How long (ms) the rivals' threads wait for the kernel before they look
/// at their stop flag again.
const TICK_MS: i32 = 50;

/// A rival's thread, from its start until [`Thread::finish`] (or drop):
/// it runs until its stop flag is set, then hands over what it saw.
struct Thread<T> {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<io::Result<T>>>,
}

impl<T: Default + Send + 'static> Thread<T> {
    /// Runs `watch` on a thread of its own, with the stop flag it must
    /// look at every [`TICK_MS`].
    fn spawn(watch: impl FnOnce(&AtomicBool) -> io::Result<T> + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        Self {
            stop,
            thread: Some(thread::spawn(move || watch(&flag))),
        }
    }

    /// Stops the thread and returns what it saw (nothing when it had
    /// already been stopped).
    fn finish(&mut self) -> anyhow::Result<T> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            None => Ok(T::default()),
            Some(Ok(result)) => Ok(result?),
            Some(Err(_)) => anyhow::bail!("a rival's thread panicked"),
        }
    }
}

impl<T> Drop for Thread<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
