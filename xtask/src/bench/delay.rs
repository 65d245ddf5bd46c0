//! `cargo xtask bench delay`: how long from the kernel's event (an OOM kill,
//! a soft-cap crossing) to the event arriving at a local webhook, beside a
//! plain poller of the cgroup files at 100 ms and 1 s on the same workload.
//!
//! The reference time of an OOM kill is the kernel's own stamp, carried in
//! the event's `time`; of a soft-cap crossing, the moment memhog has touched
//! the cap (it prints it). Every watcher is measured against the same time.

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
    memhog,
    process::{cgroup_exec_line, wait_timeout},
    stats::quantile,
    webhook::Receiver,
};

use super::{release_bins, start_agent};

/// Events of each kind measured.
const EVENTS: usize = 100;
/// Workloads run at once.
const BATCH: usize = 10;
const MIB: u64 = 1 << 20;
const MEMORY: &str = "/sys/fs/cgroup/memory";
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

/// Per watcher, one delay (ms) per event.
#[derive(Default)]
struct Delays {
    webhook: Vec<f64>,
    polls: [Vec<f64>; 2],
    missed: [usize; 3],
}

pub(super) fn delay() -> anyhow::Result<()> {
    let release = release_bins("the delay benchmark loads the eBPF probe and makes cgroups")?;
    let receiver = Receiver::start();
    let agent = start_agent(&release.join("memwatch"), &["--webhook", &receiver.url()])?;
    let agent_url = agent.base_url();

    let oom = measure(
        &receiver,
        "oom_kill",
        "memory.oom_control",
        oom_killed,
        |k| oom_batch(&release, k),
    )?;
    let soft = measure(
        &receiver,
        "soft_cap_exceeded",
        "memory.usage_in_bytes",
        over_soft_cap,
        |k| soft_cap_batch(&release, &agent_url, k),
    )?;
    drop(agent);

    println!(
        "\nDetection delay: kernel time stamp -> seen ({EVENTS} events each; {BATCH} workloads at once)\n"
    );
    println!("| event | watcher | p50 ms | p99 ms | missed |");
    println!("|---|---|---|---|---|");
    for (name, d) in [
        ("OOM kill (memhog 128 MiB in a 64 MiB cgroup)", oom),
        (
            "soft-cap crossing (memwatch exec --soft-cap 32M, memhog 48 MiB)",
            soft,
        ),
    ] {
        let Delays {
            webhook,
            polls: [fast, slow],
            missed,
        } = d;
        let rows = [
            ("memwatch -> local webhook", webhook, missed[0]),
            ("poller, 100 ms", fast, missed[1]),
            ("poller, 1 s", slow, missed[2]),
        ];
        for (watcher, mut samples, missed) in rows {
            println!(
                "| {name} | {watcher} | {:.1} | {:.1} | {missed} |",
                quantile(&mut samples, 0.5),
                quantile(&mut samples, 0.99)
            );
        }
    }
    Ok(())
}

/// Runs `batch(k)` (which returns the cgroup directories it used) for each
/// batch, with the pollers watching `file` in those directories.
fn measure(
    receiver: &Receiver,
    kind: &str,
    file: &str,
    crossed: fn(&str) -> bool,
    mut batch: impl FnMut(usize) -> anyhow::Result<Vec<(PathBuf, Option<SystemTime>)>>,
) -> anyhow::Result<Delays> {
    let mut delays = Delays::default();
    for k in 0..EVENTS / BATCH {
        let dirs: Vec<PathBuf> = (0..BATCH).map(|j| batch_dir(kind, k, j)).collect();
        let files: Vec<PathBuf> = dirs.iter().map(|d| d.join(file)).collect();
        let pollers: Vec<Poller> = POLLS
            .iter()
            .map(|i| Poller::start(*i, files.clone(), crossed))
            .collect();
        let used = batch(k)?;
        // Give the slow poller one more interval and the webhook its delivery.
        thread::sleep(POLLS[1] + Duration::from_millis(200));
        let seen: Vec<_> = pollers.into_iter().map(Poller::finish).collect();
        let received = receiver.events();
        for (dir, mark) in &used {
            let cgroup = dir.to_string_lossy();
            let Some((arrived, event)) = received
                .iter()
                .find(|(_, e)| e["kind"] == kind && e["cgroup"].as_str() == Some(&*cgroup))
            else {
                delays.missed[0] += 1;
                continue;
            };
            let stamp = event["time"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .context("event time")?;
            let kernel = mark.unwrap_or(stamp);
            delays.webhook.push(ms(kernel, *arrived));
            for (p, seen) in seen.iter().enumerate() {
                match seen.get(&dir.join(file)) {
                    Some(at) => delays.polls[p].push(ms(kernel, *at)),
                    None => delays.missed[p + 1] += 1,
                }
            }
        }
        for (dir, _) in used {
            let _ = std::fs::remove_dir(dir);
        }
        eprintln!("xtask: {kind} batch {k} done");
    }
    Ok(delays)
}

fn batch_dir(kind: &str, k: usize, j: usize) -> PathBuf {
    match kind {
        "oom_kill" => Path::new(MEMORY).join(format!("memwatch-bench-oom-{k}-{j}")),
        _ => Path::new(MEMORY).join(format!("memwatch/task-bench-soft-{k}-{j}")),
    }
}

/// BATCH memhogs of 128 MiB, each in its own 64 MiB cgroup: each is OOM-killed.
fn oom_batch(release: &Path, k: usize) -> anyhow::Result<Vec<(PathBuf, Option<SystemTime>)>> {
    oom_kills(release, k, BATCH)
}

/// `n` memhogs of 128 MiB started at once, each in its own 64 MiB cgroup.
fn oom_kills(
    release: &Path,
    k: usize,
    n: usize,
) -> anyhow::Result<Vec<(PathBuf, Option<SystemTime>)>> {
    let mut children = Vec::new();
    let mut dirs = Vec::new();
    for j in 0..n {
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
        children.push(child);
        dirs.push(dir);
    }
    wait_all(children, Duration::from_secs(20))?;
    Ok(dirs.into_iter().map(|d| (d, None)).collect())
}

/// BATCH `memwatch exec --soft-cap 32M -- memhog 48 2`: each crosses once.
/// The reference is memhog's own mark when it has touched 32 MiB (the
/// kernel stamps the crossing only at its next check, and the cgroup's
/// usage counts page cache that RSS does not).
fn soft_cap_batch(
    release: &Path,
    agent: &str,
    k: usize,
) -> anyhow::Result<Vec<(PathBuf, Option<SystemTime>)>> {
    let children = (0..BATCH)
        .map(|j| {
            Command::new(release.join("memwatch"))
                .args(["exec", "--agent", agent, "--soft-cap", "32M"])
                .args(["--task-id", &format!("bench-soft-{k}-{j}"), "--"])
                .arg(release.join("memhog"))
                .args(["48", "2"])
                .env(memhog::MARK_ENV, "32")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut marks = Vec::new();
    for (j, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        let mark = memhog::printed(&String::from_utf8_lossy(&out.stdout), "mark")
            .and_then(|ns| u64::try_from(ns).ok())
            .map(|ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns));
        marks.push((batch_dir("soft_cap_exceeded", k, j), mark));
    }
    Ok(marks)
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
