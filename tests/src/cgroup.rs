//! Memory cgroups made by a test, removed whatever happens (on drop, also
//! after a failed assertion): the agent's own [`OwnedCgroup`] with a name.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use memwatch::{MemoryHierarchy, OwnedCgroup};
use memwatch_test_support::process::cgroup_exec_line;

use crate::process::Guarded;

pub struct TestCgroup {
    inner: OwnedCgroup,
}

impl TestCgroup {
    /// Creates `<memory hierarchy>/memwatch-test-<pid>-<name>`.
    pub fn create(name: &str) -> TestCgroup {
        let hierarchy = MemoryHierarchy::discover().expect("a memory cgroup hierarchy");
        let path = hierarchy
            .root
            .join(format!("memwatch-test-{}-{name}", std::process::id()));
        if path.exists() {
            memwatch::kill_and_remove(&path).expect("remove a stale test cgroup");
        }
        let inner = OwnedCgroup::create(path).expect("create the test cgroup");
        TestCgroup { inner }
    }

    /// Creates `name` inside this cgroup (its memory controller enabled
    /// where v2 needs it); drop it before this one.
    pub fn child(&self, name: &str) -> TestCgroup {
        let inner =
            OwnedCgroup::create(self.path().join(name)).expect("create a child test cgroup");
        TestCgroup { inner }
    }

    pub fn path(&self) -> &Path {
        self.inner.path()
    }

    pub fn path_str(&self) -> &str {
        self.path().to_str().expect("UTF-8 cgroup path")
    }

    /// Sets the kernel's hard memory limit (no swap beyond it).
    pub fn limit(&self, bytes: u64) {
        self.inner
            .set_hard_limit(bytes)
            .expect("set the memory limit");
    }

    /// A shell line that moves itself into this cgroup and then execs `cmd`,
    /// so the pid the caller sees is the pid of `cmd`.
    pub fn exec_line(&self, cmd: &str) -> String {
        cgroup_exec_line(self.path(), cmd)
    }

    /// OOM kills the kernel counted in it (`oom_kill` of memory.oom_control
    /// on v1, memory.events on v2).
    pub fn oom_kills(&self) -> u64 {
        self.inner.oom_kills().unwrap_or(0)
    }

    /// The cgroup's memory usage as the kernel counts it.
    pub fn usage(&self) -> u64 {
        memwatch::working_set(self.path()).unwrap_or(0)
    }

    /// Starts `memhog MIB 120` inside and waits until the cgroup holds at
    /// least `MIB - 10` MiB (bounded); memhog is killed on drop.
    pub fn hog(&self, mib: u64) -> Guarded {
        const MIB: u64 = 1 << 20;
        let child = crate::memhog_in(self.path(), mib, 120)
            .spawn()
            .expect("spawn memhog");
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.usage() < (mib - 10) * MIB {
            assert!(
                Instant::now() < deadline,
                "memhog did not reach {mib} MiB: {}",
                self.usage()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Guarded(child)
    }

    /// SIGKILLs every process in it (the cgroup stays).
    pub fn kill_all(&self) {
        let procs = fs::read_to_string(self.inner.procs_file()).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) with a pid the kernel listed in this cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
