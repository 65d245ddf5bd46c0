//! `cargo xtask bench tasks`: what one more task costs, and what the idle
//! agent costs, as the number of live tasks grows (10, 100, 1,000, 5,000;
//! half registered by cgroup, half by pid).
//!
//! Two workers (memory cgroups of their own) share the tasks: a worker runs
//! at most 4,096. A cgroup task is an empty memory cgroup under its worker;
//! a pid task is a `sleep` process. At each level, [`PROBES`] more tasks
//! are registered one at a time over the agent's local socket, as root
//! (`POST /v1/tasks`, the answer
//! read: the task is admitted and its `task_started` stored) and ended
//! again, alternately by cgroup and by pid; then, with nothing changing,
//! the agent's CPU is read over [`WINDOW`]. Release build, default
//! settings, eBPF source.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use memwatch_test_support::{
    http::{status_code, unix_request},
    stats::quantile,
};

use super::{
    idle::{clock_ticks, cpu_ticks, status_kib},
    release_bins, start_agent,
};

const LEVELS: [usize; 4] = [10, 100, 1_000, 5_000];
/// Registrations timed at each level.
const PROBES: usize = 100;
/// Time left to the agent after a level is reached (a few sampling ticks).
const SETTLE: Duration = Duration::from_secs(3);
/// Idle CPU is measured over this window.
const WINDOW: Duration = Duration::from_secs(20);
/// Reaching the levels may take this long; past it the run stops and
/// prints the levels reached (the cost per registration is the finding).
const FILL_LIMIT: Duration = Duration::from_secs(300);
const PARENT: &str = "/sys/fs/cgroup/memory/memwatch-bench-tasks";
const WORKERS: [&str; 2] = ["w0", "w1"];

/// The cgroups and processes the tasks are: removed and killed on drop,
/// also on error.
struct Workload {
    parent: PathBuf,
    cgroups: Vec<PathBuf>,
    sleepers: Vec<Child>,
}

impl Workload {
    fn new() -> anyhow::Result<Workload> {
        let parent = PathBuf::from(PARENT);
        let mut workload = Workload {
            parent: parent.clone(),
            cgroups: Vec::new(),
            sleepers: Vec::new(),
        };
        for worker in WORKERS {
            workload.mkdir(parent.join(worker))?;
        }
        Ok(workload)
    }

    fn mkdir(&mut self, dir: PathBuf) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        self.cgroups.push(dir.clone());
        Ok(dir)
    }

    /// The body of a new task's registration: task `i` of its kind.
    fn task(&mut self, id: &str, i: usize, by_pid: bool) -> anyhow::Result<String> {
        let worker = WORKERS[i % WORKERS.len()];
        let source = if by_pid {
            let child = Command::new("sleep")
                .arg("86400")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("spawn sleep")?;
            let pid = child.id();
            self.sleepers.push(child);
            format!("\"pid\": {pid}")
        } else {
            let dir = self.mkdir(self.parent.join(worker).join(id))?;
            format!("\"cgroup\": \"{}\"", dir.display())
        };
        Ok(format!(
            "{{\"task_id\": \"{id}\", \"worker\": \"{worker}\", {source}}}"
        ))
    }
}

