//! `cargo xtask bench predict`: how early, and how right, memwatch's
//! `oom_imminent` is, on deterministic workloads (`memshape`: anonymous
//! memory, no swap, fixed seeds, every allocation logged) in cgroups with a
//! real limit, each run by the kernel to its OOM kill or to its end, beside
//! the rivals replayed on the same runs' traces ([`rivals`]).
//!
//! Cells: leaks at 2, 10 and 40 MiB/s; steps of 64 MiB every 10 s; a
//! sawtooth with rising troughs: each ends in a kill, [`runs`] runs each.
//! A steady sawtooth (50–90 %), 93 % anonymous memory under a page-cache
//! stream twice the limit, and short spikes to 85–97 %: each survives, run
//! side by side for [`survive_seconds`], one hour of workload in all by
//! default. Lead time is the kill's kernel stamp (the `oom_kill` event's
//! `time`) less the time of the first `oom_imminent` of the episode open
//! at it; the ETA error is what a reader of the events believed 2, 5 and
//! 10 s before the kill (the last ETA said, counted down). The agent runs
//! with its defaults (`sample_interval` 1 s, horizon 60 s), the runs'
//! cgroups found by a `[[rule]]`.
//!
//! On cgroup v2 (the Debian kernels [`vm`] boots) the cells are the
//! 10 MiB/s leak, the same leak above `memory.high` at 0.9 × `memory.max`,
//! and the same leak in a job whose parent's limit comes first.
//!
//! A plot of the first run of each cell is written to
//! `target/bench/predict/<cell>.svg`.

mod cells;
mod cgroup;
mod plot;
mod report;
mod rivals;
mod score;
mod trace;
mod vm;

pub(crate) use vm::inside as inside_vm;

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use memwatch_test_support::{
    process::{cgroup_exec_line, wait_timeout},
    webhook::Receiver,
};
use serde_json::Value;

use self::{
    cells::{Cell, KILLING, Limits, SURVIVING, V2_KILLING},
    cgroup::{Fs, remove_tree},
    trace::{POLL, Sample, Trace, Warnings},
};
use super::{
    compare::Figure,
    idle::{clock_ticks, cpu_ticks},
    release_bins, start_agent,
};
use crate::shell::workspace_root;

const MIB: u64 = 1 << 20;
const PARENT: &str = "memwatch-predict";
/// Kills per cell (set [`RUNS_ENV`] for fewer, e.g. a quick look).
const RUNS: usize = 10;
const RUNS_ENV: &str = "MEMWATCH_BENCH_PREDICT_RUNS";
/// Seconds each survivor runs; 3 cells × [`RUNS`] / 2 runs × 240 s = 1 h.
const SURVIVE_S: f64 = 240.0;
const SURVIVE_ENV: &str = "MEMWATCH_BENCH_PREDICT_SECONDS";

fn runs() -> anyhow::Result<usize> {
    env_number(RUNS_ENV, RUNS as f64).map(|n| n as usize)
}

fn survive_seconds() -> anyhow::Result<f64> {
    env_number(SURVIVE_ENV, SURVIVE_S)
}

fn env_number(key: &str, default: f64) -> anyhow::Result<f64> {
    match std::env::var(key) {
        Err(_) => Ok(default),
        Ok(text) => match text.parse::<f64>() {
            Ok(n) if n >= 1.0 => Ok(n),
            _ => bail!("{key}={text}: a number of at least 1 is needed"),
        },
    }
}

/// Runs side by side in a v2 VM: its emulated CPUs are one host thread.
const V2_PARALLEL: usize = 5;

/// A killing run is stopped after this long (none should need it).
const KILL_BOUND_S: f64 = 150.0;
/// The same above `memory.high`: the kernel slows the last 10 % to a
/// crawl, slower the more runs reclaim at once (under TCG, 5 at once: 241
/// to 254 MiB of 256 in 130 s; 10 at once: 236 to 247 MiB in 450 s).
const HIGH_BOUND_S: f64 = 360.0;

/// One run: its cell, cgroup and what happened.
struct Run {
    cell: usize,
    /// The cgroup the workload runs in.
    dir: PathBuf,
    trace: Trace,
    /// The agent's own `predicted_lead_seconds` on the kill, if any.
    own_lead: Option<f64>,
    /// What memwatch said of it.
    said: Warnings,
}

