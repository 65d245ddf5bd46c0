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
//! the agent's CPU is read over [`IDLE_WINDOWS`] windows of [`WINDOW`]
//! (their median). Release build, default
//! settings, eBPF source.
//!
//! With `--baseline <rev>` the agent built from that commit runs beside
//! this tree's, over the same tasks: each task is registered with both
//! (which one first alternates), the timed registrations alternate, and
//! both agents' CPU is read over the same window; the table gives each
//! figure for both and their ratio.

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
    baseline::Baseline,
    builds,
    compare::Figure,
    idle::{CpuSnapshot, clock_ticks, status_kib},
    release_bins, start_agent,
};

const LEVELS: [usize; 4] = [10, 100, 1_000, 5_000];
/// Registrations timed at each level.
const PROBES: usize = 100;
/// Time left to the agent after a level is reached (a few sampling ticks).
const SETTLE: Duration = Duration::from_secs(3);
/// Idle CPU is measured over this window, [`IDLE_WINDOWS`] times in a
/// row; the figure is their median (at 100 tasks the agent idles at
/// ~0.02 % of a core, a few milliseconds a window: one window a run
/// gave ratios from 0.94 to 1.13 from one run to the next).
const WINDOW: Duration = Duration::from_secs(20);
const IDLE_WINDOWS: usize = 3;
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

/// One build's figures at one level.
struct Figures {
    p50_ms: f64,
    p99_ms: f64,
    cpu_percent: f64,
    rss_mib: f64,
}

/// One level: per build, in the order of the builds.
struct Row {
    tasks: usize,
    builds: Vec<Figures>,
}

/// The agents under test (this tree's, then the baseline's), in turn:
/// `(pid, local socket)` each.
struct Agents(Vec<(u32, std::path::PathBuf)>);

impl Agents {
    /// The agents in the order for step `i`: who goes first alternates.
    fn turn(&self, i: usize) -> impl Iterator<Item = (usize, &(u32, std::path::PathBuf))> + '_ {
        let n = self.0.len();
        (0..n).map(move |k| {
            let a = (i + k) % n;
            (a, &self.0[a])
        })
    }
}

pub(super) fn tasks(baseline: Option<&Baseline>) -> anyhow::Result<Vec<Figure>> {
    let release = release_bins("the tasks benchmark loads the eBPF probe and makes cgroups")?;
    let builds = builds(&release, baseline)?;
    let config = config(&std::env::temp_dir())?;
    let config = config.display().to_string();
    let mut workload = Workload::new()?;
    let running = builds
        .iter()
        .map(|(_, bin)| start_agent(bin, &["--config", &config]))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let agents = Agents(
        running
            .iter()
            .map(|a| Ok((a.pid().context("the agent runs")?, a.socket.clone())))
            .collect::<anyhow::Result<_>>()?,
    );
    let (rows, stopped) = levels(&agents, &mut workload)?;
    drop(running);
    drop(workload);
    print_table(&builds, &rows, stopped);
    Ok(figures(&rows))
}

/// Each level's registration p99 and idle CPU, per build.
fn figures(rows: &[Row]) -> Vec<Figure> {
    let mut out = Vec::new();
    for r in rows {
        let p99: Vec<f64> = r.builds.iter().map(|f| f.p99_ms).collect();
        let cpu: Vec<f64> = r.builds.iter().map(|f| f.cpu_percent).collect();
        let tasks = r.tasks;
        out.push(Figure::new(
            "tasks",
            format!("{tasks} tasks: registration p99 ms"),
            &p99,
        ));
        out.push(Figure::new(
            "tasks",
            format!("{tasks} tasks: idle CPU % of a core"),
            &cpu,
        ));
    }
    out
}

