//! Child processes: bounded waits, and commands run inside a cgroup.

use std::{
    io,
    path::Path,
    process::{Child, ExitStatus},
    thread,
    time::{Duration, Instant},
};

/// Waits at most `limit` for `child` to exit: its status, or `None` when
/// it still runs then (it is left running: kill it, or wait again).
pub fn wait_timeout(child: &mut Child, limit: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// A `sh -c` line that moves the shell into the cgroup at `dir`, then
/// execs `cmd`: the pid the caller sees is `cmd`'s.
pub fn cgroup_exec_line(dir: &Path, cmd: &str) -> String {
    format!("echo $$ > {}/cgroup.procs && exec {cmd}", dir.display())
}
