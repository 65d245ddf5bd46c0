//! What `bench predict` prints and keeps: a table per cell (memwatch,
//! then each rival replayed on the same traces), the plots, the raw
//! events and traces, and memwatch's figures for the summary.

use std::{collections::BTreeMap, path::Path, time::SystemTime};

use serde_json::Value;

use super::{
    Cell, Run,
    cgroup::Fs,
    plot,
    rivals::{self, RIVALS},
    score::{LEFT, Score},
};
use crate::bench::compare::Figure;

/// Prints a table per cell (memwatch, then each rival), writes the plots,
/// and returns memwatch's figures.
pub(super) fn report(
    fs: Fs,
    cells: &[Cell],
    runs: &[Run],
    cpu: &BTreeMap<usize, f64>,
    out_dir: &Path,
) -> anyhow::Result<Vec<Figure>> {
    let mut figures = Vec::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "\n## Predicting the kill ({}, Linux {}; lead = kernel kill stamp − first oom_imminent)\n",
        fs.name(),
        kernel.trim()
    );
    for (c, cell) in cells.iter().enumerate() {
        let mine: Vec<(usize, &Run)> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.cell == c)
            .collect();
        let Some((_, first)) = mine.first() else {
            continue;
        };
        let mut scores = vec![Score::default(); 1 + RIVALS.len()];
        for (i, run) in &mine {
            scores[0].add(&run.trace, &run.said);
            let phase = (*i as f64 * 0.618_034).fract();
            for (score, said) in scores[1..]
                .iter_mut()
                .zip(rivals::replay(&run.trace, phase))
            {
                score.add(&run.trace, &said);
            }
        }
        let own: Vec<f64> = mine
            .iter()
            .filter_map(|(_, r)| {
                let (kill, said) = (r.trace.kill?, r.said.open_at(r.trace.kill?)?);
                Some(r.own_lead? - (kill - said.0))
            })
            .collect();
        println!(
            "### {} ({} runs, limit {} MiB; memwatch's CPU {:.2} % of a core over the batch)\n",
            cell.name,
            mine.len(),
            cell.limit_mib,
            cpu.get(&c).copied().unwrap_or(f64::NAN)
        );
        println!(
            "| watcher | killed | lead p10 / p50 s | warned ≥ 5 s | ETA error p90 at 2 / 5 / 10 s | false alarms | per hour |"
        );
        println!("|---|---|---|---|---|---|---|");
        let names = std::iter::once("memwatch").chain(RIVALS);
        for (name, s) in names.zip(&scores) {
            let errors: Vec<String> = (0..LEFT.len())
                .map(|i| match s.error_p90(i) {
                    (_, 0) => "–".to_string(),
                    (p90, n) => format!("{:.0} % (of {n})", p90 * 100.0),
                })
                .collect();
            println!(
                "| {name} | {} of {} | {} / {} | {} of {} | {} | {} | {:.1} |",
                s.kills,
                s.runs,
                seconds(s.lead(0.1)),
                seconds(s.lead(0.5)),
                s.recalled,
                s.kills,
                errors.join(" / "),
                s.false_alarms,
                s.false_per_hour()
            );
        }
        let agree = own.iter().map(|d| d.abs()).fold(0.0, f64::max);
        println!(
            "\nWorkload watched: {:.2} h. The agent's own `predicted_lead_seconds` differs from the \
             lead above by at most {agree:.2} s over {} kills.\n",
            scores[0].hours,
            own.len()
        );
        let file = out_dir.join(format!("{}.svg", first.trace_name(cell)));
        std::fs::write(&file, plot::svg(cell.name, &first.trace, &first.said))?;
        println!("Plot of its first run: {}\n", file.display());
        let s = &scores[0];
        if cell.kills {
            let recall = 100.0 * s.recalled as f64 / s.kills.max(1) as f64;
            figures.push(Figure::new(
                "predict",
                format!("{}: lead p50 s", cell.name),
                &[s.lead(0.5)],
            ));
            figures.push(Figure::new(
                "predict",
                format!("{}: ETA error p90 at 5 s %", cell.name),
                &[s.error_p90(1).0 * 100.0],
            ));
            figures.push(Figure::new(
                "predict",
                format!("{}: warned ≥ 5 s %", cell.name),
                &[recall],
            ));
        } else {
            figures.push(Figure::new(
                "predict",
                format!("{}: killed", cell.name),
                &[s.kills as f64],
            ));
        }
        figures.push(Figure::new(
            "predict",
            format!("{}: false alarms per hour", cell.name),
            &[s.false_per_hour()],
        ));
    }
    Ok(figures)
}

fn seconds(s: f64) -> String {
    if s.is_finite() {
        format!("{s:.1}")
    } else {
        "–".to_string()
    }
}

/// Writes what the run left for a second look: every event the agent sent
/// (`events.jsonl`) and every run with its allocation log, samples and
/// kill (`runs.jsonl`), in `out_dir`.
pub(super) fn keep(
    out_dir: &Path,
    cells: &[Cell],
    runs: &[Run],
    events: &[(SystemTime, Value)],
) -> anyhow::Result<()> {
    let lines: Vec<String> = events.iter().map(|(_, e)| e.to_string()).collect();
    std::fs::write(out_dir.join("events.jsonl"), lines.join("\n") + "\n")?;
    let lines: Vec<String> = runs
        .iter()
        .map(|r| {
            serde_json::json!({
                "cell": cells[r.cell].name,
                "cgroup": r.dir,
                "limit": r.trace.limit,
                "start": r.trace.start,
                "end": r.trace.end,
                "kill": r.trace.kill,
                "held": r.trace.held,
                "samples": r.trace.samples.iter()
                    .map(|s| (s.t, s.usage, s.inactive_file, s.active_file))
                    .collect::<Vec<_>>(),
            })
            .to_string()
        })
        .collect();
    std::fs::write(out_dir.join("runs.jsonl"), lines.join("\n") + "\n")?;
    Ok(())
}
