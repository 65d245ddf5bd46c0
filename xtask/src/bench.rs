//! `cargo xtask bench`: figures measured side by side in one run, printed
//! as ratios. Each figure is a median over interleaved rounds, so a noisy
//! neighbour hurts every configuration alike.

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::shell;

/// Rounds per configuration.
const ROUNDS: usize = 5;

pub fn run(which: Option<&str>) -> anyhow::Result<()> {
    match which {
        None | Some("overhead") => overhead(),
        Some("delay") => crate::bench_delay::delay(),
        Some("idle") => crate::bench_idle::idle(),
        Some("storm") => crate::bench_storm::storm(),
        Some(other) => bail!("unknown benchmark `{other}` (known: overhead, delay, idle, storm)"),
    }
}

/// Probe overhead on a page-fault-heavy workload: no agent vs the agent
/// with its default probe attached.
fn overhead() -> anyhow::Result<()> {
    let release = release_bins("the overhead benchmark loads the eBPF probe")?;
    let faultbench = release.join("faultbench");
    let memwatch = release.join("memwatch");

    let configs = [
        "no agent",
        "empty program on the same hooks",
        "memwatch run (default probe)",
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..ROUNDS {
        // Rotate the order so drift favours none.
        let order: Vec<usize> = (0..configs.len())
            .map(|k| (k + round) % configs.len())
            .collect();
        for i in order {
            let agent = match i {
                0 => None,
                1 => Some(Agent::start(&memwatch, &["--probe-floor"])?),
                _ => Some(Agent::start(&memwatch, &[])?),
            };
            let secs = time_workload(&faultbench)?;
            drop(agent);
            eprintln!("xtask: round {round}: {:<30} {secs:.3}s", configs[i]);
            times[i].push(secs);
        }
    }
    let base = median(&mut times[0].clone());
    println!(
        "\nProbe overhead: faultbench (mmap 2 GiB, touch every 4 KiB page, unmap; 3 times; THP off)"
    );
    println!("median of {ROUNDS} interleaved rounds\n");
    let per_run = [
        program_cost(
            &memwatch,
            &faultbench,
            &["--probe-floor"],
            "rss_stat_floor_btf",
        )?,
        program_cost(&memwatch, &faultbench, &[], "rss_stat_btf")?,
    ];
    let floor = median(&mut times[1].clone());
    println!("| configuration | median time | ratio vs no agent | ratio vs empty program |");
    println!("|---|---|---|---|");
    for (name, samples) in configs.iter().zip(&mut times) {
        let m = median(samples);
        println!("| {name} | {m:.3} s | {:.3} | {:.3} |", m / base, m / floor);
    }
    println!(
        "\nCost of the program on `rss_stat` itself (kernel run-time statistics, one faultbench run):\n"
    );
    println!("| program | runs | ns per run |");
    println!("|---|---|---|");
    for (program, runs, seconds) in per_run {
        println!(
            "| {program} | {runs:.0} | {:.1} |",
            seconds * 1e9 / runs.max(1.0)
        );
    }
    Ok(())
}

/// Runs the workload once under an agent with BPF run-time statistics on,
/// and reads `program`'s run count and run time from `/metrics`.
fn program_cost(
    memwatch: &std::path::Path,
    faultbench: &std::path::Path,
    extra: &[&str],
    program: &str,
) -> anyhow::Result<(String, f64, f64)> {
    let config = std::env::temp_dir().join(format!("memwatch-bench-{}.toml", std::process::id()));
    std::fs::write(&config, "bpf_stats = true\n")?;
    let mut args = vec!["--config", config.to_str().unwrap_or_default()];
    args.extend(extra);
    let agent = Agent::start(memwatch, &args)?;
    time_workload(faultbench)?;
    // The agent publishes program statistics every second.
    thread::sleep(Duration::from_millis(1500));
    let metrics = http_get(agent.port, "/metrics")?;
    drop(agent);
    let value = |metric: &str| -> f64 {
        let prefix = format!("{metric}{{program=\"{program}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok((
        program.to_string(),
        value("memwatch_probe_program_runs_total"),
        value("memwatch_probe_program_run_seconds_total"),
    ))
}

/// Checks for root (saying why `what` needs it), builds the agent and the
/// workload binaries in release, and returns their directory.
pub fn release_bins(what: &str) -> anyhow::Result<std::path::PathBuf> {
    if !shell::is_root() {
        bail!("{what}: run it as root");
    }
    shell::cargo(&[
        "build",
        "--release",
        "--locked",
        "-p",
        "memwatch",
        "-p",
        "memwatch-tests",
        "--bins",
    ])?;
    Ok(shell::workspace_root().join("target/release"))
}

fn time_workload(bin: &std::path::Path) -> anyhow::Result<f64> {
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

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// `memwatch run` on a free loopback port, ready; stopped on drop.
pub struct Agent {
    child: Child,
    pub port: u16,
}

impl Agent {
    pub fn start(bin: &std::path::Path, extra: &[&str]) -> anyhow::Result<Agent> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let state = std::env::temp_dir().join(format!("memwatch-bench-{port}"));
        let child = Command::new(bin)
            .args([
                "run",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--state-dir",
            ])
            .arg(&state)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start memwatch run")?;
        let agent = Agent { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(port) {
            if Instant::now() > deadline {
                bail!("memwatch run not ready after 30 s");
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(agent)
    }
}

impl Agent {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) to our own child; SIGTERM lets it drain and exit.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// `GET /ready` answers 200.
fn ready(port: u16) -> bool {
    http_get(port, "/ready").is_ok_and(|answer| {
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
    })
}

/// A bare HTTP/1.0 GET on loopback (xtask keeps no HTTP client): the whole answer.
pub fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
