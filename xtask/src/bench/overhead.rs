//! `cargo xtask bench overhead`: the probe's cost on a page-fault-heavy
//! workload and on a realistic one, beside no agent and an empty program.
//! The page-fault workload runs twice: outside any watched cgroup, and in a
//! memory cgroup a `[[rule]]` makes a task, over half its limit, where the
//! kill predictor follows it with the kernel's samples (issue 24: the
//! overhead stays within 1.05×). Each figure is a median over interleaved
//! rounds, so a noisy neighbour hurts every configuration alike.

use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use memwatch_test_support::{
    http::http_get, metrics::metric, process::cgroup_exec_line, stats::median,
};

use super::{
    baseline::Baseline,
    builds,
    compare::{self, Figure},
    release_bins, start_agent,
};

/// A configuration: its name, and the agent binary and flags (or none).
type Config<'a> = (String, Option<(&'a Path, &'a [&'a str])>);
/// A workload run once: its time in seconds.
type Workload<'a> = &'a dyn Fn() -> anyhow::Result<f64>;

/// Rounds per configuration.
const ROUNDS: usize = 5;
/// The followed faultbench's memory cgroup (v1), and its limit: the 2 GiB
/// it maps sit at two thirds of it, inside the band where the predictor
/// wants 10 samples a second from the kernel (over half of a limit).
const FOLLOWED: &str = "/sys/fs/cgroup/memory/memwatch-overhead";
const FOLLOWED_LIMIT: u64 = 3 << 30;

/// Probe overhead: no agent, an empty program on the growth hook, and the
/// agent with its default probe, on a page-fault-heavy workload and on a
/// realistic one (a parallel C build and a sort/compress data pipeline).
/// With a baseline, its agent is one more configuration of the same
/// rounds, and the figures compare the two agents' slowdowns.
pub(super) fn overhead(baseline: Option<&Baseline>) -> anyhow::Result<Vec<Figure>> {
    let release = release_bins("the overhead benchmark loads the eBPF probe")?;
    let faultbench = release.join("faultbench");
    let agents = builds(&release, baseline)?;
    let job = DataJob::prepare()?;
    let followed = Followed::prepare()?;
    let config = followed.config.to_string_lossy().into_owned();
    let workloads: [(&str, &str, Workload<'_>); 3] = [
        (
            "faultbench",
            "faultbench (mmap 2 GiB, touch every 4 KiB page, unmap; 3 times; THP off)",
            &|| time_workload(&faultbench, None),
        ),
        (
            "faultbench, followed",
            "faultbench in a memory cgroup limited to 3 GiB that a `[[rule]]` makes a task: \
             the predictor follows it over half its limit (kernel samples, 10 reads a second)",
            &|| time_workload(&faultbench, Some(&followed.run)),
        ),
        (
            "build + data job",
            "build + data job (gcc -O2 of 12 generated C files, 2 in parallel; \
             seq | sort -R | gzip | gunzip | sort -n of 300 k lines)",
            &|| job.run(),
        ),
    ];
    // Every agent runs with the rule that makes the followed cgroup a
    // task; the other workloads run outside it, so it changes nothing there.
    let floor_flags = ["--probe-floor", "--config", &config];
    let flags = ["--config", &config];
    let mut configs: Vec<Config<'_>> = vec![
        ("no agent".into(), None),
        (
            "empty program on the same hooks".into(),
            Some((&agents[0].1, &floor_flags)),
        ),
    ];
    for (name, bin) in &agents {
        configs.push((
            format!("memwatch run {name} (default probe)"),
            Some((bin, &flags)),
        ));
    }
    let mut figures = Vec::new();
    for (short, title, workload) in workloads {
        let mut medians = rounds(&configs, workload)?;
        print_times(title, &configs, &mut medians);
        let slowdown: Vec<f64> = medians[2..].iter().map(|m| m / medians[0]).collect();
        figures.push(Figure::new(
            "overhead",
            format!("{short}: time ratio vs no agent"),
            &slowdown,
        ));
    }
    let mut costs = Vec::new();
    for (name, bin) in &agents {
        let (program, runs, seconds) =
            program_cost(bin, &|| time_workload(&faultbench, None), &[], "growth_btf")?;
        costs.push((format!("{program} ({name})"), runs, seconds));
    }
    let floor = program_cost(
        &agents[0].1,
        &|| time_workload(&faultbench, None),
        &["--probe-floor"],
        "growth_floor_btf",
    )?;
    let job_cost = program_cost(&agents[0].1, &|| job.run(), &[], "growth_btf")?;
    let followed_cost = followed.cost(&agents[0].1, &faultbench)?;
    let per_run: Vec<f64> = costs.iter().map(|c| c.2 * 1e9 / c.1.max(1.0)).collect();
    figures.push(Figure::new(
        "overhead",
        "faultbench: growth program ns per run",
        &per_run,
    ));
    print_costs(floor, costs, job_cost);
    followed_cost.print();
    Ok(figures)
}

