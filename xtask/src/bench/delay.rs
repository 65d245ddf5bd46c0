//! `cargo xtask bench delay`: how long from the kernel's event (an OOM kill,
//! a soft-cap crossing) to the event arriving at a local webhook, beside
//! rivals on the same workload in the same run: plain pollers of the cgroup
//! files at 100 ms and 1 s, a reader of the kernel log (`/dev/kmsg`, as
//! node-problem-detector and cAdvisor watch OOM kills), and kernel-notified
//! v1 thresholds (eventfds on `memory.usage_in_bytes` and
//! `memory.oom_control`), see [`rivals`].
//!
//! The reference time of an OOM kill is the kernel's own stamp, carried in
//! the event's `time`; of a soft-cap crossing, the moment memhog has touched
//! the cap (it prints it). Every watcher is measured against the same time.
//! Each row also says what the watcher can name of the event, and the kmsg
//! reader's how many kills it could put in their cgroup (only its
//! rate-limited summary line names one).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use memwatch_test_support::{
    http::http_get,
    memhog,
    process::{cgroup_exec_line, wait_timeout},
    stats::quantile,
    webhook::Receiver,
};

use super::{
    baseline::Baseline,
    builds,
    compare::{Figure, interleaved},
    release_bins, segments, start_agent,
};

#[path = "rivals/mod.rs"]
pub(super) mod rivals;

use rivals::{Kmsg, KmsgSeen, Thresholds, Watch};

/// Events of each kind measured.
const EVENTS: usize = 100;
/// Workloads run at once.
const BATCH: usize = 10;
/// Set to run fewer workloads at once (2: no more than the cores here).
const BATCH_ENV: &str = "MEMWATCH_BENCH_DELAY_BATCH";

/// Workloads run at once: [`BATCH`], or [`BATCH_ENV`]'s (a divisor of
/// [`EVENTS`]).
fn at_once() -> anyhow::Result<usize> {
    let Ok(text) = std::env::var(BATCH_ENV) else {
        return Ok(BATCH);
    };
    match text.parse::<usize>() {
        Ok(n) if n > 0 && EVENTS.is_multiple_of(n) => Ok(n),
        _ => bail!("{BATCH_ENV}={text}: a divisor of {EVENTS} is needed"),
    }
}
const MIB: u64 = 1 << 20;
pub(super) const MEMORY: &str = "/sys/fs/cgroup/memory";
/// Poll intervals of the comparison pollers.
const POLLS: [Duration; 2] = [Duration::from_millis(100), Duration::from_secs(1)];

/// Polls `files` every `interval`; records when `crossed(contents)` first holds.
struct Poller {
    seen: Arc<Mutex<BTreeMap<PathBuf, SystemTime>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Poller {
    fn start(interval: Duration, files: Vec<PathBuf>, crossed: fn(&str) -> bool) -> Poller {
        let seen: Arc<Mutex<BTreeMap<PathBuf, SystemTime>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                for file in &files {
                    if s.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains_key(file)
                    {
                        continue;
                    }
                    if std::fs::read_to_string(file).is_ok_and(|text| crossed(&text)) {
                        s.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(file.clone(), SystemTime::now());
                    }
                }
                thread::sleep(interval);
            }
        });
        Poller {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> BTreeMap<PathBuf, SystemTime> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn oom_killed(text: &str) -> bool {
    oom_control_kills(text).is_some_and(|n| n > 0)
}

/// `oom_kill N` of a v1 `memory.oom_control`.
pub(super) fn oom_control_kills(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse::<u64>().ok())
}

/// Soft cap of the crossing workload.
const SOFT_CAP: u64 = 32 * MIB;

fn over_soft_cap(text: &str) -> bool {
    text.trim().parse::<u64>().is_ok_and(|n| n > SOFT_CAP)
}

/// The watchers, in the table's order.
const WATCHERS: [&str; 5] = [
    "memwatch -> local webhook",
    "poller, 100 ms",
    "poller, 1 s",
    "kmsg reader (/dev/kmsg)",
    "v1 thresholds (eventfd, epoll)",
];

