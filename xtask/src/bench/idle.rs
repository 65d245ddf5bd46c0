//! `cargo xtask bench idle`: the idle agent's CPU and RSS with 100, 1,000
//! and 10,000 live memory cgroups (v1 hierarchy), made before it starts and
//! removed after.
//!
//! With `--baseline <rev>` the agent built from that commit is measured
//! beside this tree's on the same cgroups, interleaved (this tree, the
//! baseline, the baseline, this tree: the mean of two windows each),
//! and the table gets each figure for both builds and their ratio. The
//! agent's full walk of every cgroup's OOM counter runs at start and exit
//! (and every few minutes on a kernel without the host-wide OOM count), so
//! the window holds none: the table gives that walk's CPU (timed here, the
//! same reads) and its share amortized over that interval.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{baseline::Baseline, builds, compare::Figure, release_bins, start_agent};

const COUNTS: [usize; 3] = [100, 1_000, 10_000];
/// Time left to the agent after start (its first walk of the hierarchy).
const SETTLE: Duration = Duration::from_secs(3);
/// Idle CPU is measured over this window.
const WINDOW: Duration = Duration::from_secs(30);

/// Removes the cgroups made, also on error.
struct Cgroups(PathBuf, usize);

impl Drop for Cgroups {
    fn drop(&mut self) {
        for i in 0..self.1 {
            let _ = std::fs::remove_dir(self.0.join(format!("c{i}")));
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// How often the agent would walk every memory cgroup's OOM counter on a
/// kernel without the host-wide count (agent/src/daemon/mod.rs
/// `OOM_RESCAN_INTERVAL`; with it, the walk runs at start and exit and
/// when a kill went unreported): its cost is amortized over it.
const RESCAN_INTERVAL: Duration = Duration::from_secs(300);

/// Windows measured per build and cgroup count, in this order of builds
/// (0: this tree, 1: the baseline): each build is measured first once.
const ORDER: [usize; 4] = [0, 1, 1, 0];

pub(super) fn idle(baseline: Option<&Baseline>) -> anyhow::Result<Vec<Figure>> {
    let release = release_bins("the idle benchmark loads the eBPF probe and makes cgroups")?;
    let agents = builds(&release, baseline)?;
    let ticks = clock_ticks();
    // (count, per agent (cpu %, rss MiB), one full walk's CPU ms)
    let mut rows = Vec::new();
    for count in COUNTS {
        let parent = Path::new("/sys/fs/cgroup/memory").join("memwatch-bench-idle");
        let made = Instant::now();
        std::fs::create_dir_all(&parent)?;
        let cgroups = Cgroups(parent.clone(), count);
        for i in 0..count {
            std::fs::create_dir(parent.join(format!("c{i}"))).context("mkdir a cgroup")?;
        }
        eprintln!("xtask: {count} cgroups made in {:?}", made.elapsed());
        let mut windows: Vec<Vec<(f64, f64)>> = vec![Vec::new(); agents.len()];
        for &which in ORDER.iter().filter(|&&i| i < agents.len()) {
            let (name, bin) = &agents[which];
            let measured = measure(bin, ticks)?;
            eprintln!(
                "xtask: {count} cgroups, {name}: {:.3}% of a core, {:.1} MiB",
                measured.0, measured.1
            );
            windows[which].push(measured);
        }
        let measured = windows.iter().map(|w| mean_of(w)).collect();
        let walk_ms = full_walk_cpu_ms()?;
        drop(cgroups);
        rows.push((count, measured, walk_ms));
    }
    print_table(&agents, &rows);
    Ok(figures(&rows))
}

/// Each count's CPU and RSS, per build.
fn figures(rows: &[IdleRow]) -> Vec<Figure> {
    let mut out = Vec::new();
    for (count, measured, _) in rows {
        let cpu: Vec<f64> = measured.iter().map(|m| m.0).collect();
        let rss: Vec<f64> = measured.iter().map(|m| m.1).collect();
        out.push(Figure::new(
            "idle",
            format!("{count} cgroups: CPU % of a core"),
            &cpu,
        ));
        out.push(Figure::new(
            "idle",
            format!("{count} cgroups: RSS MiB"),
            &rss,
        ));
    }
    out
}

/// One agent started, left to settle, its CPU over [`WINDOW`] (% of a
/// core) and its RSS at the end (MiB).
///
/// The CPU is the run time the scheduler counted for each of the agent's
/// threads (`/proc/<pid>/task/*/schedstat`, nanoseconds), summed: idle, the
/// agent runs 1 to 5 clock ticks (10 ms each) in a window, so `utime +
/// stime` would be mostly rounding. When a thread started or ended in the
/// window its run time is not all in the sums: then the clock ticks count.
fn measure(bin: &Path, ticks: f64) -> anyhow::Result<(f64, f64)> {
    let agent = start_agent(bin, &[])?;
    let pid = agent.pid().context("the agent runs")?;
    thread::sleep(SETTLE);
    let before = CpuSnapshot::of(pid)?;
    thread::sleep(WINDOW);
    let cpu = CpuSnapshot::of(pid)?.percent_since(&before, WINDOW, ticks);
    let rss_kib = status_kib(pid, "VmRSS:")?;
    drop(agent);
    Ok((cpu, rss_kib as f64 / 1024.0))
}

/// A process's CPU so far: clock ticks and each thread's run time.
pub(super) struct CpuSnapshot {
    ticks: u64,
    threads: std::collections::BTreeMap<u64, u64>,
}

impl CpuSnapshot {
    pub(super) fn of(pid: u32) -> anyhow::Result<CpuSnapshot> {
        Ok(CpuSnapshot {
            ticks: cpu_ticks(pid)?,
            threads: thread_run_ns(pid)?,
        })
    }

    /// % of one core since `before`, over `window`: from the threads' run
    /// time when they are the same threads, else from the clock ticks.
    pub(super) fn percent_since(&self, before: &CpuSnapshot, window: Duration, ticks: f64) -> f64 {
        let window = window.as_secs_f64();
        match run_ns_between(&before.threads, &self.threads) {
            Some(ns) => ns as f64 / 1e9 / window * 100.0,
            None => {
                eprintln!("xtask: the agent's threads changed in the window: clock ticks");
                self.ticks.saturating_sub(before.ticks) as f64 / ticks / window * 100.0
            }
        }
    }
}

/// Each thread of `pid` and the nanoseconds it has run (the first field
/// of its `schedstat`).
fn thread_run_ns(pid: u32) -> anyhow::Result<std::collections::BTreeMap<u64, u64>> {
    let mut threads = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let entry = entry?;
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = text.split_whitespace().next().and_then(|n| n.parse().ok()) {
            threads.insert(tid, ns);
        }
    }
    Ok(threads)
}

/// The run time between two [`thread_run_ns`] snapshots of one process;
/// `None` when its threads are not the same at both ends.
fn run_ns_between(
    before: &std::collections::BTreeMap<u64, u64>,
    after: &std::collections::BTreeMap<u64, u64>,
) -> Option<u64> {
    if before.keys().ne(after.keys()) {
        return None;
    }
    Some(
        before
            .iter()
            .map(|(tid, ns)| after[tid].saturating_sub(*ns))
            .sum(),
    )
}

/// Each figure's mean over the windows.
fn mean_of(windows: &[(f64, f64)]) -> (f64, f64) {
    let n = windows.len().max(1) as f64;
    let (cpu, rss) = windows
        .iter()
        .fold((0.0, 0.0), |(c, r), (wc, wr)| (c + wc, r + wr));
    (cpu / n, rss / n)
}

type IdleRow = (usize, Vec<(f64, f64)>, f64);

fn print_table(agents: &[(String, PathBuf)], rows: &[IdleRow]) {
    println!(
        "\nIdle agent (default config, eBPF source), CPU over a {WINDOW:?} window after {SETTLE:?} settle\n"
    );
    let base = agents.len() == 2;
    print!("| live memory cgroups |");
    for (name, _) in agents {
        print!(" {name}: CPU % of one core | {name}: RSS MiB |");
    }
    if base {
        print!(" CPU ratio | RSS ratio |");
    }
    println!(
        " one full OOM-counter walk, CPU ms | amortized over {RESCAN_INTERVAL:?} (kernels without vmstat oom_kill), % |"
    );
    println!(
        "|---{}|---|---|",
        "|---|---".repeat(agents.len()) + if base { "|---|---" } else { "" }
    );
    for (count, measured, walk_ms) in rows {
        print!("| {count} |");
        for (cpu, rss) in measured {
            print!(" {cpu:.3} | {rss:.1} |");
        }
        if let [(now, now_rss), (base, base_rss)] = measured[..] {
            print!(" {:.2} | {:.2} |", now / base, now_rss / base_rss);
        }
        println!(
            " {walk_ms:.0} | {:.3} |",
            walk_ms / RESCAN_INTERVAL.as_millis() as f64 * 100.0
        );
    }
}

/// The CPU time of one walk like the agent's full OOM-counter rescan
/// (reconcile.rs): every memory cgroup's directory listed and its
/// `memory.oom_control` read. Measured in this process, on this thread.
fn full_walk_cpu_ms() -> anyhow::Result<f64> {
    let cpu = || {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer for clock_gettime.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
    };
    let start = cpu();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup/memory")];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        seen += 1;
        if seen > 1_000_000 {
            break;
        }
        let _ = std::fs::read_to_string(dir.join("memory.oom_control"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    Ok(cpu() - start)
}

pub(super) fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// utime + stime of `pid`, in clock ticks.
pub(super) fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after ") ".
    let rest = stat.rsplit_once(") ").context("/proc/pid/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in KiB.
pub(super) fn status_kib(pid: u32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{key} of {pid}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn run_time_is_summed_over_the_same_threads_only() {
        let before = BTreeMap::from([(1, 100), (2, 1_000)]);
        let after = BTreeMap::from([(1, 350), (2, 1_250)]);
        assert_eq!(run_ns_between(&before, &after), Some(500));
        let one_more = BTreeMap::from([(1, 350), (2, 1_250), (3, 10)]);
        assert_eq!(run_ns_between(&before, &one_more), None);
        let mine = thread_run_ns(std::process::id()).unwrap();
        assert!(!mine.is_empty(), "this process has a thread");
    }
}
