//! `cargo xtask bench idle`: the idle agent's CPU and RSS with 100, 1,000
//! and 10,000 live memory cgroups (v1 hierarchy), made before it starts and
//! removed after.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::bench::{Agent, release_bins};

const COUNTS: [usize; 3] = [100, 1_000, 10_000];
/// Time left to the agent after start (its first walk of the hierarchy).
const SETTLE: Duration = Duration::from_secs(3);
/// Idle CPU is measured over this window.
const WINDOW: Duration = Duration::from_secs(10);

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

pub fn idle() -> anyhow::Result<()> {
    let memwatch =
        release_bins("the idle benchmark loads the eBPF probe and makes cgroups")?.join("memwatch");
    let ticks = clock_ticks();
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
        let agent = Agent::start(&memwatch, &[])?;
        thread::sleep(SETTLE);
        let before = cpu_ticks(agent.pid())?;
        thread::sleep(WINDOW);
        let after = cpu_ticks(agent.pid())?;
        let rss_kib = rss_kib(agent.pid())?;
        drop(agent);
        drop(cgroups);
        let cpu = (after - before) as f64 / ticks / WINDOW.as_secs_f64() * 100.0;
        rows.push((count, cpu, rss_kib as f64 / 1024.0));
    }
    println!(
        "\nIdle agent (default config, eBPF source), {WINDOW:?} window after {SETTLE:?} settle\n"
    );
    println!("| live memory cgroups | CPU % of one core | RSS MiB |");
    println!("|---|---|---|");
    for (count, cpu, rss) in rows {
        println!("| {count} | {cpu:.2} | {rss:.1} |");
    }
    Ok(())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after ") ".
    let rest = stat.rsplit_once(") ").context("/proc/pid/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS")
}