/// An event kind measured, and how each watcher sees it.
struct Kind {
    /// The event's `kind`.
    name: &'static str,
    /// The cgroup file the pollers read, and when it shows the event.
    file: &'static str,
    crossed: fn(&str) -> bool,
    /// The kernel logs it (an OOM kill) or not (a soft-cap crossing);
    /// the thresholds' OOM notification or their usage threshold.
    oom: bool,
    /// What each watcher (WATCHERS' order) can name of the event.
    names: [&'static str; 5],
}

const OOM: Kind = Kind {
    name: "oom_kill",
    file: "memory.oom_control",
    crossed: oom_killed,
    oom: true,
    names: [
        "pid, comm, cgroup, limit cgroup, RSS, task/worker",
        "cgroup (its file's)",
        "cgroup (its file's)",
        "pid, comm, RSS; cgroup + limit cgroup only on the rate-limited summary line",
        "the cgroup registered on (OOM condition, before the victim is chosen)",
    ],
};

const SOFT: Kind = Kind {
    name: "soft_cap_exceeded",
    file: "memory.usage_in_bytes",
    crossed: over_soft_cap,
    oom: false,
    names: [
        "task/worker, cgroup, RSS, cap, growth rate",
        "cgroup (its file's)",
        "cgroup (its file's)",
        "nothing: the kernel logs no such event",
        "the cgroup registered on",
    ],
};

/// One watcher's figures for one event kind.
#[derive(Default)]
struct Figures {
    /// One delay (ms) per event seen.
    delays: Vec<f64>,
    missed: usize,
    /// Events seen with their cgroup named.
    named: usize,
    /// Events seen before their reference time (a negative delay).
    early: usize,
}

impl Figures {
    /// The event of reference time `from` was seen `at` (or never).
    fn seen(&mut self, from: SystemTime, at: Option<SystemTime>, named: bool) {
        match at {
            Some(at) => {
                let delay = ms(from, at);
                self.delays.push(delay);
                self.early += usize::from(delay < 0.0);
                self.named += usize::from(named);
            }
            None => self.missed += 1,
        }
    }
}

/// Per watcher (WATCHERS' order), its figures for one event kind, and the
/// rivals' own counts.
#[derive(Default)]
struct Delays {
    watchers: [Figures; 5],
    /// Events measured.
    events: usize,
    /// Threshold registrations that came after the event (found by their
    /// one read of the file at registration).
    late: usize,
    /// Cgroups the thresholds could not register on.
    failed: usize,
    /// Times the kmsg reader fell behind the log (EPIPE).
    overruns: usize,
}

/// One workload of a batch: its cgroup, memhog's mark (the soft-cap
/// reference), and the pid the kernel names when it kills it.
struct Workload {
    dir: PathBuf,
    mark: Option<SystemTime>,
    pid: Option<u32>,
}

/// One run's figures: per event kind, and the agent's own metrics.
struct Run {
    oom: Delays,
    soft: Delays,
    metrics: String,
}

impl Delays {
    /// Pools another run's figures into these.
    fn absorb(&mut self, other: Delays) {
        for (mine, theirs) in self.watchers.iter_mut().zip(other.watchers) {
            mine.delays.extend(theirs.delays);
            mine.missed += theirs.missed;
            mine.named += theirs.named;
            mine.early += theirs.early;
        }
        self.events += other.events;
        self.late += other.late;
        self.failed += other.failed;
        self.overruns += other.overruns;
    }
}

/// Runs with a baseline: A B B A, so a drift in load favours neither.
const AB_RUNS: usize = 4;

pub(super) fn delay(baseline: Option<&Baseline>) -> anyhow::Result<Vec<Figure>> {
    let release = release_bins("the delay benchmark loads the eBPF probe and makes cgroups")?;
    let builds = builds(&release, baseline)?;
    let runs = if builds.len() > 1 { AB_RUNS } else { 1 };
    let mut pooled: Vec<Option<Run>> = builds.iter().map(|_| None).collect();
    for (r, b) in interleaved(runs, builds.len()).into_iter().enumerate() {
        eprintln!("xtask: delay run {r}: {}", builds[b].0);
        let run = run_once(&release, &builds[b].1)?;
        pooled[b] = Some(match pooled[b].take() {
            None => run,
            Some(mut p) => {
                p.oom.absorb(run.oom);
                p.soft.absorb(run.soft);
                p.metrics = segments::merge(&[&p.metrics, &run.metrics]);
                p
            }
        });
    }
    let mut figures: Vec<Vec<(String, f64)>> = Vec::new();
    for ((name, _), run) in builds.iter().zip(pooled) {
        let mut run = run.context("every build ran")?;
        let per_run = runs / builds.len();
        println!("\n## {name} ({} run(s) pooled)", per_run);
        figures.push(print_run(&mut run)?);
    }
    Ok(compared(&figures))
}

/// The same figures of every build side by side.
fn compared(builds: &[Vec<(String, f64)>]) -> Vec<Figure> {
    let Some(first) = builds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let values: Vec<f64> = builds
                .iter()
                .map(|b| b.get(i).map_or(f64::NAN, |f| f.1))
                .collect();
            Figure::new("delay", name.clone(), &values)
        })
        .collect()
}

