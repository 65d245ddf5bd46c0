//! Memory cgroups made by a test, removed whatever happens (on drop, also
//! after a failed assertion).

use std::{
    fs, io,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use memwatch::cgroup::MemoryHierarchy;

pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// Creates `<memory hierarchy>/memwatch-test-<pid>-<name>`.
    pub fn create(name: &str) -> TestCgroup {
        let hierarchy = MemoryHierarchy::discover().expect("a memory cgroup hierarchy");
        let path = hierarchy
            .root
            .join(format!("memwatch-test-{}-{name}", std::process::id()));
        if path.exists() {
            remove(&path);
        }
        fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TestCgroup { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a control file, e.g. `memory.limit_in_bytes`.
    pub fn set(&self, file: &str, value: &str) {
        fs::write(self.path.join(file), value)
            .unwrap_or_else(|e| panic!("write {value} to {}/{file}: {e}", self.path.display()));
    }

    /// Sets the hard memory limit (v1 `memory.limit_in_bytes`, and the
    /// memory+swap limit where it exists, so the victim cannot swap; v2 `memory.max`).
    pub fn limit(&self, bytes: u64) {
        let v1 = self.path.join("memory.limit_in_bytes");
        if v1.exists() {
            self.set("memory.limit_in_bytes", &bytes.to_string());
            if self.path.join("memory.memsw.limit_in_bytes").exists() {
                self.set("memory.memsw.limit_in_bytes", &bytes.to_string());
            }
        } else {
            self.set("memory.max", &bytes.to_string());
            let _ = fs::write(self.path.join("memory.swap.max"), "0");
        }
    }

    /// A shell line that moves itself into this cgroup and then execs `cmd`,
    /// so the pid the caller sees is the pid of `cmd`.
    pub fn exec_line(&self, cmd: &str) -> String {
        format!(
            "echo $$ > {}/cgroup.procs && exec {cmd}",
            self.path.display()
        )
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        remove(&self.path);
    }
}

/// Kills everything in the cgroup, then removes it (bounded: 5 s).
fn remove(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) with a pid read from the cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        match fs::remove_dir(path) {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() > deadline => {
                eprintln!(
                    "warning: could not remove test cgroup {}: {e}",
                    path.display()
                );
                return;
            }
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}