impl Workload {
    /// Kills the last sleeper, or removes the last cgroup: a probe's, once
    /// its task ended, so that the live count stays the level's.
    fn remove_last(&mut self, by_pid: bool) {
        if by_pid {
            if let Some(mut child) = self.sleepers.pop() {
                let _ = child.kill();
                let _ = child.wait();
            }
        } else if let Some(dir) = self.cgroups.pop() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        for child in &mut self.sleepers {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Innermost first: task cgroups, then the workers, then the parent.
        for dir in self.cgroups.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
        let _ = std::fs::remove_dir(&self.parent);
    }
}

fn config(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("memwatch-bench-tasks.toml");
    let workers: String = WORKERS
        .iter()
        .map(|w| format!("[[worker]]\nname = \"{w}\"\ncgroup = \"{PARENT}/{w}\"\n\n"))
        .collect();
    std::fs::write(&path, workers)?;
    Ok(path)
}

/// Registers a task; its time in ms.
fn register(socket: &Path, body: &str) -> anyhow::Result<f64> {
    let start = Instant::now();
    let answer = unix_request(socket, "POST", "/v1/tasks", body)?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if status_code(&answer) != Some(201) {
        bail!("POST /v1/tasks {body}: {answer}");
    }
    Ok(ms)
}

fn end(socket: &Path, id: &str) -> anyhow::Result<()> {
    let answer = unix_request(socket, "DELETE", &format!("/v1/tasks/{id}?exit_code=0"), "")?;
    if status_code(&answer) != Some(200) {
        bail!("DELETE /v1/tasks/{id}: {answer}");
    }
    Ok(())
}

struct Row {
    tasks: usize,
    p50_ms: f64,
    p99_ms: f64,
    cpu_percent: f64,
    rss_mib: f64,
}

pub(super) fn tasks() -> anyhow::Result<()> {
    let bin = release_bins("the tasks benchmark loads the eBPF probe and makes cgroups")?
        .join("memwatch");
    let config = config(&std::env::temp_dir())?;
    let mut workload = Workload::new()?;
    let agent = start_agent(&bin, &["--config", &config.display().to_string()])?;
    let pid = agent.pid().context("the agent runs")?;
    let socket = agent.socket.clone();
    let ticks = clock_ticks();
    let started = Instant::now();
    let mut live = 0;
    let mut rows = Vec::new();
    let mut stopped = None;
    'levels: for level in LEVELS {
        while live < level {
            if started.elapsed() > FILL_LIMIT {
                stopped = Some(format!(
                    "stopped: {live} tasks registered in {FILL_LIMIT:?}, {level} not reached"
                ));
                break 'levels;
            }
            let body = workload.task(&format!("t{live}"), live, live % 2 == 1)?;
            register(&socket, &body)?;
            live += 1;
        }
        eprintln!("xtask: {live} live tasks after {:?}", started.elapsed());
        let mut times = Vec::with_capacity(PROBES);
        for probe in 0..PROBES {
            let id = format!("probe-{level}-{probe}");
            let body = workload.task(&id, probe, probe % 2 == 1)?;
            times.push(register(&socket, &body)?);
            end(&socket, &id)?;
            workload.remove_last(probe % 2 == 1);
        }
        thread::sleep(SETTLE);
        let before = cpu_ticks(pid)?;
        thread::sleep(WINDOW);
        let after = cpu_ticks(pid)?;
        let row = Row {
            tasks: level,
            p50_ms: quantile(&mut times, 0.5),
            p99_ms: quantile(&mut times, 0.99),
            cpu_percent: (after - before) as f64 / ticks / WINDOW.as_secs_f64() * 100.0,
            rss_mib: status_kib(pid, "VmRSS:")? as f64 / 1024.0,
        };
        eprintln!(
            "xtask: {level} tasks: registration p50 {:.2} ms, p99 {:.2} ms; idle {:.2}% of a core",
            row.p50_ms, row.p99_ms, row.cpu_percent
        );
        rows.push(row);
    }
    drop(agent);
    drop(workload);
    println!(
        "\nTasks (half by cgroup, half by pid; 2 workers): {PROBES} registrations over HTTP timed at each level; idle CPU over {WINDOW:?} after {SETTLE:?}\n"
    );
    println!(
        "| live tasks | registration p50 ms | registration p99 ms | idle CPU % of one core | RSS MiB |"
    );
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.1} |",
            r.tasks, r.p50_ms, r.p99_ms, r.cpu_percent, r.rss_mib
        );
    }
    if let Some(stopped) = stopped {
        println!("\n{stopped}");
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        println!(
            "\np99 at {} / at {} tasks: {:.2}; idle CPU at {} / at {}: {:.2}",
            last.tasks,
            first.tasks,
            last.p99_ms / first.p99_ms,
            last.tasks,
            first.tasks,
            last.cpu_percent / first.cpu_percent.max(0.01)
        );
    }
    Ok(())
}