/// One run of every event with `memwatch` (a binary) as the agent, its
/// workload binaries from `release`.
fn run_once(release: &Path, memwatch: &Path) -> anyhow::Result<Run> {
    let receiver = Receiver::start();
    let agent = start_agent(memwatch, &["--webhook", &receiver.url()])?;
    let socket = agent.socket.clone();
    let oom = measure(&receiver, &OOM, |k| oom_batch(release, k))?;
    let soft = measure(&receiver, &SOFT, |k| soft_cap_batch(release, &socket, k))?;
    let metrics = http_get(agent.port, "/metrics")?;
    drop(agent);
    Ok(Run { oom, soft, metrics })
}

/// Prints a build's tables; returns its figures for the comparison.
fn print_run(run: &mut Run) -> anyhow::Result<Vec<(String, f64)>> {
    println!(
        "\nDetection delay: kernel time stamp -> seen ({} events each; {} workloads at once)\n",
        run.oom.events,
        at_once()?
    );
    println!("| event | watcher | p50 ms | p99 ms | missed | cgroup named | can name |");
    println!("|---|---|---|---|---|---|---|");
    let mut notes = Vec::new();
    let mut figures = Vec::new();
    for (name, short, kind, d) in [
        (
            "OOM kill (memhog 128 MiB in a 64 MiB cgroup)",
            "OOM kill",
            &OOM,
            &mut run.oom,
        ),
        (
            "soft-cap crossing (memwatch exec --soft-cap 32M, memhog 48 MiB)",
            "soft-cap crossing",
            &SOFT,
            &mut run.soft,
        ),
    ] {
        let n = d.events;
        for ((watcher, f), names) in WATCHERS.iter().zip(&mut d.watchers).zip(kind.names) {
            println!(
                "| {name} | {watcher} | {} | {} | {} of {n} | {} of {n} | {names} |",
                figure(quantile(&mut f.delays, 0.5)),
                figure(quantile(&mut f.delays, 0.99)),
                f.missed,
                f.named,
            );
        }
        figures.extend(kind_figures(short, kind, d));
        notes.push(note(name, d));
    }
    println!();
    for note in notes {
        println!("{note}");
    }
    println!(
        "\nmemwatch's own segments (its memwatch_event_delay_seconds histograms; p50/p99 interpolated within buckets)\n"
    );
    print!("{}", segments::table(&run.metrics));
    for (kind, short) in [
        ("oom_kill", "OOM kill"),
        ("soft_cap_exceeded", "soft-cap crossing"),
    ] {
        let p99 = segments::quantile_ms(&run.metrics, kind, "read_to_sent", 0.99);
        figures.push((format!("{short}: read_to_sent p99 ms"), p99));
    }
    Ok(figures)
}

