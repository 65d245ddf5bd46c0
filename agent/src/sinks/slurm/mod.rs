//! The Slurm sink: drains the node of an unhealthy worker, resumes it once
//! the worker recovered (only nodes memwatch drained), and requeues a job
//! whose process was OOM-killed, per the configured policy.
//!
//! - `worker_unhealthy` → `scontrol update NodeName=<node> State=DRAIN
//!   Reason="memwatch: <reason>"`, unless an operator (a reason not starting
//!   with `memwatch:`) drained the node already. The node is remembered in
//!   `<state_dir>/slurm-<sink name>.json`.
//! - `worker_recovered` → `State=RESUME` for a node in that file, once no
//!   worker of the node is unhealthy, and only while its reason is still
//!   memwatch's (an operator who re-drained it keeps it drained).
//! - `oom_kill` of a job: the job is the `job_<N>` component of the
//!   victim's cgroup when that is Slurm's own (under `cgroup_roots`, in
//!   root-owned directories: cgroup_proof.rs), or the job Slurm placed the
//!   task's registering process in (jobs.rs); a `slurm-<N>-…` task id alone
//!   is only a name, and requeues nothing. Policy `other_node`:
//!   `scontrol requeue <N>`, `update JobId=<N> ExcNodeList=<node it ran on>`,
//!   `update JobId=<N> StartTime=now` (a requeued job otherwise waits ~2
//!   minutes); `any_node` skips the exclusion; at most `max_requeues` per job.
//! - `oom_imminent` of a job's task (`imminent_signal`, `drain_imminent`):
//!   the job's steps are signalled and the node drained before the kill
//!   (imminent.rs).
//!
//! Transient failures (controller unreachable, `scontrol` timeout) fail the
//! batch and the delivery loop retries it with backoff; a refusal for good
//! (unknown job or node, job not requeueable) is logged, counted as
//! `status` and not retried. Events of a retried batch already acted on are
//! skipped (the last handled seq is in the same file).

mod cgroup_proof;
mod config;
mod drain;
mod imminent;
mod jobs;
mod nodes;
mod requeue;
pub(crate) mod scontrol;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

#[cfg(test)]
use self::config::ImminentConfig;
pub(crate) use self::config::{RequeuePolicy, SlurmConfig};
use self::{
    cgroup_proof::{CgroupRoots, HostDirs},
    nodes::Node,
    scontrol::ScontrolError,
};
pub(crate) use self::{jobs::JobProofs, requeue::job_id};
use crate::{
    model::event::{Event, EventKind},
    record::Recorder,
    sinks::{
        ActionGate, Lent, SinkContext, Start, Started, WorkerEta, WorkerHealth,
        action::Actions,
        config::{Delivery, InvalidKey},
        delivery::{FailureClass, SendError, Sink},
        report,
    },
};

/// Slurm keeps reasons short in its listings.
const MAX_REASON: usize = 200;
/// How long after a drain the controller's view is read again: longer than
/// an agent elsewhere takes from reading the view to its own drain landing
/// (one `scontrol` round trip), so concurrent drains are seen from both
/// sides.
const GUARD_SETTLE: Duration = Duration::from_secs(2);
/// How often a requeued job is checked until it is pending again.
const PENDING_POLL: std::time::Duration = std::time::Duration::from_millis(100);
/// Prefix of every reason memwatch sets: how it knows a drain is its own.
pub(crate) const REASON_PREFIX: &str = "memwatch:";

/// What the sink must remember across restarts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SlurmState {
    /// Node → the unhealthy workers on it memwatch drained it for.
    drained: BTreeMap<String, BTreeSet<String>>,
    /// Job id → requeues memwatch made.
    requeues: BTreeMap<u64, u32>,
    /// Highest event seq acted on.
    last_seq: u64,
    /// The outbox epoch `last_seq` is of (absent in files of builds before
    /// epochs): under another epoch it means nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    epoch: Option<String>,
}

impl Start for SlurmConfig {
    fn name(&self) -> &str {
        &self.name
    }