/// Fills every level and measures it; the rows, and why it stopped early.
fn levels(agents: &Agents, workload: &mut Workload) -> anyhow::Result<(Vec<Row>, Option<String>)> {
    let ticks = clock_ticks();
    let started = Instant::now();
    let mut live = 0;
    let mut rows = Vec::new();
    for level in LEVELS {
        while live < level {
            if started.elapsed() > FILL_LIMIT {
                let stopped = format!(
                    "stopped: {live} tasks registered in {FILL_LIMIT:?}, {level} not reached"
                );
                return Ok((rows, Some(stopped)));
            }
            let body = workload.task(&format!("t{live}"), live, live % 2 == 1)?;
            for (_, (_, socket)) in agents.turn(live) {
                register(socket, &body)?;
            }
            live += 1;
        }
        eprintln!("xtask: {live} live tasks after {:?}", started.elapsed());
        let mut times = vec![Vec::with_capacity(PROBES); agents.0.len()];
        for probe in 0..PROBES {
            let id = format!("probe-{level}-{probe}");
            let body = workload.task(&id, probe, probe % 2 == 1)?;
            for (a, (_, socket)) in agents.turn(probe) {
                times[a].push(register(socket, &body)?);
                end(socket, &id)?;
            }
            workload.remove_last(probe % 2 == 1);
        }
        thread::sleep(SETTLE);
        let mut cpu = vec![Vec::with_capacity(IDLE_WINDOWS); agents.0.len()];
        for w in 0..IDLE_WINDOWS {
            let before = agents
                .0
                .iter()
                .map(|(pid, _)| CpuSnapshot::of(*pid))
                .collect::<anyhow::Result<Vec<_>>>()?;
            thread::sleep(WINDOW);
            for ((pid, _), (before, cpu)) in agents.0.iter().zip(before.iter().zip(&mut cpu)) {
                cpu.push(CpuSnapshot::of(*pid)?.percent_since(before, WINDOW, ticks));
            }
            let this: Vec<String> = cpu.iter().map(|c| format!("{:.4}", c[w])).collect();
            eprintln!(
                "xtask: {level} tasks: idle window {w}: {} % of a core",
                this.join(" / ")
            );
        }
        let mut builds = Vec::new();
        for ((pid, _), (cpu, times)) in agents.0.iter().zip(cpu.iter_mut().zip(&mut times)) {
            builds.push(Figures {
                p50_ms: quantile(times, 0.5),
                p99_ms: quantile(times, 0.99),
                cpu_percent: quantile(cpu, 0.5),
                rss_mib: status_kib(*pid, "VmRSS:")? as f64 / 1024.0,
            });
        }
        for f in &builds {
            eprintln!(
                "xtask: {level} tasks: registration p50 {:.2} ms, p99 {:.2} ms; idle {:.3}% of a core; {:.1} MiB",
                f.p50_ms, f.p99_ms, f.cpu_percent, f.rss_mib
            );
        }
        rows.push(Row {
            tasks: level,
            builds,
        });
    }
    Ok((rows, None))
}

/// A column of the table: its label, its figure, the digits printed.
type Column = (&'static str, fn(&Figures) -> f64, usize);

fn print_table(builds: &[(String, PathBuf)], rows: &[Row], stopped: Option<String>) {
    println!(
        "\nTasks (half by cgroup, half by pid; 2 workers): {PROBES} registrations over HTTP timed at each level; idle CPU: the median of {IDLE_WINDOWS} windows of {WINDOW:?}, after {SETTLE:?}\n"
    );
    let figures: [Column; 4] = [
        ("registration p50 ms", |f| f.p50_ms, 2),
        ("registration p99 ms", |f| f.p99_ms, 2),
        ("idle CPU % of one core", |f| f.cpu_percent, 3),
        ("RSS MiB", |f| f.rss_mib, 1),
    ];
    let two = builds.len() == 2;
    print!("| live tasks |");
    let mut columns = 1;
    for (label, _, _) in &figures {
        for (name, _) in builds {
            print!(" {name}: {label} |");
            columns += 1;
        }
        if two {
            print!(" ratio |");
            columns += 1;
        }
    }
    println!("\n|{}", "---|".repeat(columns));
    for r in rows {
        print!("| {} |", r.tasks);
        for (_, get, digits) in &figures {
            for f in &r.builds {
                print!(" {:.*} |", *digits, get(f));
            }
            if let [now, base] = &r.builds[..] {
                print!(" {:.2} |", get(now) / get(base).max(1e-9));
            }
        }
        println!();
    }
    if let Some(stopped) = stopped {
        println!("\n{stopped}");
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        for (i, (name, _)) in builds.iter().enumerate() {
            let (a, z) = (&first.builds[i], &last.builds[i]);
            println!(
                "\n{name}: p99 at {} / at {} tasks: {:.2}; idle CPU at {} / at {}: {:.2}",
                last.tasks,
                first.tasks,
                z.p99_ms / a.p99_ms,
                last.tasks,
                first.tasks,
                z.cpu_percent / a.cpu_percent.max(0.01)
            );
        }
    }
}
