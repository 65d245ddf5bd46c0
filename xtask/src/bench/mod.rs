//! `cargo xtask bench`: figures measured side by side in one run, printed
//! as ratios or quantiles (root: the agent loads its eBPF probe).

use std::path::{Path, PathBuf};

use anyhow::bail;
use memwatch_test_support::{
    agent::{Agent, OnDrop, Options},
    env::is_root,
};

use crate::shell;

mod baseline;
mod compare;
mod delay;
mod guard;
mod idle;
mod overhead;
pub(crate) mod predict;
mod segments;
mod storm;
mod tasks;

use self::{
    baseline::Baseline,
    compare::{Bench, Figure},
};

/// Runs benchmark `which` (`all`: the quick ones, one after the other);
/// with `baseline`, also the agent built from that commit, beside this
/// tree's on the same workload, and prints each figure for both and their
/// ratio. Ends with one table of every figure measured.
pub(crate) fn run(which: Option<&str>, baseline: Option<&str>) -> anyhow::Result<()> {
    let benches = compare::parse(which, baseline.is_some())?;
    if !is_root() {
        bail!("benchmarks load the eBPF probe and make cgroups: run them as root");
    }
    let baseline = baseline.map(baseline::build).transpose()?;
    let mut figures = Vec::new();
    for bench in benches {
        eprintln!("xtask: bench {}", bench.name());
        figures.extend(run_one(bench, baseline.as_ref())?);
    }
    let base = baseline.as_ref().map(Baseline::name);
    println!(
        "\nSummary ({}{})\n",
        baseline::this_tree(),
        base.as_ref()
            .map_or(String::new(), |b| format!(" against {b}"))
    );
    print!(
        "{}",
        compare::table(&baseline::this_tree(), base.as_deref(), &figures)
    );
    Ok(())
}

fn run_one(bench: Bench, baseline: Option<&Baseline>) -> anyhow::Result<Vec<Figure>> {
    match bench {
        Bench::Overhead => overhead::overhead(baseline),
        Bench::Delay => delay::delay(baseline),
        Bench::Idle => idle::idle(baseline),
        Bench::Storm => storm::storm(baseline),
        Bench::Guard => guard::guard().map(|()| Vec::new()),
        Bench::Tasks => tasks::tasks(baseline),
        Bench::Predict => predict::predict(),
        Bench::PredictV2 => predict::predict_v2(),
    }
}

/// The agents a benchmark runs: this tree's `memwatch` in `release`, then
/// the baseline's; each with the name its table gives it.
/// Fails when the two are one binary (see [`baseline::distinct`]).
pub(crate) fn builds(
    release: &Path,
    baseline: Option<&Baseline>,
) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let ours = release.join("memwatch");
    let mut builds = vec![(baseline::this_tree(), ours.clone())];
    if let Some(base) = baseline {
        baseline::distinct(&ours, base)?;
        builds.push((base.name(), base.bin.clone()));
    }
    Ok(builds)
}

/// Checks for root (saying why `what` needs it), builds the agent and the
/// workload binaries in release, and returns their directory.
pub(crate) fn release_bins(what: &str) -> anyhow::Result<PathBuf> {
    if !is_root() {
        bail!("{what}: run it as root");
    }
    shell::build_bins(true)
}

/// `memwatch run <extra>` (the binary `bin`) on a free loopback port with
/// a state directory of its own, ready; stopped with SIGTERM on drop. Its
/// stderr is discarded, as in every measurement so far.
pub(crate) fn start_agent(bin: &Path, extra: &[&str]) -> anyhow::Result<Agent> {
    let options = Options {
        args: extra.iter().map(|a| a.to_string()).collect(),
        on_drop: OnDrop::Stop,
        ..Options::default()
    };
    Ok(Agent::start(bin, &options)?)
}