/// The followed workload's memory cgroup (`run`, limited to
/// [`FOLLOWED_LIMIT`]) under a worker's, and the agent's config that makes
/// it a task; removed on drop.
struct Followed {
    parent: std::path::PathBuf,
    run: std::path::PathBuf,
    config: std::path::PathBuf,
}

impl Followed {
    fn prepare() -> anyhow::Result<Followed> {
        let parent = std::path::PathBuf::from(FOLLOWED);
        let run = parent.join("run");
        let _ = std::fs::remove_dir(&run);
        std::fs::create_dir_all(&run).with_context(|| format!("mkdir {}", run.display()))?;
        std::fs::write(
            run.join("memory.limit_in_bytes"),
            FOLLOWED_LIMIT.to_string(),
        )
        .with_context(|| format!("limit {}", run.display()))?;
        let config =
            std::env::temp_dir().join(format!("memwatch-overhead-{}.toml", std::process::id()));
        std::fs::write(&config, Self::rules(&parent))?;
        Ok(Followed {
            parent,
            run,
            config,
        })
    }

    fn rules(parent: &Path) -> String {
        format!(
            "[[worker]]\nname = \"bench\"\ncgroup = \"{p}\"\nsoft_cap = \"1TiB\"\n\n\
             [[rule]]\nworker = \"bench\"\ncgroup = \"{p}/run\"\nsoft_cap = \"1TiB\"\n",
            p = parent.display()
        )
    }

