//! `[[slurm]]`: drain the node of an unhealthy worker and requeue the job
//! of an OOM kill, through `scontrol`; on a predicted kill, signal the
//! job's steps (`scancel`) and drain the node.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use super::cgroup_proof::{DEFAULT_CGROUP_ROOTS, check_root};

use serde::Deserialize;

use crate::{
    model::signal::{Signal, parse_signal},
    sinks::{
        config::{Delivery, InvalidKey, SinkTable},
        guard::Guard,
    },
};

/// Requeues of one job memwatch makes at most.
pub(super) const DEFAULT_SLURM_MAX_REQUEUES: u32 = 3;
/// Time allowed to one `scontrol` run.
pub(super) const DEFAULT_SLURM_TIMEOUT: Duration = Duration::from_secs(10);

/// What to do with a Slurm job whose process was OOM-killed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequeuePolicy {
    /// Leave it to Slurm (the job fails or continues as its script decides).
    Never,
    /// `scontrol requeue`, start it at once, and keep it off the node that killed it.
    #[default]
    OtherNode,
    /// `scontrol requeue`, start it at once, on any node.
    AnyNode,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SlurmConfig {
    pub name: String,
    /// The `scontrol` program (on PATH by default).
    pub scontrol: PathBuf,
    /// memwatch worker name → Slurm node name; a worker not listed is the
    /// node named like the agent's `node_name`.
    pub nodes: BTreeMap<String, String>,
    /// Drain the node of an unhealthy worker, resume it on recovery.
    pub drain: bool,
    pub requeue: RequeuePolicy,
    pub max_requeues: u32,
    /// Where Slurm's cgroup plugins keep jobs: a `job_<N>` cgroup proves
    /// job N only under one of these, in root-owned directories
    /// (cgroup_proof.rs).
    pub cgroup_roots: Vec<PathBuf>,
    /// What to do when a job's kill is predicted (`oom_imminent`).
    pub imminent: ImminentConfig,
    /// The cluster guard: nodes of the node's partitions that must stay
    /// open (`min_remaining`, `min_remaining_fraction`).
    pub guard: Guard,
    /// `timeout` is the time allowed to one `scontrol` run.
    pub delivery: Delivery,
}

/// `imminent_signal`, `drain_imminent`, `scancel`: acting on a predicted
/// kill. Both actions are off unless asked for: a signal the job does not
/// handle ends it (and a job ended so was not OOM-killed: it is not
/// requeued), and a drain takes a node out of the cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImminentConfig {
    /// `scancel --signal` to the job's steps (not its batch shell) on the
    /// first `oom_imminent` of the episode; `None`: no signal.
    pub signal: Option<Signal>,
    /// Drain the job's node through the action protocol while its kill is
    /// predicted; resumed when the episode ends.
    pub drain: bool,
    /// The `scancel` program (`None`: `scancel` on PATH).
    pub scancel: Option<PathBuf>,
}

impl ImminentConfig {
    /// The `scancel` to run.
    pub fn scancel(&self) -> &std::path::Path {
        self.scancel
            .as_deref()
            .unwrap_or(std::path::Path::new("scancel"))
    }
}

/// The keys of `[[slurm]]` besides the delivery keys (it opens no
/// connection: no `connect_timeout`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SlurmFile {
    name: Option<String>,
    scontrol: Option<PathBuf>,
    #[serde(default)]
    nodes: BTreeMap<String, String>,
    drain: Option<bool>,
    requeue: Option<RequeuePolicy>,
    max_requeues: Option<u32>,
    cgroup_roots: Option<Vec<PathBuf>>,
    min_remaining: Option<usize>,
    min_remaining_fraction: Option<f64>,
    imminent_signal: Option<String>,
    drain_imminent: Option<bool>,
    scancel: Option<PathBuf>,
}

impl SlurmConfig {
    pub fn from_table(mut table: SinkTable) -> Result<Self, InvalidKey> {
        let defaults = Delivery {
            timeout: DEFAULT_SLURM_TIMEOUT,
            ..Delivery::default()
        };
        let delivery = table.delivery(defaults, false)?;
        let file: SlurmFile = table.rest()?;
        let guard = Guard::from_keys(&table, file.min_remaining, file.min_remaining_fraction)?;
        let imminent = imminent(&table, &file)?;
        let scontrol = file.scontrol.unwrap_or_else(|| PathBuf::from("scontrol"));
        if scontrol.as_os_str().is_empty() {
            return Err(table.invalid("scontrol", "must not be empty"));
        }
        for (worker, node) in &file.nodes {
            // The node name goes into `NodeName=<node>`: no room for a second argument.
            if node.is_empty() || node.contains(|c: char| c.is_whitespace() || c == '=') {
                return Err(table.invalid(
                    &format!("nodes.{worker}"),
                    format!("is not a Slurm node name: {node:?}"),
                ));
            }
        }
        let cgroup_roots = file
            .cgroup_roots
            .unwrap_or_else(|| DEFAULT_CGROUP_ROOTS.iter().map(PathBuf::from).collect());
        for root in &cgroup_roots {
            check_root(root).map_err(|why| table.invalid("cgroup_roots", why))?;
        }
        Ok(Self {
            name: file.name.unwrap_or_else(|| table.default_name()),
            scontrol,
            nodes: file.nodes,
            drain: file.drain.unwrap_or(true),
            requeue: file.requeue.unwrap_or_default(),
            max_requeues: file.max_requeues.unwrap_or(DEFAULT_SLURM_MAX_REQUEUES),
            cgroup_roots,
            imminent,
            guard,
            delivery,
        })
    }
}

