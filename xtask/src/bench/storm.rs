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
//!
//! The same storm is watched by the rivals of `bench delay` (see
//! `delay::rivals`): a `/dev/kmsg` reader, whose `oom-kill:` summary line
//! (the only one that names the victim's cgroup) the kernel rate-limits,
//! so the table says how many kills it could put in their cgroup; and
//! `memory.oom_control` eventfds on every storm cgroup, whose notifications
//! per cgroup are compared with the kills there.

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
    baseline::Baseline,
    builds,
    compare::{Figure, interleaved},
    delay::{
        MEMORY, ms, oom_control_kills,
        rivals::{Kmsg, KmsgSeen, Thresholds, ThresholdsSeen, Watch},
    },
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
fn storm_once(memwatch: &Path) -> anyhow::Result<StormRun> {
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

    let agent = start_agent(memwatch, &["--webhook", &receiver.url()])?;
    let agent_pid = agent.pid().context("the agent runs")?;
    // The rivals watch from before the first kill to after the drain.
    let kmsg = Kmsg::start()?;
    let thresholds = Thresholds::start(Watch {
        cgroups: cgroups.0.clone(),
        parents: Vec::new(),
        usage_threshold: None,
    })?;
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
    let log = kmsg.finish()?;
    let notified = thresholds.finish()?;

    let received = receiver.events();
    let mut deliveries: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_pid: HashMap<u32, BTreeSet<String>> = HashMap::new();
    let (mut misattributed, mut foreign) = (0usize, 0usize);
    let mut delays = Vec::new();
    // The kernel's stamp of each kill: the rivals' reference too.
    let mut stamps: HashMap<u32, SystemTime> = HashMap::new();
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
            stamps.entry(pid.unwrap_or_default()).or_insert(stamp);
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
    print_rivals(
        Memwatch {
            delivered,
            named: delivered - misattributed,
            delays: &mut delays,
        },
        &children,
        &stamps,
        &log,
        &notified,
        &cgroups.0,
    );
    if counters != kills as u64 {
        eprintln!(
            "xtask: the cgroups counted {counters} OOM kills, the bench saw {kills} children die of SIGKILL"
        );
    }
    let figures = vec![
        ("kills/min".to_string(), per_minute),
        ("lost".to_string(), lost as f64),
        ("p50 ms".to_string(), quantile(&mut delays, 0.5)),
        ("p99 ms".to_string(), quantile(&mut delays, 0.99)),
        ("agent CPU % of a core, storm".to_string(), cpu_during),
        (
            "agent CPU % of a core, storm + drain".to_string(),
            cpu_total,
        ),
        (
            "agent RSS MiB, storm peak".to_string(),
            storm_rss_kib as f64 / 1024.0,
        ),
    ];
    let failed = (lost > 0 || misattributed > 0 || foreign > 0).then(|| {
        format!("{lost} kills lost, {misattributed} misattributed, {foreign} not the bench's")
    });
    Ok(StormRun { figures, failed })
}

/// One storm's figures for the comparison, and what went wrong.
struct StormRun {
    figures: Vec<(String, f64)>,
    failed: Option<String>,
}

/// Storms with a baseline: this tree's, then the baseline's (each is a
/// minute of kills and up to a minute of drain, so one each).
const AB_RUNS: usize = 2;

pub(super) fn storm(baseline: Option<&Baseline>) -> anyhow::Result<Vec<Figure>> {
    let release = release_bins("the storm benchmark loads the eBPF probe and makes cgroups")?;
    let builds = builds(&release, baseline)?;
    let runs = if builds.len() > 1 { AB_RUNS } else { 1 };
    let mut done: Vec<Option<StormRun>> = builds.iter().map(|_| None).collect();
    for b in interleaved(runs, builds.len()) {
        println!("\n## {}", builds[b].0);
        done[b] = Some(storm_once(&builds[b].1)?);
    }
    let done: Vec<StormRun> = done.into_iter().flatten().collect();
    let figures = done[0]
        .figures
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let values: Vec<f64> = done.iter().map(|r| r.figures[i].1).collect();
            Figure::new("storm", name.clone(), &values)
        })
        .collect();
    if let Some(failed) = done.iter().find_map(|r| r.failed.as_ref()) {
        bail!("{failed}");
    }
    Ok(figures)
}

/// memwatch's figures in the rivals' table.
struct Memwatch<'a> {
    delivered: usize,
    /// Delivered with the victim's own cgroup.
    named: usize,
    delays: &'a mut Vec<f64>,
}