/// `bench predict`: the cells of this host's hierarchy, then the cgroup
/// v2 cells in the VMs ([`vm`]).
pub(super) fn predict() -> anyhow::Result<Vec<Figure>> {
    let release = release_bins("the predict benchmark loads the eBPF probe and makes cgroups")?;
    let mut figures = run_here(&release, POLL)?;
    if Fs::detect()? == Fs::V1 {
        figures.extend(vm::predict_v2(&release)?);
    }
    Ok(figures)
}

/// `bench predict-v2`: the cgroup v2 cells only, in the VMs.
pub(super) fn predict_v2() -> anyhow::Result<Vec<Figure>> {
    let release = release_bins("the predict benchmark boots VMs and makes cgroups")?;
    vm::predict_v2(&release)
}

/// The cells of the hierarchy this machine has (v1: [`KILLING`] and
/// [`SURVIVING`]; v2: [`V2_KILLING`]), with the agent and workloads of
/// `release` and the trace poller reading every `poll`: prints the tables,
/// writes the plots, returns the figures.
fn run_here(release: &Path, poll: Duration) -> anyhow::Result<Vec<Figure>> {
    let fs = Fs::detect()?;
    let (runs, survive) = (runs()?, survive_seconds()?);
    let parent = fs.root().join(PARENT);
    remove_tree(&parent);
    fs.mkdir(&parent, true)?;
    let out_dir = workspace_root().join("target/bench/predict");
    std::fs::create_dir_all(&out_dir)?;
    let config = out_dir.join("memwatch.toml");
    // A rule's glob matches one level per `*`: the jobs of the parent-limit
    // runs (`run-*/job`, where their workload runs) need a rule of their own.
    std::fs::write(
        &config,
        format!(
            "[[worker]]\nname = \"bench\"\ncgroup = \"{p}\"\nsoft_cap = \"1TiB\"\n\n\
             [[rule]]\nworker = \"bench\"\ncgroup = \"{p}/run-*\"\nsoft_cap = \"1TiB\"\n\n\
             [[rule]]\nworker = \"bench\"\ncgroup = \"{p}/run-*/job\"\nsoft_cap = \"1TiB\"\n",
            p = parent.display()
        ),
    )?;
    let receiver = Receiver::start();
    let agent = start_agent(
        &release.join("memwatch"),
        &[
            "--config",
            &config.to_string_lossy(),
            "--webhook",
            &receiver.url(),
        ],
    )?;
    let pid = agent.pid().context("the agent's pid")?;
    let cells: Vec<Cell> = match fs {
        Fs::V1 => KILLING.iter().chain(&SURVIVING).copied().collect(),
        Fs::V2 => V2_KILLING.to_vec(),
    };
    let mut batches: Vec<Vec<(usize, f64)>> = Vec::new();
    for (c, cell) in cells.iter().enumerate().filter(|(_, cell)| cell.kills) {
        // Throttled above memory.high, a run crawls for minutes.
        let bound = match cell.limits {
            Limits::High => HIGH_BOUND_S,
            _ => KILL_BOUND_S,
        };
        let at_once = match fs {
            Fs::V1 => runs,
            Fs::V2 => V2_PARALLEL,
        };
        let all = vec![(c, bound); runs];
        batches.extend(all.chunks(at_once).map(<[_]>::to_vec));
    }
    let per_survivor = runs.div_ceil(2).max(1);
    let survivors: Vec<(usize, f64)> = (0..cells.len())
        .filter(|c| !cells[*c].kills)
        .flat_map(|c| vec![(c, survive); per_survivor])
        .collect();
    if !survivors.is_empty() {
        batches.push(survivors);
    }
    let mut done = Vec::new();
    let mut cpu: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let names: Vec<&str> = batch.iter().map(|(c, _)| cells[*c].name).collect();
        eprintln!("xtask: predict batch {b}: {} runs ({})", batch.len(), {
            let mut n = names.clone();
            n.dedup();
            n.join(", ")
        });
        let (before, wall) = (cpu_ticks(pid)?, std::time::Instant::now());
        let mut ran = run_batch(
            fs,
            poll,
            &release.join("memshape"),
            &parent,
            &cells,
            batch,
            b,
        )?;
        thread::sleep(Duration::from_secs(2));
        let share =
            (cpu_ticks(pid)? - before) as f64 / clock_ticks() / wall.elapsed().as_secs_f64()
                * 100.0;
        let mut seen: Vec<usize> = batch.iter().map(|(c, _)| *c).collect();
        seen.dedup();
        for c in seen {
            cpu.entry(c).or_default().push(share);
        }
        attach_events(&mut ran, &receiver.events());
        done.extend(ran);
    }
    report::keep(&out_dir, &cells, &done, &receiver.events())?;
    drop(agent);
    remove_tree(&parent);
    let cpu: BTreeMap<usize, f64> = cpu
        .into_iter()
        .map(|(c, shares)| (c, shares.iter().sum::<f64>() / shares.len() as f64))
        .collect();
    report::report(fs, &cells, &done, &cpu, &out_dir)
}