/// memwatch's p50 and p99 and misses for one kind; for OOM kills also
/// the kmsg reader's p99 and memwatch's p99 less it (same run).
fn kind_figures(short: &str, kind: &Kind, d: &mut Delays) -> Vec<(String, f64)> {
    let mw = &mut d.watchers[0].delays;
    let (p50, p99) = (quantile(mw, 0.5), quantile(mw, 0.99));
    let mut out = vec![
        (format!("{short} -> webhook p50 ms"), p50),
        (format!("{short} -> webhook p99 ms"), p99),
        (format!("{short}: missed"), d.watchers[0].missed as f64),
    ];
    if kind.oom {
        let kmsg = quantile(&mut d.watchers[3].delays, 0.99);
        out.push((format!("{short}: kmsg reader p99 ms"), kmsg));
        out.push((format!("{short}: webhook p99 - kmsg p99 ms"), p99 - kmsg));
    }
    out
}

fn note(name: &str, d: &Delays) -> String {
    format!(
        "{name}: seen before the reference (delay < 0): {}; thresholds registered after \
         the event (found by their one read) {}, not registered {}; kmsg reader overruns {}",
        WATCHERS
            .iter()
            .zip(&d.watchers)
            .map(|(w, f)| format!("{w} {}", f.early))
            .collect::<Vec<_>>()
            .join(", "),
        d.late,
        d.failed,
        d.overruns
    )
}

/// `ms` with one decimal, or a dash when there is none.
fn figure(ms: f64) -> String {
    if ms.is_nan() {
        "–".to_string()
    } else {
        format!("{ms:.1}")
    }
}

