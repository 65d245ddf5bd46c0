//! `cargo xtask bench overhead`: the probe's cost on a page-fault-heavy
//! workload and on a realistic one, beside no agent and an empty program.
//! Each figure is a median over interleaved rounds, so a noisy neighbour
//! hurts every configuration alike.

use std::{
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use memwatch_test_support::{http::http_get, metrics::metric, stats::median};

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
    let workloads: [(&str, &str, Workload<'_>); 2] = [
        (
            "faultbench",
            "faultbench (mmap 2 GiB, touch every 4 KiB page, unmap; 3 times; THP off)",
            &|| time_workload(&faultbench),
        ),
        (
            "build + data job",
            "build + data job (gcc -O2 of 12 generated C files, 2 in parallel; \
             seq | sort -R | gzip | gunzip | sort -n of 300 k lines)",
            &|| job.run(),
        ),
    ];
    let mut configs: Vec<Config<'_>> = vec![
        ("no agent".into(), None),
        (
            "empty program on the same hooks".into(),
            Some((&agents[0].1, &["--probe-floor"])),
        ),
    ];
    for (name, bin) in &agents {
        configs.push((
            format!("memwatch run {name} (default probe)"),
            Some((bin, &[])),
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
            program_cost(bin, &|| time_workload(&faultbench), &[], "growth_btf")?;
        costs.push((format!("{program} ({name})"), runs, seconds));
    }
    let floor = program_cost(
        &agents[0].1,
        &|| time_workload(&faultbench),
        &["--probe-floor"],
        "growth_floor_btf",
    )?;
    let job_cost = program_cost(&agents[0].1, &|| job.run(), &[], "growth_btf")?;
    let per_run: Vec<f64> = costs.iter().map(|c| c.2 * 1e9 / c.1.max(1.0)).collect();
    figures.push(Figure::new(
        "overhead",
        "faultbench: growth program ns per run",
        &per_run,
    ));
    print_costs(floor, costs, job_cost);
    Ok(figures)
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
    let config = std::env::temp_dir().join(format!("memwatch-bench-{}.toml", std::process::id()));
    std::fs::write(&config, "bpf_stats = true\n")?;
    let mut args = vec!["--config", config.to_str().unwrap_or_default()];
    args.extend(extra);
    let agent = start_agent(memwatch, &args)?;
    workload()?;
    // The agent publishes program statistics every second.
    thread::sleep(Duration::from_millis(1500));
    let metrics = http_get(agent.port, "/metrics")?;
    drop(agent);
    let value =
        |name: &str| metric(&metrics, &format!("{name}{{program=\"{program}\"}}")).unwrap_or(0.0);
    Ok((
        program.to_string(),
        value("memwatch_probe_program_runs_total"),
        value("memwatch_probe_program_run_seconds_total"),
    ))
}

fn time_workload(bin: &Path) -> anyhow::Result<f64> {
    let out = Command::new(bin)
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