    /// One followed faultbench under this tree's agent with BPF run-time
    /// statistics on: what the kernel pushed and the agent read for it.
    fn cost(&self, memwatch: &Path, faultbench: &Path) -> anyhow::Result<FollowedCost> {
        // The rule finds the cgroup (made before the agent starts) first.
        let (secs, metrics) = with_stats(
            memwatch,
            &Self::rules(&self.parent),
            &[],
            Duration::from_secs(2),
            &|| time_workload(faultbench, Some(&self.run)),
        )?;
        let value = |series: &str| metric(&metrics, series).unwrap_or(0.0);
        let cost = FollowedCost {
            secs,
            samples: value(r#"memwatch_growth_lines_total{line="sample"}"#),
            kernel_reads: value(r#"memwatch_predict_reads_total{why="kernel"}"#),
            runs: value(r#"memwatch_probe_program_runs_total{program="growth_btf"}"#),
            run_seconds: value(r#"memwatch_probe_program_run_seconds_total{program="growth_btf"}"#),
        };
        if cost.samples == 0.0 {
            bail!(
                "the followed faultbench got no kernel sample: the predictor did not follow {}",
                self.run.display()
            );
        }
        Ok(cost)
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.run);
        let _ = std::fs::remove_dir(&self.parent);
        let _ = std::fs::remove_file(&self.config);
    }
}

/// What one followed faultbench cost, from the agent's `/metrics`.
struct FollowedCost {
    secs: f64,
    samples: f64,
    kernel_reads: f64,
    runs: f64,
    run_seconds: f64,
}

impl FollowedCost {
    fn print(&self) {
        println!(
            "\nThe followed faultbench, once more with statistics on ({:.3} s): the kernel pushed \
             {:.0} samples ({:.1} a second), the predictor read the cgroup {:.0} times on them; \
             growth_btf ran {:.0} times, {:.1} ns per run, {:.1} ms in all",
            self.secs,
            self.samples,
            self.samples / self.secs.max(1e-9),
            self.kernel_reads,
            self.runs,
            self.run_seconds * 1e9 / self.runs.max(1.0),
            self.run_seconds * 1e3
        );
    }
}

/// [`ROUNDS`] interleaved rounds of `workload` under each configuration
/// (an agent binary and its flags, or none); each one's median time.
fn rounds(configs: &[Config<'_>], workload: Workload<'_>) -> anyhow::Result<Vec<f64>> {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..ROUNDS {
        // Rotate the order so drift favours none.
        for k in 0..configs.len() {
            let i = (k + round) % configs.len();
            let agent = match configs[i].1 {
                None => None,
                Some((bin, flags)) => Some(start_agent(bin, flags)?),
            };
            let secs = workload()?;
            drop(agent);
            eprintln!("xtask: round {round}: {:<40} {secs:.3}s", configs[i].0);
            times[i].push(secs);
        }
    }
    Ok(times.iter_mut().map(|t| median(t)).collect())
}

fn print_times(title: &str, configs: &[Config<'_>], medians: &mut [f64]) {
    let (base, floor) = (medians[0], medians[1]);
    println!("\nProbe overhead: {title}");
    println!("median of {ROUNDS} interleaved rounds\n");
    println!("| configuration | median time | ratio vs no agent | ratio vs empty program |");
    println!("|---|---|---|---|");
    for ((name, _), m) in configs.iter().zip(medians.iter()) {
        println!("| {name} | {m:.3} s | {:.3} | {:.3} |", m / base, m / floor);
    }
    if let [.., now, then] = medians[2..] {
        println!(
            "\nthis tree / baseline, median time under the agent: {}",
            compare::ratio_cell(now, Some(then))
        );
    }
}

type Cost = (String, f64, f64);

fn print_costs(floor: Cost, faultbench: Vec<Cost>, job: Cost) {
    println!(
        "\nCost of the growth program itself (kernel run-time statistics; one faultbench run \
         each, then one build + data job run):\n"
    );
    println!("| program | runs | ns per run | total ms |");
    println!("|---|---|---|---|");
    let job = (format!("{} (build + data job)", job.0), job.1, job.2);
    for (program, runs, seconds) in std::iter::once(floor).chain(faultbench).chain([job]) {
        println!(
            "| {program} | {runs:.0} | {:.1} | {:.1} |",
            seconds * 1e9 / runs.max(1.0),
            seconds * 1e3
        );
    }
}

/// A realistic job: a parallel build of generated C sources, then a data
/// pipeline through pipes (many context switches, each a run of the growth
/// hook) with sort holding its input in memory.
struct DataJob {
    dir: std::path::PathBuf,
}

impl DataJob {
    const SOURCES: usize = 12;

    fn prepare() -> anyhow::Result<DataJob> {
        let dir = std::env::temp_dir().join(format!("memwatch-bench-job-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        for n in 0..Self::SOURCES {
            let mut source = String::new();
            for f in 0..20 {
                source.push_str(&format!(
                    "double f{f}(const double *v, int n) {{\n\
                     \tdouble acc = {n}.0;\n\
                     \tfor (int i = 0; i < n; i++) {{\n\
                     \t\tfor (int j = i; j < n && j < i + {f} + 3; j++)\n\
                     \t\t\tacc += v[i] * v[j] / (1.0 + (double)(i ^ j));\n\
                     \t\tif (acc > 1e9) acc = acc / 3.0 - v[i];\n\
                     \t}}\n\
                     \treturn acc;\n}}\n"
                ));
            }
            std::fs::write(dir.join(format!("unit{n}.c")), source)?;
        }
        Ok(DataJob { dir })
    }

    fn run(&self) -> anyhow::Result<f64> {
        let script = "rm -f *.o && ls *.c | xargs -P2 -n1 gcc -O2 -c && \
                      seq 1 300000 | sort -R | gzip -1 | gunzip | sort -n | md5sum >/dev/null";
        let start = Instant::now();
        let out = Command::new("sh")
            .args(["-ec", script])
            .current_dir(&self.dir)
            .output()
            .context("run the build + data job")?;
        let secs = start.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!(
                "the build + data job failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(secs)
    }
}

impl Drop for DataJob {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the workload once under an agent with BPF run-time statistics on,
/// and reads `program`'s run count and run time from `/metrics`.
fn program_cost(
    memwatch: &Path,
    workload: &dyn Fn() -> anyhow::Result<f64>,
    extra: &[&str],
    program: &str,
) -> anyhow::Result<(String, f64, f64)> {
    let (_, metrics) = with_stats(memwatch, "", extra, Duration::ZERO, workload)?;
    let value =
        |name: &str| metric(&metrics, &format!("{name}{{program=\"{program}\"}}")).unwrap_or(0.0);
    Ok((
        program.to_string(),
        value("memwatch_probe_program_runs_total"),
        value("memwatch_probe_program_run_seconds_total"),
    ))
}

/// Runs the workload once under an agent with BPF run-time statistics on
/// (and `config` beside them, `flags` on its command line), `settle` after
/// the agent is ready: the workload's seconds and the agent's `/metrics`
/// after it.
fn with_stats(
    memwatch: &Path,
    config: &str,
    flags: &[&str],
    settle: Duration,
    workload: &dyn Fn() -> anyhow::Result<f64>,
) -> anyhow::Result<(f64, String)> {
    let path = std::env::temp_dir().join(format!("memwatch-bench-{}.toml", std::process::id()));
    std::fs::write(&path, format!("bpf_stats = true\n{config}"))?;
    let path_arg = path.to_string_lossy().into_owned();
    let mut args = vec!["--config", path_arg.as_str()];
    args.extend(flags);
    let agent = start_agent(memwatch, &args)?;
    thread::sleep(settle);
    let secs = workload()?;
    // The agent publishes program statistics every second.
    thread::sleep(Duration::from_millis(1500));
    let metrics = http_get(agent.port, "/metrics")?;
    drop(agent);
    let _ = std::fs::remove_file(&path);
    Ok((secs, metrics))
}

/// Runs `bin` once (in the memory cgroup `cgroup`, if given) and returns
/// the seconds it printed.
fn time_workload(bin: &Path, cgroup: Option<&Path>) -> anyhow::Result<f64> {
    let mut command = match cgroup {
        None => Command::new(bin),
        Some(dir) => {
            let mut sh = Command::new("sh");
            sh.args(["-c", &cgroup_exec_line(dir, &bin.to_string_lossy())]);
            sh
        }
    };
    let out = command
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("faultbench prints seconds")
}