/// Makes a run's cgroups under `parent` as its cell says: `run-<b>-<j>`
/// with the limit, and for [`Limits::Parent`] the workload's own `job`
/// inside it; returns the workload's cgroup.
fn make_run(fs: Fs, top: &Path, cell: &Cell) -> anyhow::Result<PathBuf> {
    let limit = cell.limit_mib * MIB;
    fs.mkdir(top, cell.limits == Limits::Parent)?;
    fs.set_limit(top, limit)?;
    match cell.limits {
        Limits::Own => Ok(top.to_path_buf()),
        Limits::High => {
            fs.set_high(top, limit / 10 * 9)?;
            Ok(top.to_path_buf())
        }
        Limits::Parent => {
            let job = top.join("job");
            fs.mkdir(&job, false)?;
            fs.set_limit(&job, 1024 * MIB)?;
            Ok(job)
        }
    }
}

/// Runs every `(cell, seconds)` of a batch at once, each in its own
/// cgroup under `parent`, with the trace poller on all of them.
fn run_batch(
    fs: Fs,
    poll: Duration,
    memshape: &Path,
    parent: &Path,
    cells: &[Cell],
    batch: &[(usize, f64)],
    b: usize,
) -> anyhow::Result<Vec<Run>> {
    let mut tops = Vec::new();
    let mut dirs = Vec::new();
    for (j, (c, _)) in batch.iter().enumerate() {
        let top = parent.join(format!("run-{b}-{j}"));
        dirs.push(make_run(fs, &top, &cells[*c])?);
        tops.push(top);
    }
    let poller = Poller::start(fs, dirs.clone(), poll);
    // Let the agent's rule find the cgroups before anything grows.
    thread::sleep(Duration::from_secs(2));
    let mut threads = Vec::new();
    for (j, ((c, secs), dir)) in batch.iter().zip(&dirs).enumerate() {
        let cell = cells[*c];
        let line = cgroup_exec_line(
            dir,
            &format!(
                "{} {} {} {} {secs}",
                memshape.display(),
                cell.shape,
                cell.limit_mib,
                1000 * b + j
            ),
        );
        let (secs, dir) = (*secs, dir.clone());
        threads.push(thread::spawn(move || watch_one(fs, &line, secs, &dir)));
        // Staggered: the runs of a cell do not reach their limits together.
        thread::sleep(Duration::from_millis(300));
    }
    let mut runs = Vec::new();
    for ((t, (c, _)), dir) in threads.into_iter().zip(batch).zip(dirs) {
        let Ended {
            start,
            end,
            held,
            killed,
        } = t
            .join()
            .map_err(|_| anyhow::anyhow!("a run's thread panicked"))??;
        let limit = cells[*c].limit_mib * MIB;
        // A run of `steps` killed in its last step: before that step began
        // (the step before it logged, plus the 10 s plateau less a margin),
        // nothing threatened the limit.
        let calm_until = (cells[*c].shape == "steps" && killed)
            .then(|| held.last().map(|(t, _)| t + 9.5))
            .flatten();
        runs.push(Run {
            cell: *c,
            trace: Trace {
                limit,
                start,
                end,
                held,
                // The kernel's own stamp replaces this when the event has it.
                kill: killed.then_some(end),
                calm_until,
                ..Trace::default()
            },
            dir,
            own_lead: None,
            said: Warnings::default(),
        });
    }
    let (samples, psi) = poller.finish();
    for run in &mut runs {
        run.trace.samples = samples.get(&run.dir).cloned().unwrap_or_default();
        run.trace.psi = psi
            .get(&run.dir)
            .into_iter()
            .flatten()
            .filter(|(t, _)| *t >= run.trace.start && *t <= run.trace.end)
            .copied()
            .collect();
    }
    for top in &tops {
        remove_tree(top);
    }
    Ok(runs)
}

/// How a workload ended: its times, allocation log and whether it was
/// OOM-killed.
struct Ended {
    start: f64,
    end: f64,
    held: Vec<(f64, u64)>,
    killed: bool,
}

/// Each cgroup's samples, and its memory pressure (`some avg10`) over time.
type Polled = (
    BTreeMap<PathBuf, Vec<Sample>>,
    BTreeMap<PathBuf, Vec<(f64, f64)>>,
);

