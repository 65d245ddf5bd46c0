//! `cargo xtask bench storm`: an OOM storm of at least 5,000 kills a minute
//! for one minute. Every kill must reach a local webhook exactly once,
//! named with the cgroup it happened in; the agent's CPU and memory are
//! measured over the storm.
//!
//! WORKERS threads each own CGROUPS_PER_WORKER small memory cgroups (limit
//! LIMIT_MIB) and fork hogs into them (memwatch_test_support::storm, shared
//! with the CI test tests/chaos/storm.rs), paced to TARGET_PER_MINUTE
//! together, for DURATION. The truth is what the bench itself caused: the
//! pid of every child and the cgroup it was put in, which children died of
//! SIGKILL, and the cgroups' own `oom_kill` counters.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use memwatch_test_support::{
    stats::quantile,
    storm::{self, Pace},
    webhook::Receiver,
};

use super::{
    delay::{ms, oom_control_kills},
    idle::{clock_ticks, cpu_ticks, status_kib},
    release_bins, start_agent,
};

/// How long the storm lasts.
const DURATION: Duration = Duration::from_secs(60);
/// Kills a minute the workers are paced to (the target is 5,000).
const TARGET_PER_MINUTE: u32 = 6_000;
/// Concurrent workers (threads, each with one child at a time).
const WORKERS: usize = 12;
const CGROUPS_PER_WORKER: usize = 4;
/// The cgroups' hard limit, and what a hog wants (it is killed on the way).
const LIMIT_MIB: u64 = 4;
const HOG_MIB: u64 = 64;
const PACE: Pace = Pace {
    per_minute: TARGET_PER_MINUTE,
    workers: WORKERS,
    duration: DURATION,
    hog_mib: HOG_MIB,
};
/// How long the webhook may take to get the last events after the storm.
const DRAIN: Duration = Duration::from_secs(60);
const PARENT: &str = "/sys/fs/cgroup/memory/memwatch-bench-storm";

/// Removes the storm's cgroups, also on error.
struct Cgroups(Vec<PathBuf>);

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
        let _ = std::fs::remove_dir(PARENT);
    }
}