    /// Every worker of `nodes` is declared.
    fn check_workers(
        &self,
        index: usize,
        declared: &dyn Fn(&str) -> bool,
    ) -> Result<(), InvalidKey> {
        match self.nodes.keys().find(|w| !declared(w)) {
            Some(w) => Err(InvalidKey {
                key: format!("slurm[{index}].nodes.{w}"),
                problem: "is not a declared [[worker]]".into(),
            }),
            None => Ok(()),
        }
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started> {
        info!(sink = %self.name, scontrol = %self.scontrol.display(), drain = self.drain, requeue = ?self.requeue, imminent_signal = self.imminent.signal.as_ref().map_or("none", |s| s.name.as_str()), drain_imminent = self.imminent.drain, "Slurm sink");
        let sink = SlurmSink::open(
            self.clone(),
            ctx.node_name.clone(),
            &ctx.state_dir,
            ctx.recorder.clone(),
            ctx.health.clone(),
        )
        .with_context(|| {
            format!(
                "Slurm sink {}: state in {} is unusable",
                self.name,
                ctx.state_dir.display()
            )
        })?;
        let mut sink = sink;
        sink.gate = ctx.gate.clone();
        sink.actions.set_gate(ctx.gate.clone());
        // Which Slurm job each task's process is in, as Slurm says it:
        // asked at registration (the hook lent to the API), read by the
        // requeues and the signals.
        sink.proofs = JobProofs::for_sink(self, &ctx.node_name);
        sink.eta = ctx.eta.clone();
        sink.align(ctx.outbox.status().last_seq, ctx.outbox.epoch());
        let mut lent = Lent::default();
        if let Some(proofs) = &sink.proofs {
            lent = lent.on_register(Arc::new(proofs.clone()));
        }
        Ok(Started {
            tasks: vec![ctx.spawn_delivery(sink)],
            lent,
        })
    }
}

pub(crate) struct SlurmSink {
    config: SlurmConfig,
    /// The node of a worker not listed in `nodes`.
    default_node: String,
    path: PathBuf,
    state: SlurmState,
    recorder: Recorder,
    health: WorkerHealth,
    /// Whether requeues are held back after a state loss (drains: in
    /// `actions`).
    gate: ActionGate,
    /// Drains: what is pending, done and said, run by the action
    /// protocol (sinks/action.rs); its settle is [`GUARD_SETTLE`].
    actions: Actions,
    /// Which job Slurm placed each task's process in (jobs.rs).
    proofs: Option<JobProofs>,
    /// Where a `job_<N>` cgroup proves its job (cgroup_proof.rs).
    cgroup_roots: CgroupRoots,
    /// Each worker's predicted kill now (`imminent_signal`, `drain_imminent`).
    eta: WorkerEta,
    /// The jobs signalled for their predicted kill (imminent.rs).
    episodes: imminent::Episodes,
}

impl SlurmSink {
    pub(crate) fn open(
        config: SlurmConfig,
        default_node: String,
        state_dir: &Path,
        recorder: Recorder,
        health: WorkerHealth,
    ) -> io::Result<Self> {
        let path = state_dir.join(format!("slurm-{}.json", config.name));
        let state = match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(state) => state,
                Err(error) => {
                    // A crash loop on the node that most needs watching is
                    // worse than forgetting what was drained: set it aside.
                    let aside = path.with_extension(format!(
                        "json.corrupt-{}",
                        chrono::Utc::now().format("%Y%m%dT%H%M%S")
                    ));
                    fs::rename(&path, &aside)?;
                    recorder
                        .metrics()
                        .state_quarantined
                        .with_label_values(&["slurm"])
                        .inc();
                    warn!(sink = %config.name, %error, aside = %aside.display(), "the Slurm sink's state does not parse: set aside");
                    report(
                        &recorder,
                        EventKind::EventQuarantined,
                        None,
                        None,
                        format!(
                            "the Slurm sink {}'s state file does not parse ({error}); set aside as {} \
                             and started afresh: nodes it drained before are resumed by hand",
                            config.name,
                            aside.display()
                        ),
                    );
                    SlurmState::default()
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => SlurmState::default(),
            Err(e) => return Err(e),
        };
        let cgroup_roots = CgroupRoots::new(config.cgroup_roots.clone(), Arc::new(HostDirs));
        Ok(Self {
            cgroup_roots,
            default_node,
            path,
            state,
            recorder,
            health,
            actions: Actions::new(config.guard, GUARD_SETTLE)
                .with_predictions(config.imminent.drain),
            config,
            gate: ActionGate::open(),
            proofs: None,
            eta: Arc::new(|_| None),
            episodes: imminent::Episodes::default(),
        })
    }

    /// Writes the state whole, durably: a temporary file, synced, renamed
    /// over the old one, and the directory synced, so a crash or a power
    /// loss leaves the old state or the new, never an empty file nor a
    /// rename the disk has not kept.
    fn save(&self) -> Result<(), SendError> {
        let write = || -> io::Result<()> {
            use std::io::Write as _;
            let tmp = self.path.with_extension("json.tmp");
            let mut file = fs::File::create(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(&self.state)?)?;
            file.sync_all()?;
            drop(file);
            fs::rename(&tmp, &self.path)?;
            let dir = match self.path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| {
            SendError::new(
                FailureClass::Other,
                format!("saving {}: {e}", self.path.display()),
            )
        })
    }