/// Runs `batch(k)` (which returns the workloads it ran) for each batch,
/// with every watcher on: the pollers on `kind.file` in the batch's
/// directories, the kmsg reader, and the thresholds on the cgroups made
/// under the batch's parent.
fn measure(
    receiver: &Receiver,
    kind: &Kind,
    mut batch: impl FnMut(usize) -> anyhow::Result<Vec<Workload>>,
) -> anyhow::Result<Delays> {
    let mut delays = Delays::default();
    let at_once = at_once()?;
    for k in 0..EVENTS / at_once {
        let dirs: Vec<PathBuf> = (0..at_once).map(|j| batch_dir(kind.name, k, j)).collect();
        let files: Vec<PathBuf> = dirs.iter().map(|d| d.join(kind.file)).collect();
        let parent = dirs[0].parent().context("a batch cgroup's parent")?;
        std::fs::create_dir_all(parent).with_context(|| format!("mkdir {}", parent.display()))?;
        let pollers: Vec<Poller> = POLLS
            .iter()
            .map(|i| Poller::start(*i, files.clone(), kind.crossed))
            .collect();
        let kmsg = Kmsg::start()?;
        let thresholds = Thresholds::start(Watch {
            cgroups: Vec::new(),
            parents: vec![parent.to_path_buf()],
            usage_threshold: Some(SOFT_CAP),
        })?;
        let used = batch(k)?;
        // Give the slow poller one more interval and the webhook its delivery.
        thread::sleep(POLLS[1] + Duration::from_millis(200));
        let seen: Vec<_> = pollers.into_iter().map(Poller::finish).collect();
        let log = kmsg.finish()?;
        let notified = thresholds.finish()?;
        delays.overruns += log.overruns;
        delays.failed += notified.failed;
        let received = receiver.events();
        for w in &used {
            delays.events += 1;
            let cgroup = w.dir.to_string_lossy();
            let Some((arrived, event)) = received
                .iter()
                .find(|(_, e)| e["kind"] == kind.name && e["cgroup"].as_str() == Some(&*cgroup))
            else {
                // No kernel stamp to measure the others against either.
                delays.watchers[0].missed += 1;
                continue;
            };
            let stamp = event["time"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .context("event time")?;
            let kernel = w.mark.unwrap_or(stamp);
            delays.watchers[0].seen(kernel, Some(*arrived), true);
            for (p, seen) in seen.iter().enumerate() {
                let at = seen.get(&w.dir.join(kind.file)).copied();
                delays.watchers[p + 1].seen(kernel, at, true);
            }
            let (at, named) = logged(kind, &log, w);
            delays.watchers[3].seen(kernel, at, named);
            let wake = notified.cgroups.get(&w.dir).and_then(|n| {
                if kind.oom {
                    n.oom.as_ref()
                } else {
                    n.usage.as_ref()
                }
            });
            delays.late += usize::from(wake.is_some_and(|w| w.late));
            delays.watchers[4].seen(kernel, wake.map(|w| w.first), true);
        }
        for w in used {
            let _ = std::fs::remove_dir(w.dir);
        }
        eprintln!("xtask: {} batch {k} done", kind.name);
    }
    Ok(delays)
}

/// When the kmsg reader got `w`'s kill line (an OOM kill's; a soft-cap
/// crossing is never logged), and whether a summary line named its cgroup.
fn logged(kind: &Kind, log: &KmsgSeen, w: &Workload) -> (Option<SystemTime>, bool) {
    match w.pid.filter(|_| kind.oom) {
        Some(pid) => (log.kill(pid), log.names(pid, Path::new(MEMORY), &w.dir)),
        None => (None, false),
    }
}

fn batch_dir(kind: &str, k: usize, j: usize) -> PathBuf {
    match kind {
        "oom_kill" => Path::new(MEMORY).join(format!("memwatch-bench-oom-{k}-{j}")),
        _ => Path::new(MEMORY).join(format!("memwatch/task-bench-soft-{k}-{j}")),
    }
}

/// [`at_once`] memhogs of 128 MiB started at once, each in its own 64 MiB
/// cgroup: each is OOM-killed.
fn oom_batch(release: &Path, k: usize) -> anyhow::Result<Vec<Workload>> {
    let mut children = Vec::new();
    let mut used = Vec::new();
    for j in 0..at_once()? {
        let dir = batch_dir("oom_kill", k, j);
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        std::fs::write(dir.join("memory.limit_in_bytes"), (64 * MIB).to_string())?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(cgroup_exec_line(
                &dir,
                &format!("{} 128 1", release.join("memhog").display()),
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // The shell execs memhog: its pid is the victim's.
        used.push(Workload {
            dir,
            mark: None,
            pid: Some(child.id()),
        });
        children.push(child);
    }
    wait_all(children, Duration::from_secs(20))?;
    Ok(used)
}

/// [`at_once`] `memwatch exec --soft-cap 32M -- memhog 48 2`: each crosses once.
/// The reference is memhog's own mark when it has touched 32 MiB (the
/// kernel stamps the crossing only at its next check, and the cgroup's
/// usage counts page cache that RSS does not).
fn soft_cap_batch(release: &Path, socket: &Path, k: usize) -> anyhow::Result<Vec<Workload>> {
    let children = (0..at_once()?)
        .map(|j| {
            Command::new(release.join("memwatch"))
                .args(["exec", "--soft-cap", "32M", "--socket"])
                .arg(socket)
                .args(["--task-id", &format!("bench-soft-{k}-{j}"), "--"])
                .arg(release.join("memhog"))
                .args(["48", "2"])
                .env(memhog::MARK_ENV, "32")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut used = Vec::new();
    for (j, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        let mark = memhog::printed(&String::from_utf8_lossy(&out.stdout), "mark")
            .and_then(|ns| u64::try_from(ns).ok())
            .map(|ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns));
        used.push(Workload {
            dir: batch_dir("soft_cap_exceeded", k, j),
            mark,
            pid: None,
        });
    }
    Ok(used)
}

/// Waits for every child, all within `timeout` of the call.
fn wait_all(children: Vec<std::process::Child>, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    for mut child in children {
        let left = deadline.saturating_duration_since(Instant::now());
        if wait_timeout(&mut child, left)?.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("a workload ran past {timeout:?}");
        }
    }
    Ok(())
}

pub(super) fn ms(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}
