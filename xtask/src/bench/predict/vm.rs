//! `cargo xtask bench predict-v2`: the predict bench's cgroup v2 cells
//! ([`super::V2_KILLING`]) on Debian's 6.1 and 6.12 kernels, booted in QEMU
//! by `vm-test`'s machinery with an init that runs this very xtask
//! (`bench-in-vm`) on the release binaries instead of the kernel tests.
//! Each kernel's tables are printed as the VM printed them, its figures
//! named after the kernel, its plots written to
//! `target/bench/predict/v2-<kernel>/`.
//!
//! The VMs run under TCG here (`docs/development.md`): the workloads'
//! rates and the kernel's stamps are the VM's own clock, so lead times and
//! ETA errors hold; the agent's CPU share is of an emulated core.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, bail};

use crate::{bench::compare::Figure, shell::workspace_root};

/// The kernels the cells run on (pure cgroup v2 in the VM).
const KERNELS: [&str; 2] = ["6.1", "6.12"];
/// QEMU's memory: [`super::V2_PARALLEL`] runs of 256 MiB at once, the
/// agent, and the initramfs (held in memory), with room.
const VM_MEMORY: &str = "4G";
/// Per kernel, boot and the cells (×4 under TCG).
const TIMEOUT: Duration = Duration::from_secs(900);

/// The trace poller's interval in the VM: under TCG one host thread
/// emulates both CPUs, and reading five cgroups' three files every 25 ms
/// (the host's interval) would take its time from the agent and the
/// workloads. The 95 % threshold's replay is late by at
/// most this; every other rival looks at 250 ms or longer.
const POLL: Duration = Duration::from_millis(100);
/// Console lines the VM's xtask prints and the host reads back.
const BEGIN: &str = "MEMWATCH-BENCH-BEGIN";
const END: &str = "MEMWATCH-BENCH-END";
const FIGURE: &str = "MEMWATCH-BENCH-FIGURE\t";
const FILE: &str = "MEMWATCH-BENCH-FILE\t";

/// Boots the kernels with the release binaries in `release` and this
/// xtask, runs the v2 cells in each, prints each kernel's tables and
/// returns its figures.
pub(super) fn predict_v2(release: &Path) -> anyhow::Result<Vec<Figure>> {
    let xtask = std::env::current_exe().context("this xtask's path")?;
    let binaries = [
        release.join("memwatch"),
        release.join("memshape"),
        xtask.clone(),
    ];
    // The kernel's own OOM lines would break the tables' lines on the console.
    // The host's choice of runs per cell goes in with it.
    let runs = super::runs()?;
    let command = format!(
        "dmesg -n 1; {}={runs} '{}' bench-in-vm --bins '{}'",
        super::RUNS_ENV,
        xtask.display(),
        release.display()
    );
    let dir = workspace_root().join("target/vm/bench");
    eprintln!(
        "xtask: predict-v2: booting {} (console on stderr, logs in {})",
        KERNELS.join(" and "),
        dir.display()
    );
    let ran = crate::vm::run_command(&KERNELS, &binaries, &command, &dir, VM_MEMORY, TIMEOUT)?;
    let mut figures = Vec::new();
    let mut failed = Vec::new();
    for (outcome, lines) in &ran {
        let got = read_back(lines);
        let plots = workspace_root()
            .join("target/bench/predict")
            .join(format!("v2-{}", outcome.spec));
        std::fs::create_dir_all(&plots)?;
        for (name, text) in &got.files {
            std::fs::write(plots.join(name), text)?;
        }
        println!("\n# Kernel {} ({})\n", outcome.spec, outcome.package);
        for line in &got.report {
            println!("{line}");
        }
        println!("Plots: {}\n", plots.display());
        figures.extend(got.figures.into_iter().map(|(name, value)| {
            Figure::new("predict", format!("{} {name}", outcome.spec), &[value])
        }));
        if outcome.exit != Some(0) || outcome.problem.is_some() || !got.ended {
            failed.push(format!(
                "{}: exit {:?}{}{}",
                outcome.spec,
                outcome.exit,
                outcome
                    .problem
                    .as_ref()
                    .map_or(String::new(), |p| format!(", {p}")),
                if got.ended { "" } else { ", no end line" }
            ));
        }
    }
    if !failed.is_empty() {
        bail!("predict-v2 failed in: {}", failed.join("; "));
    }
    Ok(figures)
}