// Long: the storm's phases (setup, kills, churn, counting) share the
// receiver, agents and counters; could be split into named steps later.
pub(super) fn storm() -> anyhow::Result<()> {
    let release = release_bins("the storm benchmark loads the eBPF probe and makes cgroups")?;
    let receiver = Receiver::start();

    // Left over from an interrupted run: its cgroups would hold old counters.
    if Path::new(PARENT).exists() {
        for entry in std::fs::read_dir(PARENT)?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
    std::fs::create_dir_all(PARENT).with_context(|| format!("mkdir {PARENT}"))?;
    let mut cgroups = Cgroups(Vec::new());
    for w in 0..WORKERS {
        for c in 0..CGROUPS_PER_WORKER {
            let dir = Path::new(PARENT).join(format!("w{w}-c{c}"));
            std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
            cgroups.0.push(dir.clone());
            std::fs::write(
                dir.join("memory.limit_in_bytes"),
                (LIMIT_MIB << 20).to_string(),
            )?;
        }
    }

    let agent = start_agent(&release.join("memwatch"), &["--webhook", &receiver.url()])?;
    let agent_pid = agent.pid().context("the agent runs")?;
    let ticks = clock_ticks();
    let cpu_before = cpu_ticks(agent_pid)?;
    let children_before = children_cpu_ms();
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let stop_rss = AtomicBool::new(false);
    let (children, storm_rss_kib) = thread::scope(|scope| {
        // The agent's RSS through the storm (VmHWM also holds the probe's
        // load at start, a transient of its own).
        let stop_rss = &stop_rss;
        let rss = scope.spawn(move || {
            let mut peak = 0;
            while !stop_rss.load(Ordering::Relaxed) {
                peak = peak.max(status_kib(agent_pid, "VmRSS:").unwrap_or(0));
                thread::sleep(Duration::from_millis(250));
            }
            peak
        });
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let dirs = cgroups.0[w * CGROUPS_PER_WORKER..(w + 1) * CGROUPS_PER_WORKER].to_vec();
                let stop = &stop;
                scope.spawn(move || storm::worker(&dirs, started, PACE, stop))
            })
            .collect();
        let mut all = Vec::new();
        let mut failed = None;
        for handle in workers {
            match handle.join() {
                Ok(Ok(children)) => all.extend(children),
                Ok(Err(error)) => {
                    stop.store(true, Ordering::Relaxed);
                    failed = Some(anyhow::Error::new(error).context("a storm worker"));
                }
                Err(_) => {
                    stop.store(true, Ordering::Relaxed);
                    failed = Some(anyhow::anyhow!("a storm worker panicked"));
                }
            }
        }
        stop_rss.store(true, Ordering::Relaxed);
        let peak = rss.join().unwrap_or(0);
        match failed {
            Some(error) => Err(error),
            None => Ok((all, peak)),
        }
    })?;
    let storm_secs = started.elapsed().as_secs_f64();
    let cpu_storm = cpu_ticks(agent_pid)?;
    let children_ms = children_cpu_ms() - children_before;

    let expected: HashMap<u32, &Path> = children
        .iter()
        .filter(|c| c.killed)
        .map(|c| (c.pid, c.cgroup.as_path()))
        .collect();
    let survived = children.len() - children.iter().filter(|c| c.killed).count();
    let counters: u64 = cgroups
        .0
        .iter()
        .filter_map(|d| {
            let text = std::fs::read_to_string(d.join("memory.oom_control")).ok()?;
            oom_control_kills(&text)
        })
        .sum();

    // Wait (bounded) until every kill the bench caused has arrived.
    let drain_started = Instant::now();
    let ours = |event: &serde_json::Value| {
        event["kind"] == "oom_kill"
            && (event["pid"]
                .as_u64()
                .is_some_and(|p| expected.contains_key(&(p as u32)))
                || event["cgroup"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(PARENT)))
    };
    loop {
        let arrived: BTreeSet<u64> = receiver
            .events()
            .iter()
            .filter(|(_, e)| ours(e))
            .filter_map(|(_, e)| e["pid"].as_u64())
            .collect();
        if arrived.len() >= expected.len() || drain_started.elapsed() > DRAIN {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let drained_secs = started.elapsed().as_secs_f64();
    let cpu_after = cpu_ticks(agent_pid)?;
    let rss_kib = status_kib(agent_pid, "VmRSS:")?;
    let hwm_kib = status_kib(agent_pid, "VmHWM:")?;
    drop(agent);

    let received = receiver.events();
    let mut deliveries: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_pid: HashMap<u32, BTreeSet<String>> = HashMap::new();
    let (mut misattributed, mut foreign) = (0usize, 0usize);
    let mut delays = Vec::new();
    let (mut first, mut last) = (None::<SystemTime>, None::<SystemTime>);
    for (arrived, event) in received.iter().filter(|(_, e)| ours(e)) {
        let id = event["id"].as_str().unwrap_or_default().to_string();
        let count = deliveries.entry(id.clone()).or_default();
        *count += 1;
        if *count > 1 {
            continue; // a repeat of the same event: counted below
        }
        let pid = event["pid"].as_u64().map(|p| p as u32);
        let Some(cgroup) = pid.and_then(|p| expected.get(&p)) else {
            // In a storm cgroup but not a victim the bench knows of.
            foreign += 1;
            continue;
        };
        if event["cgroup"].as_str() != Some(&*cgroup.to_string_lossy()) {
            misattributed += 1;
        }
        by_pid
            .entry(pid.unwrap_or_default())
            .or_default()
            .insert(id);
        if let Some(stamp) = event["time"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
        {
            delays.push(ms(stamp, *arrived));
            first = Some(first.map_or(stamp, |f| f.min(stamp)));
            last = Some(last.map_or(*arrived, |l| l.max(*arrived)));
        }
    }
    let repeated_ids: usize = deliveries.values().map(|n| n - 1).sum();
    let reported_twice: usize = by_pid.values().map(|ids| ids.len() - 1).sum();
    let delivered = by_pid.len();
    let lost = expected.len() - delivered;
    let kills = expected.len();
    let per_minute = kills as f64 / storm_secs * 60.0;
    let cpu = |ticks_used: u64, secs: f64| ticks_used as f64 / ticks / secs * 100.0;
    let cpu_during = cpu(cpu_storm - cpu_before, storm_secs);
    let cpu_total = cpu(cpu_after - cpu_before, drained_secs);

    println!(
        "\nOOM storm: {WORKERS} workers x {CGROUPS_PER_WORKER} cgroups of {LIMIT_MIB} MiB, a forked hog of {HOG_MIB} MiB, \
         paced to {TARGET_PER_MINUTE}/min for {DURATION:?}; webhook on 127.0.0.1\n"
    );
    println!(
        "| OOM kills (children SIGKILLed) | cgroup oom_kill counters | kills/min | delivered | lost | duplicates | misattributed | not ours | p50 ms | p99 ms | agent CPU % of a core (storm / storm+drain) | agent RSS MiB (after / storm peak / life peak) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {kills} | {counters} | {per_minute:.0} | {delivered} | {lost} | {} | {misattributed} | {foreign} | {:.1} | {:.1} | {cpu_during:.1} / {cpu_total:.1} | {:.1} / {:.1} / {:.1} |",
        repeated_ids + reported_twice,
        quantile(&mut delays, 0.5),
        quantile(&mut delays, 0.99),
        rss_kib as f64 / 1024.0,
        storm_rss_kib as f64 / 1024.0,
        hwm_kib as f64 / 1024.0,
    );
    let span = match (first, last) {
        (Some(f), Some(l)) => ms(f, l) / 1e3,
        _ => f64::NAN,
    };
    println!(
        "\nCPU of the children (hogs: fork, faults, the kernel's OOM path in their context): {:.2} ms per kill, \
         {:.0} % of a core over the storm",
        children_ms / children.len().max(1) as f64,
        children_ms / 10.0 / storm_secs
    );
    println!(
        "storm {storm_secs:.1} s, first kill -> last arrival {span:.1} s, children not killed {survived}; \
         targets: >= 5000 kills/min {}, all delivered once {}, none misattributed {}, agent < 50% {}",
        yes(per_minute >= 5000.0),
        yes(lost == 0 && repeated_ids + reported_twice == 0),
        yes(misattributed == 0 && foreign == 0),
        yes(cpu_during < 50.0 && cpu_total < 50.0),
    );
    if counters != kills as u64 {
        eprintln!(
            "xtask: the cgroups counted {counters} OOM kills, the bench saw {kills} children die of SIGKILL"
        );
    }
    if lost > 0 || misattributed > 0 || foreign > 0 {
        bail!("{lost} kills lost, {misattributed} misattributed, {foreign} not the bench's");
    }
    Ok(())
}

/// User + system CPU of this process's waited-for children, in ms.
fn children_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}

fn yes(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}