    /// The seq this sink handled last is of one outbox database (its
    /// epoch): an outbox of another epoch was made anew (its database set
    /// aside or removed), and its events are new ones, not to be skipped as
    /// done. A state file of a build before epochs says none: an outbox
    /// that numbers from below what it handled is taken as new.
    fn align(&mut self, outbox_last_seq: u64, epoch: &str) {
        let other_epoch = self.state.epoch.as_deref().is_some_and(|e| e != epoch);
        if other_epoch || outbox_last_seq < self.state.last_seq {
            warn!(sink = %self.config.name, handled = self.state.last_seq, handled_epoch = self.state.epoch.as_deref().unwrap_or("-"), outbox = outbox_last_seq, %epoch, "the outbox was made anew: its events are handled from its start");
            self.state.last_seq = 0;
        }
        self.state.epoch = Some(epoch.to_string());
    }

    fn node_of(&self, worker: &str) -> String {
        self.config
            .nodes
            .get(worker)
            .cloned()
            .unwrap_or_else(|| self.default_node.clone())
    }

    async fn scontrol(&self, args: &[String]) -> Result<String, ScontrolError> {
        scontrol::run(&self.config.scontrol, args, self.config.delivery.timeout).await
    }

    fn count(&self, action: &str) {
        self.recorder
            .metrics()
            .scheduler_actions
            .with_label_values(&[self.config.name.as_str(), action])
            .inc();
    }

    /// `Ok(())` when done or refused for good; `Err` when worth retrying.
    async fn handle(&mut self, event: &Event) -> Result<(), ScontrolError> {
        self.follow_prediction(event).await?;
        let worker = event.body.worker.as_deref();
        match (event.body.kind, worker) {
            (EventKind::Heartbeat, _) if self.config.drain => {
                self.actions.observe(event);
                self.resume_healthy(event).await?;
                self.run_actions().await
            }
            // Only predicted kills drain: a heartbeat retries those held
            // and lets go those whose end was lost, and drains no
            // unhealthy worker.
            (EventKind::Heartbeat, _) if self.config.imminent.drain => {
                self.resume_healthy(event).await?;
                self.run_actions().await
            }
            (EventKind::WorkerUnhealthy, _) if self.config.drain => {
                self.actions.observe(event);
                self.run_actions().await
            }
            (EventKind::WorkerRecovered, Some(w)) if self.config.drain => {
                self.actions.observe(event);
                self.resume(w).await
            }
            (EventKind::OomKill, _) if self.config.requeue != RequeuePolicy::Never => {
                let Some((job, unproven)) = job_id(event, self.proofs.as_ref(), &self.cgroup_roots)
                else {
                    return Ok(());
                };
                // Found in the kernel's counters after the fact, the job may
                // have ended long ago or be running again; after a state
                // loss, verdicts wait one window; a task id is only a name.
                let held = if event.body.recovered == Some(true) {
                    Some("its OOM kill was recovered after the fact, not seen live".to_string())
                } else if let Some(why) = unproven {
                    Some(why)
                } else {
                    self.gate.holds()
                };
                match held {
                    Some(why) => {
                        self.count("skipped");
                        report(
                            &self.recorder,
                            EventKind::ActionSkipped,
                            worker,
                            None,
                            format!("job {job} not requeued: {why}"),
                        );
                        Ok(())
                    }
                    None => self.requeue(job).await,
                }
            }
            _ => Ok(()),
        }
    }

    async fn node_fields(&self, node: &str) -> Result<BTreeMap<String, String>, ScontrolError> {
        let out = self
            .scontrol(&["show".into(), "node".into(), node.into(), "-o".into()])
            .await?;
        Ok(scontrol::fields(out.lines().next().unwrap_or("")))
    }

    /// Every node as the controller sees it now.
    async fn nodes(&self) -> Result<Vec<Node>, ScontrolError> {
        let out = self
            .scontrol(&["show".into(), "node".into(), "-o".into()])
            .await?;
        Ok(nodes::parse(&out))
    }
}

impl Sink for SlurmSink {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn delivery(&self) -> &Delivery {
        &self.config.delivery
    }

    async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
        for event in batch {
            if event.seq <= self.state.last_seq {
                continue;
            }
            match self.handle(event).await {
                Ok(()) => {}
                Err(error) if !error.transient() => {
                    warn!(sink = %self.config.name, seq = event.seq, kind = event.body.kind.as_str(), %error, "scontrol refused; not retried");
                    self.recorder
                        .metrics()
                        .sink_failures
                        .with_label_values(&[self.config.name.as_str(), error.class().as_str()])
                        .inc();
                }
                Err(error) => {
                    // What was done so far is remembered; the rest is retried.
                    self.save()?;
                    return Err(SendError::new(error.class(), error.to_string()));
                }
            }
            self.state.last_seq = event.seq;
        }
        self.save()
    }
}

#[cfg(test)]
mod tests;