/// The predicted-kill keys, validated.
fn imminent(table: &SinkTable, file: &SlurmFile) -> Result<ImminentConfig, InvalidKey> {
    let signal = match file.imminent_signal.as_deref().map(str::trim) {
        None => None,
        Some(none) if none.eq_ignore_ascii_case("none") => None,
        Some(text) => {
            let signal = parse_signal(text).map_err(|e| table.invalid("imminent_signal", e))?;
            if matches!(signal.number, libc::SIGKILL | libc::SIGSTOP) {
                // Neither can be handled: the first ends the job before
                // its kill, the second freezes it with its memory held.
                return Err(table.invalid(
                    "imminent_signal",
                    format!("{} cannot be handled by a job: pick one it traps (SIGUSR1, SIGUSR2, SIGTERM)", signal.name),
                ));
            }
            Some(signal)
        }
    };
    if file
        .scancel
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(table.invalid("scancel", "must not be empty"));
    }
    Ok(ImminentConfig {
        signal,
        drain: file.drain_imminent.unwrap_or(false),
        scancel: file.scancel.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::config::table;

    fn slurm(text: &str) -> Result<SlurmConfig, InvalidKey> {
        SlurmConfig::from_table(table("slurm", text))
    }

    #[test]
    fn slurm_defaults_and_bad_values_name_the_key() {
        let s = slurm("nodes = { w1 = \"n1\" }").unwrap();
        assert_eq!(s.name, "slurm-1");
        assert!(s.drain);
        assert_eq!(s.requeue, RequeuePolicy::OtherNode);
        assert_eq!(s.delivery.timeout, DEFAULT_SLURM_TIMEOUT);
        let e = slurm("nodes = { w1 = \"n1 State=DOWN\" }").unwrap_err();
        assert!(e.to_string().contains("slurm[0].nodes.w1"), "{e}");
        let e = slurm("timeout = \"soon\"").unwrap_err();
        assert!(e.to_string().contains("slurm[0].timeout"), "{e}");
        let e = slurm("requeue = \"sometimes\"").unwrap_err();
        assert!(e.to_string().contains("slurm[0]"), "{e}");
        assert_eq!(
            s.cgroup_roots,
            DEFAULT_CGROUP_ROOTS.map(PathBuf::from).to_vec()
        );
        let s = slurm("cgroup_roots = [\"/sys/fs/cgroup/memory/slurm_n1\"]").unwrap();
        assert_eq!(
            s.cgroup_roots,
            [PathBuf::from("/sys/fs/cgroup/memory/slurm_n1")]
        );
        for bad in ["[\"slurm\"]", "[\"/\"]", "[\"/sys/fs/../slurm\"]"] {
            let e = slurm(&format!("cgroup_roots = {bad}")).unwrap_err();
            assert!(e.to_string().contains("slurm[0].cgroup_roots"), "{e}");
        }
        let e = slurm("connect_timeout = \"1s\"").unwrap_err();
        assert!(
            e.to_string().contains("unknown field `connect_timeout`"),
            "{e}"
        );
    }

    #[test]
    fn predicted_kill_actions_are_asked_for_and_bad_signals_name_the_key() {
        let s = slurm("").unwrap();
        assert_eq!(s.imminent, ImminentConfig::default(), "both off by default");
        assert_eq!(s.imminent.scancel(), std::path::Path::new("scancel"));
        let s =
            slurm("imminent_signal = \"usr1\"\ndrain_imminent = true\nscancel = \"/x/scancel\"")
                .unwrap();
        assert_eq!(
            s.imminent.signal.as_ref().map(|s| s.number),
            Some(libc::SIGUSR1)
        );
        assert!(s.imminent.drain);
        assert_eq!(s.imminent.scancel(), std::path::Path::new("/x/scancel"));
        assert_eq!(
            slurm("imminent_signal = \"none\"").unwrap().imminent.signal,
            None
        );
        for bad in ["SIGFOO", "99", "KILL", "SIGSTOP"] {
            let e = slurm(&format!("imminent_signal = \"{bad}\"")).unwrap_err();
            assert!(
                e.to_string().contains("slurm[0].imminent_signal"),
                "{bad}: {e}"
            );
        }
        let e = slurm("scancel = \"\"").unwrap_err();
        assert!(e.to_string().contains("slurm[0].scancel"), "{e}");
        let e = slurm("drain_imminent = \"yes\"").unwrap_err();
        assert!(e.to_string().contains("slurm[0]"), "{e}");
    }
}
