//! `cargo xtask bench guard`: the cluster guard across two hosts, many
//! times. Runs the two-host scheduler tests (two agents, one worker or node
//! each, both unhealthy at once, against a real Dask cluster and a real
//! Slurm cluster on loopback) `MEMWATCH_BENCH_RUNS` times each (default
//! 20) and prints how close each run came to the floor: the fewest Dask
//! workers listed, and the longest time both Slurm nodes were drained
//! before the tie-break undid one.

use std::{process::Command, time::Instant};

use anyhow::{Context as _, bail};

use crate::shell;

/// (test binary, test name, the line its figure is on).
const TESTS: [(&str, &str, &str); 2] = [
    (
        "host",
        "schedulers::dask::dask_two_hosts_never_retire_every_worker",
        "two hosts, both workers leaking:",
    ),
    (
        "host",
        "schedulers::slurm::slurm_two_hosts_never_drain_the_whole_partition",
        "two hosts, both workers unhealthy at once:",
    ),
];

pub(crate) fn guard() -> anyhow::Result<()> {
    if !memwatch_test_support::env::is_root() {
        bail!("bench guard: run it as root (cgroups, Dask and Slurm clusters)");
    }
    let runs: usize = std::env::var("MEMWATCH_BENCH_RUNS")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .context("MEMWATCH_BENCH_RUNS must be a number")?
        .unwrap_or(20);
    shell::build_bins(false)?;
    let mut rows = Vec::new();
    for (binary, test, marker) in TESTS {
        let mut passed = 0;
        let mut figures = Vec::new();
        let started = Instant::now();
        for run in 1..=runs {
            let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args([
                    "test",
                    "--locked",
                    "-p",
                    "memwatch-tests",
                    "--test",
                    binary,
                    test,
                ])
                .args(["--", "--exact", "--show-output"])
                .env("CI", "true")
                .current_dir(shell::workspace_root())
                .output()
                .with_context(|| format!("cargo test {test}"))?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let line = stdout.lines().find_map(|l| {
                l.find(marker)
                    .map(|i| l[i + marker.len()..].trim().to_string())
            });
            if out.status.success() {
                passed += 1;
            } else {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let why = stdout
                    .lines()
                    .skip_while(|l| !l.contains("panicked at"))
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" / ");
                let why = if why.is_empty() {
                    // Not a test's panic (a build, the harness): its last words.
                    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                } else {
                    why
                };
                eprintln!("bench guard: {test} run {run} FAILED: {why}");
            }
            eprintln!(
                "bench guard: {test} run {run}/{runs}: {}",
                line.as_deref().unwrap_or("-")
            );
            figures.extend(line.as_deref().and_then(|l| figure(test, l)));
        }
        rows.push((test, runs, passed, figures, started.elapsed()));
    }
    println!(
        "\n{:<50} {:>5} {:>7}  closest to the floor",
        "test", "runs", "passed"
    );
    for (test, runs, passed, figures, took) in rows {
        let closest = match figures.iter().copied().reduce(f64::max) {
            None => "-".to_string(),
            Some(_) if test.starts_with("schedulers::dask") => format!(
                "fewest workers listed: {} (floor 1)",
                figures.iter().copied().fold(f64::MAX, f64::min)
            ),
            Some(max) => format!("both nodes drained at most {max:.3} s (then one resumed)"),
        };
        println!(
            "{test:<50} {runs:>5} {passed:>7}  {closest}  ({:.0} s)",
            took.as_secs_f64()
        );
    }
    Ok(())
}

/// The run's figure from its line: Dask, the fewest workers listed; Slurm,
/// seconds both nodes were drained. `test` is the test's full name.
fn figure(test: &str, line: &str) -> Option<f64> {
    if test.starts_with("schedulers::dask::") {
        let rest = &line[line.find("fewest listed: ")? + "fewest listed: ".len()..];
        rest.split(';').next()?.trim().parse().ok()
    } else {
        let rest = &line[line.find("drained for at most ")? + "drained for at most ".len()..];
        let text = rest.split(';').next()?.trim();
        duration_seconds(text)
    }
}

/// Seconds from a Rust `Duration` debug form: `0ns`, `12.5ms`, `2.01s`.
fn duration_seconds(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?;
    let (number, unit) = text.split_at(split);
    let n: f64 = number.parse().ok()?;
    let scale = match unit {
        "ns" => 1e-9,
        "µs" | "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    };
    Some(n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_from_the_tests_lines() {
        assert_eq!(
            figure(TESTS[0].1, "w2 kept; fewest listed: 1; first said 7.3s"),
            Some(1.0)
        );
        assert_eq!(
            figure(
                TESTS[1].1,
                "n2 drained 2.27s after the leak started; both nodes drained for at most 12.5ms; the other"
            ),
            Some(0.0125)
        );
        assert_eq!(
            figure(TESTS[1].1, "both nodes drained for at most 0ns; x"),
            Some(0.0)
        );
        assert_eq!(figure(TESTS[0].1, "no figure"), None);
    }
}
