//! Acting on a predicted kill (`oom_imminent`) of a task in a Slurm job.
//!
//! - `imminent_signal`: `scancel --signal=<N> <job>` on the first
//!   `oom_imminent` of the episode. Without `--batch` or `--full`, scancel
//!   signals the job's steps and not its batch shell, which would end the
//!   job unless it traps the signal. Only a job Slurm vouches for (a
//!   `job_<N>` cgroup, or `scontrol pidinfo` of the task's registering
//!   process: jobs.rs) is signalled, and only while the kill is still
//!   predicted now (`stale_prediction`, read right before acting).
//! - `drain_imminent`: the node is drained through the action protocol
//!   (sinks/action.rs: the stale check, the gate, the cluster guard, the
//!   re-check), its reason naming the predicted kill, and resumed when the
//!   episode ends (unless an unhealthy worker holds it).
//!
//! `oom_averted` or the kill ends the episode: the next `oom_imminent`
//! signals again. A job killed anyway is requeued as before (requeue.rs).
//! Episodes live in memory: after a restart the predictor starts afresh
//! too, and a new prediction signals once more.

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::{SlurmSink, requeue::job_id, scontrol::ScontrolError};
use crate::{
    model::{
        event::{Event, EventKind},
        health::Health,
    },
    sinks::{report, stale_prediction},
};

/// Jobs remembered at most in each set (the lowest ids go first): an
/// episode whose end was never seen must not grow them for ever.
const MAX_JOBS: usize = 4096;

/// The jobs whose predicted kill was acted on, and said, in their episode.
#[derive(Debug, Default)]
pub(super) struct Episodes {
    /// Signalled (or refused for good) in their current episode.
    signalled: BTreeSet<u64>,
    /// Whose skip or refusal was said in their current episode.
    said: BTreeSet<u64>,
}

impl Episodes {
    fn end(&mut self, job: u64) {
        self.signalled.remove(&job);
        self.said.remove(&job);
    }
}

fn bounded_insert(set: &mut BTreeSet<u64>, job: u64) -> bool {
    let new = set.insert(job);
    while set.len() > MAX_JOBS {
        set.pop_first();
    }
    new
}

impl SlurmSink {
    /// What a predicted kill asks of Slurm: runs before the rest of
    /// `handle` (which requeues a job whose kill came anyway).
    pub(super) async fn follow_prediction(&mut self, event: &Event) -> Result<(), ScontrolError> {
        match event.body.kind {
            EventKind::OomImminent => {
                self.signal_imminent(event).await?;
                if self.config.imminent.drain {
                    self.actions.observe(event);
                    self.run_actions().await?;
                }
                Ok(())
            }
            EventKind::OomAverted | EventKind::OomKill => {
                if let Some((job, _)) = job_id(event, self.proofs.as_ref(), &self.cgroup_roots) {
                    self.episodes.end(job);
                }
                if self.config.imminent.drain {
                    self.actions.observe(event);
                    self.resume_predicted(event).await?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `scancel --signal` to the job's steps, once per episode.
    async fn signal_imminent(&mut self, event: &Event) -> Result<(), ScontrolError> {
        let Some(signal) = self.config.imminent.signal.clone() else {
            return Ok(());
        };
        // A task that is no Slurm job's: nothing to signal, nothing to say.
        let Some((job, unproven)) = job_id(event, self.proofs.as_ref(), &self.cgroup_roots) else {
            return Ok(());
        };
        if self.episodes.signalled.contains(&job) {
            return Ok(());
        }
        let worker = event.body.worker.as_deref();
        let held = if let Some(why) = unproven {
            Some(why)
        } else {
            match worker {
                Some(w) => stale_prediction(&self.eta, w),
                None => Some("the event names no worker".to_string()),
            }
        };
        if let Some(why) = held {
            self.say_once(
                job,
                EventKind::ActionSkipped,
                worker,
                format!("job {job} not sent {}: {why}", signal.name),
            );
            return Ok(());
        }
        let args = [format!("--signal={}", signal.number), job.to_string()];
        let sent = super::scontrol::run(
            self.config.imminent.scancel(),
            &args,
            self.config.delivery.timeout,
        )
        .await;
        match sent.map_err(for_good) {
            Ok(_) => {
                bounded_insert(&mut self.episodes.signalled, job);
                self.episodes.said.remove(&job);
                let eta = event.body.eta_seconds.unwrap_or_default();
                info!(sink = %self.config.name, job, signal = %signal.name, eta_seconds = eta, worker = worker.unwrap_or("-"), "job's steps signalled: its OOM kill is predicted");
                self.count("signal");
                Ok(())
            }
            Err(error) if error.transient() => Err(error),
            Err(error) => {
                // Not asked again in this episode: the job is gone or ending.
                bounded_insert(&mut self.episodes.signalled, job);
                self.say_once(
                    job,
                    EventKind::ActionRefused,
                    worker,
                    format!("job {job} not sent {}: {error}", signal.name),
                );
                Ok(())
            }
        }
    }

    /// A skip or a refusal, said and counted once in the job's episode.
    fn say_once(&mut self, job: u64, kind: EventKind, worker: Option<&str>, reason: String) {
        if !bounded_insert(&mut self.episodes.said, job) {
            return;
        }
        warn!(sink = %self.config.name, job, kind = kind.as_str(), %reason, "predicted kill not acted on");
        self.count(match kind {
            EventKind::ActionRefused => "refused",
            _ => "skipped",
        });
        let node = worker.map(|w| self.node_of(w));
        report(&self.recorder, kind, worker, node.as_deref(), reason);
    }

    /// The episode ended: a node drained for it is resumed, unless the
    /// worker is unhealthy now (then the drain is the unhealthy one's, and
    /// its recovery resumes it).
    async fn resume_predicted(&mut self, event: &Event) -> Result<(), ScontrolError> {
        let Some(worker) = event.body.worker.as_deref() else {
            return Ok(());
        };
        if (self.health)(worker) == Some(Health::Unhealthy) {
            return Ok(());
        }
        if self.state.drained.values().any(|ws| ws.contains(worker)) {
            info!(sink = %self.config.name, %worker, kind = event.body.kind.as_str(), "the predicted kill's episode ended: its drain is let go");
            self.resume(worker).await?;
        }
        Ok(())
    }
}

/// scancel's "Job/step already completing or completed" is no passing
/// trouble of the controller's (as "completing" is for `scontrol`): the
/// job is ending, and signalling it again will not help.
fn for_good(error: ScontrolError) -> ScontrolError {
    match error {
        ScontrolError::Unreachable { args, stderr } if stderr.contains("completed") => {
            ScontrolError::Refused { args, stderr }
        }
        other => other,
    }
}
