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
mod delay;
mod guard;
mod idle;
mod overhead;
mod segments;
mod storm;
mod tasks;

/// Runs benchmark `which`; with `baseline`, also the agent built from that
/// commit, beside this tree's on the same workload (idle and tasks).
pub(crate) fn run(which: Option<&str>, baseline: Option<&str>) -> anyhow::Result<()> {
    let which = which.unwrap_or("overhead");
    let baseline = match (which, baseline) {
        (_, None) => None,
        ("idle" | "tasks", Some(rev)) => Some(baseline::build(rev)?),
        (other, Some(_)) => {
            bail!("`--baseline` is supported by `idle` and `tasks`, not yet by `{other}`")
        }
    };
    match which {
        "overhead" => overhead::overhead(),
        "delay" => delay::delay(),
        "idle" => idle::idle(baseline),
        "storm" => storm::storm(),
        "guard" => guard::guard(),
        "tasks" => tasks::tasks(baseline),
        other => {
            bail!("unknown benchmark `{other}` (known: overhead, delay, idle, storm, guard, tasks)")
        }
    }
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