/// Runs one workload (`line`, a shell line) to its end: when it started
/// and ended, its allocation log, and whether the kernel OOM-killed it
/// (its cgroup's kill counter says so).
fn watch_one(fs: Fs, line: &str, secs: f64, dir: &Path) -> anyhow::Result<Ended> {
    let start = now();
    let mut child = Command::new("sh")
        .args(["-c", line])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("memshape's stdout")?;
    let reader = thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| {
                let mut words = l.split_whitespace().skip(1);
                let ns: u128 = words.next()?.parse().ok()?;
                let bytes: u64 = words.next()?.parse().ok()?;
                Some((ns as f64 / 1e9, bytes))
            })
            .collect::<Vec<_>>()
    });
    let bound = Duration::from_secs_f64(secs + 60.0);
    if wait_timeout(&mut child, bound)?.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        bail!("a memshape run ({line}) ran past {bound:?}");
    }
    let end = now();
    let held = reader
        .join()
        .map_err(|_| anyhow::anyhow!("memshape's reader panicked"))?;
    let killed = fs.oom_kills(dir) > 0;
    Ok(Ended {
        start,
        end,
        held,
        killed,
    })
}

/// Reads every run's cgroup files and memory pressure every `poll`.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Polled>,
}

impl Poller {
    fn start(fs: Fs, dirs: Vec<PathBuf>, poll: Duration) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let (mut samples, mut psi): Polled = Default::default();
            while !flag.load(Ordering::Relaxed) {
                // v1: one figure for the host, read once a round.
                let host = (fs == Fs::V1).then(|| fs.pressure(Path::new("/")));
                for dir in &dirs {
                    if let Some(s) = fs.sample(dir, now()) {
                        samples.entry(dir.clone()).or_default().push(s);
                    }
                    if let Some(some) = host.unwrap_or_else(|| fs.pressure(dir)) {
                        psi.entry(dir.clone()).or_default().push((now(), some));
                    }
                }
                thread::sleep(poll);
            }
            (samples, psi)
        });
        Poller { stop, thread }
    }

    fn finish(self) -> Polled {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Puts the agent's events on each run: its kill's kernel stamp and lead,
/// and what it said (`oom_imminent` / `oom_averted`) as [`Warnings`].
fn attach_events(runs: &mut [Run], events: &[(SystemTime, Value)]) {
    for run in runs {
        let cgroup = run.dir.to_string_lossy();
        let kill = events
            .iter()
            .find(|(_, e)| e["kind"] == "oom_kill" && e["cgroup"].as_str() == Some(&*cgroup));
        if let (Some((_, e)), Some(_)) = (kill, run.trace.kill) {
            run.trace.kill = time_of(e).or(run.trace.kill);
            run.own_lead = e["predicted_lead_seconds"].as_f64();
        }
        run.said = memwatch_said(run, events);
    }
}

/// What memwatch said of `run`: its `oom_imminent` and `oom_averted`
/// events for the run's cgroup, by their times, up to the kill.
fn memwatch_said(run: &Run, events: &[(SystemTime, Value)]) -> Warnings {
    let cgroup = run.dir.to_string_lossy();
    let until = run.trace.kill.unwrap_or(f64::INFINITY);
    let mut mine: Vec<(f64, Option<Option<f64>>)> = events
        .iter()
        .filter(|(_, e)| e["cgroup"].as_str() == Some(&*cgroup))
        .filter_map(|(_, e)| {
            let t = time_of(e)?;
            match e["kind"].as_str()? {
                "oom_imminent" => Some((t, Some(e["eta_seconds"].as_f64()))),
                "oom_averted" => Some((t, None)),
                _ => None,
            }
        })
        .filter(|(t, _)| *t <= until)
        .collect();
    mine.sort_by(|a, b| a.0.total_cmp(&b.0));
    Warnings::from_looks(mine)
}

fn time_of(event: &Value) -> Option<f64> {
    let t = humantime::parse_rfc3339(event["time"].as_str()?).ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_secs_f64())
}

impl Run {
    /// The plot's file name: the cell's shape, without `:`, and which
    /// limits it has when not only its own.
    fn trace_name(&self, cell: &Cell) -> String {
        let shape = cell.shape.replace(':', "-");
        match cell.limits {
            Limits::Own => shape,
            Limits::High => format!("{shape}-high"),
            Limits::Parent => format!("{shape}-parent"),
        }
    }
}
