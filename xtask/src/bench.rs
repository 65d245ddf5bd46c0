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
        Some(other) => bail!("unknown benchmark `{other}` (known: overhead)"),
    }
}

/// Probe overhead on a page-fault-heavy workload: no agent vs the agent
/// with its default probe attached.
fn overhead() -> anyhow::Result<()> {
    if !shell::is_root() {
        bail!("the overhead benchmark loads the eBPF probe: run it as root");
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
    let release = shell::workspace_root().join("target/release");
    let faultbench = release.join("faultbench");
    let memwatch = release.join("memwatch");

    let configs = ["no agent", "memwatch run (default probe)"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..ROUNDS {
        // Alternate the order so drift favours neither.
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        for i in order {
            let agent = (i == 1).then(|| Agent::start(&memwatch)).transpose()?;
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
    println!("| configuration | median time | ratio vs no agent |");
    println!("|---|---|---|");
    for (name, samples) in configs.iter().zip(&mut times) {
        let m = median(samples);
        println!("| {name} | {m:.3} s | {:.3} |", m / base);
    }
    Ok(())
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
struct Agent(Child);

impl Agent {
    fn start(bin: &std::path::Path) -> anyhow::Result<Agent> {
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start memwatch run")?;
        let agent = Agent(child);
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

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) to our own child; SIGTERM lets it drain and exit.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// `GET /ready` answers 200 (a bare HTTP/1.0 request: xtask keeps no HTTP client).
fn ready(port: u16) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream
        .write_all(b"GET /ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
}