/// The rivals' table: per watcher, how many of the bench's kills it
/// reported, how many with their cgroup, and its delay from the kernel's
/// stamp (memwatch's event `time` of the same pid).
// Long: one table, row by row (memwatch, kmsg, thresholds), each row's
// counting beside its printing; split when a fourth watcher joins.
fn print_rivals(
    memwatch: Memwatch<'_>,
    children: &[storm::Child],
    stamps: &HashMap<u32, SystemTime>,
    log: &KmsgSeen,
    notified: &ThresholdsSeen,
    cgroups: &[PathBuf],
) {
    let killed: Vec<&storm::Child> = children.iter().filter(|c| c.killed).collect();
    let kills = killed.len();

    // The kmsg reader: the kill line of each victim, and a summary line
    // that names the victim's own cgroup.
    let mut lines: HashMap<u32, SystemTime> = HashMap::new();
    for (kill, at) in &log.kills {
        lines.entry(kill.pid).or_insert(*at);
    }
    let root = Path::new(MEMORY);
    let victims: HashMap<u32, &Path> = killed.iter().map(|c| (c.pid, c.cgroup.as_path())).collect();
    let ours = log
        .summaries
        .iter()
        .filter(|(s, _)| victims.contains_key(&s.pid))
        .count();
    let named: BTreeSet<u32> = log
        .summaries
        .iter()
        .filter(|(s, _)| {
            victims
                .get(&s.pid)
                .is_some_and(|c| root.join(s.task_memcg.trim_start_matches('/')) == *c)
        })
        .map(|(s, _)| s.pid)
        .collect();
    let mut kmsg_delays: Vec<f64> = killed
        .iter()
        .filter_map(|c| Some(ms(*stamps.get(&c.pid)?, *lines.get(&c.pid)?)))
        .collect();
    let reported = killed.iter().filter(|c| lines.contains_key(&c.pid)).count();

    // The thresholds: oom_control notifications per cgroup against its
    // kills. A cgroup's kills come one after another (one worker owns it),
    // so where the wake-ups match the kills one to one they are paired in
    // order for a delay.
    let (mut notifications, mut exact, mut paired) = (0u64, 0usize, 0usize);
    let (mut more, mut fewer, mut excess) = (0usize, 0usize, 0u64);
    let mut threshold_delays = Vec::new();
    for dir in cgroups {
        let here: Vec<&&storm::Child> = killed.iter().filter(|c| c.cgroup == *dir).collect();
        let Some(wake) = notified.cgroups.get(dir).and_then(|n| n.oom.as_ref()) else {
            fewer += usize::from(!here.is_empty());
            continue;
        };
        notifications += wake.count;
        let killed_here = here.len() as u64;
        if wake.count != killed_here {
            more += usize::from(wake.count > killed_here);
            fewer += usize::from(wake.count < killed_here);
            excess = excess.max(wake.count.saturating_sub(killed_here));
            continue;
        }
        exact += 1;
        if wake.times.len() == here.len() {
            paired += 1;
            for (c, at) in here.iter().zip(&wake.times) {
                if let Some(stamp) = stamps.get(&c.pid) {
                    threshold_delays.push(ms(*stamp, *at));
                }
            }
        }
    }

    println!(
        "\nRivals in the same storm ({kills} kills in {} cgroups):\n",
        cgroups.len()
    );
    println!("| watcher | kills reported | with their cgroup | p50 ms | p99 ms | can name |");
    println!("|---|---|---|---|---|---|");
    let q = |d: &mut Vec<f64>, p: f64| {
        let v = quantile(d, p);
        if v.is_nan() {
            "–".to_string()
        } else {
            format!("{v:.1}")
        }
    };
    println!(
        "| memwatch -> local webhook | {} of {kills} | {} of {kills} | {} | {} | pid, comm, cgroup, limit cgroup, RSS, task/worker |",
        memwatch.delivered,
        memwatch.named,
        q(memwatch.delays, 0.5),
        q(memwatch.delays, 0.99),
    );
    println!(
        "| kmsg reader (/dev/kmsg) | {reported} of {kills} | {} of {kills} | {} | {} | pid, comm, RSS; cgroup only on the rate-limited summary line |",
        named.len(),
        q(&mut kmsg_delays, 0.5),
        q(&mut kmsg_delays, 0.99),
    );
    println!(
        "| v1 oom_control eventfds | {notifications} notifications for {kills} kills | {exact} of {} cgroups: one per kill | {} | {} | the cgroup registered on (OOM condition) |",
        cgroups.len(),
        q(&mut threshold_delays, 0.5),
        q(&mut threshold_delays, 0.99),
    );
    println!(
        "\nkmsg: {} records read, {} kill lines, {} oom-kill summary lines ({ours} of the bench's \
         victims), {} overruns; thresholds: {more} cgroups notified more often than killed \
         (at most {excess} more), {fewer} less often; delays paired in {paired} cgroups, {} \
         registrations failed",
        log.records,
        log.kills.len(),
        log.summaries.len(),
        log.overruns,
        notified.failed,
    );
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