/// Inside the VM: the cells of its hierarchy, then each figure and each
/// plot as console lines between [`BEGIN`] and [`END`].
pub(crate) fn inside(bins: &Path) -> anyhow::Result<()> {
    println!("{BEGIN}");
    let figures = super::run_here(bins, POLL)?;
    for f in &figures {
        println!("{FIGURE}{}\t{}", f.name, f.this);
    }
    let out_dir = workspace_root().join("target/bench/predict");
    let mut plots: Vec<_> = std::fs::read_dir(&out_dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "svg"))
        .collect();
    plots.sort();
    for plot in plots {
        let name = plot.file_name().map(|n| n.to_string_lossy().into_owned());
        let text = std::fs::read_to_string(&plot)?;
        for line in text.lines() {
            println!("{FILE}{}\t{line}", name.as_deref().unwrap_or("plot.svg"));
        }
    }
    println!("{END}");
    Ok(())
}

/// What the VM's xtask printed between [`BEGIN`] and [`END`].
#[derive(Debug, Default, PartialEq)]
struct ReadBack {
    /// The tables, line by line.
    report: Vec<String>,
    figures: Vec<(String, f64)>,
    /// Each file's name and text.
    files: Vec<(String, String)>,
    /// Whether the end line came.
    ended: bool,
}

fn read_back(lines: &[String]) -> ReadBack {
    let mut got = ReadBack::default();
    let mut inside = false;
    for line in lines {
        let line = crate::vm::marker_line(line);
        if line.starts_with(BEGIN) {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if line.starts_with(END) {
            got.ended = true;
            break;
        } else if let Some(rest) = line.strip_prefix(FIGURE) {
            if let Some((name, value)) = rest.rsplit_once('\t') {
                got.figures
                    .push((name.to_string(), value.parse().unwrap_or(f64::NAN)));
            }
        } else if let Some(rest) = line.strip_prefix(FILE) {
            let (name, text) = rest.split_once('\t').unwrap_or((rest, ""));
            match got.files.last_mut() {
                Some((last, body)) if last == name => {
                    body.push_str(text);
                    body.push('\n');
                }
                _ => got.files.push((name.to_string(), format!("{text}\n"))),
            }
        } else if !line.starts_with("xtask: ") {
            got.report.push(line.to_string());
        }
    }
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vms_lines_give_tables_figures_and_plots() {
        let lines: Vec<String> = [
            "[    3.1] booting",
            "ignored before the begin line",
            BEGIN,
            "xtask: predict batch 0: 5 runs (v2: leak 10 MiB/s)",
            "## Predicting the kill (cgroup v2, Linux 6.12.0)",
            "| memwatch | 10 of 10 |",
            "MEMWATCH-BENCH-FIGURE\tv2: leak 10 MiB/s: lead p50 s\t15.5",
            "MEMWATCH-BENCH-FILE\tleak-10.svg\t<svg>",
            "MEMWATCH-BENCH-FILE\tleak-10.svg\t</svg>",
            "MEMWATCH-BENCH-FILE\tparent.svg\t<svg/>",
            END,
            "after the end",
        ]
        .map(String::from)
        .to_vec();
        let got = read_back(&lines);
        assert!(got.ended);
        assert_eq!(
            got.report,
            vec![
                "## Predicting the kill (cgroup v2, Linux 6.12.0)".to_string(),
                "| memwatch | 10 of 10 |".to_string()
            ]
        );
        assert_eq!(
            got.figures,
            vec![("v2: leak 10 MiB/s: lead p50 s".to_string(), 15.5)]
        );
        assert_eq!(
            got.files,
            vec![
                ("leak-10.svg".to_string(), "<svg>\n</svg>\n".to_string()),
                ("parent.svg".to_string(), "<svg/>\n".to_string())
            ]
        );
        // A VM that stopped half way says so.
        assert!(!read_back(&lines[..6]).ended);
    }
}
