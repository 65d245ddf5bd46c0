//! Requeueing a job whose process was OOM-killed.

use tracing::{info, warn};

use std::path::Path;

use super::cgroup_proof::{CgroupJob, CgroupRoots};
use super::jobs::JobProofs;
use super::{
    PENDING_POLL, RequeuePolicy, SlurmSink,
    scontrol::{self, ScontrolError},
};
use crate::model::event::Event;

impl SlurmSink {
    pub(super) async fn requeue(&mut self, job: u64) -> Result<(), ScontrolError> {
        let done = self.state.requeues.get(&job).copied().unwrap_or(0);
        if done >= self.config.max_requeues {
            warn!(sink = %self.config.name, job, requeues = done, "job OOM-killed again; max_requeues reached, not requeued");
            return Ok(());
        }
        let node = if self.config.requeue == RequeuePolicy::OtherNode {
            let out = self
                .scontrol(&["show".into(), "job".into(), job.to_string(), "-o".into()])
                .await?;
            let f = scontrol::fields(out.lines().next().unwrap_or(""));
            f.get("BatchHost")
                .or_else(|| f.get("NodeList"))
                .filter(|n| !n.is_empty() && *n != "(null)")
                .cloned()
        } else {
            None
        };
        self.scontrol(&["requeue".into(), job.to_string()]).await?;
        self.state.requeues.insert(job, done + 1);
        // A running job is requeued once Slurm has finished killing it:
        // updates before it is pending again are refused.
        if !self.wait_pending(job).await? {
            info!(sink = %self.config.name, job, "requeued job left pending on its own; not updated");
            self.count("requeue");
            return Ok(());
        }
        if let Some(node) = &node {
            self.scontrol(&[
                "update".into(),
                format!("JobId={job}"),
                format!("ExcNodeList={node}"),
            ])
            .await?;
        }
        self.scontrol(&[
            "update".into(),
            format!("JobId={job}"),
            "StartTime=now".into(),
        ])
        .await?;
        info!(sink = %self.config.name, job, excluded = node.as_deref().unwrap_or("-"), "OOM-killed job requeued");
        self.count("requeue");
        Ok(())
    }

    /// Waits (bounded by the sink's `timeout`) until `job` is pending;
    /// `false` when it started or ended first.
    pub(super) async fn wait_pending(&self, job: u64) -> Result<bool, ScontrolError> {
        let deadline = tokio::time::Instant::now() + self.config.delivery.timeout;
        loop {
            let out = self
                .scontrol(&["show".into(), "job".into(), job.to_string(), "-o".into()])
                .await?;
            let fields = scontrol::fields(out.lines().next().unwrap_or(""));
            match fields.get("JobState").map(String::as_str) {
                Some("PENDING") => return Ok(true),
                Some("RUNNING" | "COMPLETED" | "CANCELLED") => return Ok(false),
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ScontrolError::Timeout {
                    args: format!("show job {job} (waiting for it to be pending)"),
                    timeout: self.config.delivery.timeout,
                });
            }
            tokio::time::sleep(PENDING_POLL).await;
        }
    }
}

/// Why a task id names a job but proves nothing.
const ONLY_A_NAME: &str = "Slurm never said the task's process belongs to that job (the task id \
     is only a name: register it over the local socket, as `memwatch exec` does, so that the \
     agent can ask `scontrol pidinfo`)";

/// The Slurm job of an `oom_kill` event, and why Slurm does not vouch for
/// it when it does not (`None`: proven). Proof is Slurm's own `job_<N>`
/// cgroup (cgroup_proof.rs) or the job Slurm placed the task's registering
/// process in (jobs.rs); a user-made `job_<N>` cgroup or a `slurm-<N>-…`
/// task id alone is only a name: `(N, Some(why))`.
pub(crate) fn job_id(
    event: &Event,
    proofs: Option<&JobProofs>,
    roots: &CgroupRoots,
) -> Option<(u64, Option<String>)> {
    let from_cgroup = event
        .body
        .cgroup
        .as_deref()
        .map_or(CgroupJob::None, |path| roots.job_of(Path::new(path)));
    if let CgroupJob::Proven(job) = from_cgroup {
        return Some((job, None));
    }
    let task_id = event.body.task_id.as_deref();
    if let Some(job) = task_id.and_then(|t| proofs?.job_of_task(t)) {
        return Some((job, None));
    }
    if let CgroupJob::Unproven { job, why } = from_cgroup {
        return Some((job, Some(format!("not Slurm's own cgroup: {why}"))));
    }
    let rest = task_id?.strip_prefix("slurm-")?;
    let job = rest.split('-').next()?.parse().ok()?;
    Some((job, Some(ONLY_A_NAME.to_string())))
}
