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
//! - `oom_kill` of a job: the job id is the `job_<N>` component of the
//!   victim's cgroup (Slurm's cgroup plugins), or the `slurm-<N>-…` task id
//!   `memwatch exec` gives a task inside a job. Policy `other_node`:
//!   `scontrol requeue <N>`, `update JobId=<N> ExcNodeList=<node it ran on>`,
//!   `update JobId=<N> StartTime=now` (a requeued job otherwise waits ~2
//!   minutes); `any_node` skips the exclusion; at most `max_requeues` per job.
//!
//! Transient failures (controller unreachable, `scontrol` timeout) fail the
//! batch and the delivery loop retries it with backoff; a refusal for good
//! (unknown job or node, job not requeueable) is logged, counted as
//! `status` and not retried. Events of a retried batch already acted on are
//! skipped (the last handled seq is in the same file).

mod config;
mod nodes;
pub(crate) mod scontrol;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

pub(crate) use self::config::{RequeuePolicy, SlurmConfig};
use self::{nodes::Node, scontrol::ScontrolError};
use crate::{
    model::event::{Event, EventKind},
    record::Recorder,
    sinks::{
        ActionGate, SinkContext, Start, WorkerHealth,
        config::Delivery,
        delivery::{FailureClass, SendError, Sink},
        report, stale,
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

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Vec<JoinHandle<()>>> {
        info!(sink = %self.name, scontrol = %self.scontrol.display(), drain = self.drain, requeue = ?self.requeue, "Slurm sink");
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
        sink.align(ctx.outbox.status().last_seq, ctx.outbox.epoch());
        Ok(vec![ctx.spawn_delivery(sink)])
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
    /// Whether actions are held back after a state loss.
    gate: ActionGate,
    /// Workers whose drain the gate held back, said once.
    gated: BTreeSet<String>,
    /// Unhealthy workers whose node is not drained (the guard kept it, or
    /// a concurrent drain elsewhere undid ours): tried again at every
    /// heartbeat that still says so.
    pending: BTreeSet<String>,
    /// Workers whose `guard_blocked` was reported in this episode.
    blocked: BTreeSet<String>,
    /// How long after a drain the view is read again ([`GUARD_SETTLE`]).
    settle: Duration,
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
        Ok(Self {
            config,
            default_node,
            path,
            state,
            recorder,
            health,
            gate: ActionGate::open(),
            gated: BTreeSet::new(),
            pending: BTreeSet::new(),
            blocked: BTreeSet::new(),
            settle: GUARD_SETTLE,
        })
    }

    fn save(&self) -> Result<(), SendError> {
        let write = || -> io::Result<()> {
            let tmp = self.path.with_extension("json.tmp");
            fs::write(&tmp, serde_json::to_vec_pretty(&self.state)?)?;
            fs::rename(&tmp, &self.path)
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
        let worker = event.body.worker.as_deref();
        match (event.body.kind, worker) {
            (EventKind::WorkerUnhealthy, Some(w)) if self.config.drain => {
                self.blocked.remove(w);
                self.drain(w, event.body.reason.as_deref()).await
            }
            (EventKind::WorkerRecovered, Some(w)) if self.config.drain => {
                self.pending.remove(w);
                self.blocked.remove(w);
                self.gated.remove(w);
                self.resume(w).await
            }
            (EventKind::Heartbeat, _) if self.config.drain => self.retry_pending(event).await,
            (EventKind::OomKill, _) if self.config.requeue != RequeuePolicy::Never => {
                match job_id(event) {
                    // Found in the kernel's counters after the fact: the
                    // job may have ended long ago, or be running again.
                    Some(job) if event.body.recovered == Some(true) => {
                        self.count("skipped");
                        report(
                            &self.recorder,
                            EventKind::ActionSkipped,
                            worker,
                            None,
                            format!(
                                "job {job} not requeued: its OOM kill was recovered after the fact, not seen live"
                            ),
                        );
                        Ok(())
                    }
                    Some(job) => match self.gate.holds() {
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
                    },
                    None => Ok(()),
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

    /// Drains the node of an unhealthy worker, within the cluster guard:
    /// never when fewer nodes of its partitions than the floor would stay
    /// open, counting every node drained, draining or down by anyone. After
    /// draining, the view is read again (once drains started elsewhere in
    /// the same moment have landed): if they crossed the floor together,
    /// the lowest-named node keeps its drain and the others are resumed.
    async fn drain(&mut self, worker: &str, why: Option<&str>) -> Result<(), ScontrolError> {
        let node = self.node_of(worker);
        if let Some(why) = stale(&self.health, worker) {
            self.skip_stale(worker, &node, why);
            return Ok(());
        }
        if let Some(why) = self.gate.holds() {
            // Tried again at every heartbeat that still says unhealthy.
            self.pending.insert(worker.to_string());
            if self.gated.insert(worker.to_string()) {
                info!(sink = %self.config.name, %node, %worker, %why, "drain held back");
                self.count("skipped");
                report(
                    &self.recorder,
                    EventKind::ActionSkipped,
                    Some(worker),
                    Some(&node),
                    format!(
                        "node {node} not drained yet: {why}; drained after that if the worker is still unhealthy"
                    ),
                );
            }
            return Ok(());
        }
        let all = self.nodes().await?;
        let Some(me) = all.iter().find(|n| n.name == node) else {
            warn!(sink = %self.config.name, %node, %worker, "the controller does not know this node; not drained");
            return Ok(());
        };
        if self.state.drained.contains_key(&node) && !me.drained_by_memwatch() {
            // Resumed (or re-drained) by an operator since: what the state
            // file says is the past, and the node is drainable again.
            info!(sink = %self.config.name, %node, state = %me.state, "node memwatch drained was changed by someone else; forgotten");
            self.state.drained.remove(&node);
        }
        if let Some(workers) = self.state.drained.get_mut(&node) {
            workers.insert(worker.to_string());
            return Ok(());
        }
        if me.state.contains("DRAIN") {
            self.already_drained(worker, &node, me);
            return Ok(());
        }
        let pool = nodes::pool(&all, me);
        let taking = usize::from(!me.gone());
        if let Err(blocked) = self
            .config
            .guard
            .check(&nodes::capacity(&pool), taking, taking)
        {
            let reason = format!(
                "not draining node {node}: {blocked}; retried while the worker stays unhealthy"
            );
            self.hold(worker, &node, &reason);
            return Ok(());
        }
        // Reading the nodes may have waited on a controller coming back:
        // the worker may have recovered meanwhile.
        if let Some(why) = stale(&self.health, worker) {
            self.skip_stale(worker, &node, why);
            return Ok(());
        }
        let reason = drain_reason(worker, why);
        let decided = std::time::Instant::now();
        self.scontrol(&[
            "update".into(),
            format!("NodeName={node}"),
            "State=DRAIN".into(),
            format!("Reason={reason}"),
        ])
        .await?;
        if let Some(why) = stale(&self.health, worker) {
            // The drain waited on the controller longer than the episode
            // lasted: the worker recovered while it was in flight. Undone
            // (kept as memwatch's drain until then: a resume that must wait
            // for the node is the recovery's to finish).
            self.state
                .drained
                .entry(node.clone())
                .or_default()
                .insert(worker.to_string());
            self.resume_node(&node).await?;
            self.state.drained.remove(&node);
            self.count("undo");
            self.skip_stale(
                worker,
                &node,
                format!("{why}; node {node} resumed: it recovered while the drain was in flight"),
            );
            return Ok(());
        }
        info!(sink = %self.config.name, %node, %worker, "node drained");
        self.count("drain");
        self.state
            .drained
            .entry(node.clone())
            .or_default()
            .insert(worker.to_string());
        self.pending.remove(worker);
        self.blocked.remove(worker);
        self.recheck(worker, &node, decided).await
    }

    /// Says (once per event) that acting on `worker` being unhealthy would
    /// act on the past.
    fn skip_stale(&mut self, worker: &str, node: &str, why: String) {
        info!(sink = %self.config.name, %node, %worker, %why, "drain skipped");
        self.pending.remove(worker);
        self.count("skipped");
        report(
            &self.recorder,
            EventKind::ActionSkipped,
            Some(worker),
            Some(node),
            why,
        );
    }

    /// `State=RESUME`. Right after the controller restarted, a node it has
    /// not heard from yet cannot be resumed ("Invalid node state
    /// specified"): that is tried again later, not given up.
    async fn resume_node(&self, node: &str) -> Result<(), ScontrolError> {
        let resumed = self
            .scontrol(&[
                "update".into(),
                format!("NodeName={node}"),
                "State=RESUME".into(),
            ])
            .await;
        match resumed {
            Err(ScontrolError::Refused { args, stderr })
                if stderr.to_lowercase().contains("invalid node state") =>
            {
                Err(ScontrolError::Unreachable {
                    args,
                    stderr: format!(
                        "{stderr} (the node has not registered with the controller yet)"
                    ),
                })
            }
            other => other.map(|_| ()),
        }
    }

    /// The node is drained already: by memwatch (a drain this sink's state
    /// file lost: adopted) or by someone else (left alone).
    fn already_drained(&mut self, worker: &str, node: &str, me: &Node) {
        if me.drained_by_memwatch() {
            self.state
                .drained
                .entry(node.to_string())
                .or_default()
                .insert(worker.into());
        } else {
            info!(sink = %self.config.name, %node, %worker, reason = %me.reason, "node already drained by someone else; left alone");
        }
    }

    /// The check after a drain: see [`SlurmSink::drain`].
    async fn recheck(
        &mut self,
        worker: &str,
        node: &str,
        decided: std::time::Instant,
    ) -> Result<(), ScontrolError> {
        tokio::time::sleep(self.settle).await;
        let all = self.nodes().await?;
        let Some(me) = all.iter().find(|n| n.name == node) else {
            return Ok(());
        };
        let pool = nodes::pool(&all, me);
        let keeper = nodes::keeper(&pool);
        if !self.config.guard.crossed(&nodes::capacity(&pool)) || keeper == Some(node) {
            debug!(sink = %self.config.name, %node, checked_after = ?decided.elapsed(), "drain re-checked");
            return Ok(());
        }
        self.resume_node(node).await?;
        self.state.drained.remove(node);
        self.count("undo");
        let reason = format!(
            "node {node} resumed: drained in the same moment as {} on another host, which crossed the \
             cluster guard's floor; {} keeps its drain (the lowest name); retried while the worker stays unhealthy",
            keeper.unwrap_or("another node"),
            keeper.unwrap_or("that node")
        );
        warn!(sink = %self.config.name, %node, undone_after = ?decided.elapsed(), "concurrent drains crossed the floor; ours undone");
        self.hold(worker, node, &reason);
        Ok(())
    }

    /// The worker stays unhealthy with its node open: say so once, and try
    /// again at the next heartbeat.
    fn hold(&mut self, worker: &str, node: &str, reason: &str) {
        self.pending.insert(worker.to_string());
        if self.blocked.insert(worker.to_string()) {
            warn!(sink = %self.config.name, %node, %worker, %reason, "drain held by the cluster guard");
            self.count("guard_blocked");
            report(
                &self.recorder,
                EventKind::GuardBlocked,
                Some(worker),
                Some(node),
                reason.to_string(),
            );
        }
    }

    /// At a heartbeat: a held worker still unhealthy is tried again (the
    /// cluster may have changed); one no longer unhealthy is let go.
    async fn retry_pending(&mut self, heartbeat: &Event) -> Result<(), ScontrolError> {
        for worker in self.pending.clone() {
            let status = heartbeat
                .body
                .state
                .as_ref()
                .and_then(|s| s.get("workers"))
                .and_then(|w| w.as_array())
                .and_then(|ws| {
                    ws.iter()
                        .find(|w| w.get("name").and_then(|n| n.as_str()) == Some(worker.as_str()))
                })
                .and_then(|w| w.get("status"))
                .and_then(|s| s.as_str());
            if status == Some("unhealthy") {
                self.drain(&worker, None).await?;
            } else {
                self.pending.remove(&worker);
                self.blocked.remove(&worker);
            }
        }
        Ok(())
    }

    async fn resume(&mut self, worker: &str) -> Result<(), ScontrolError> {
        let node = self.node_of(worker);
        let Some(workers) = self.state.drained.get_mut(&node) else {
            return Ok(());
        };
        workers.remove(worker);
        if !workers.is_empty() {
            return Ok(());
        }
        let fields = self.node_fields(&node).await?;
        let reason = fields.get("Reason").map_or("", String::as_str);
        let state = fields.get("State").map_or("", String::as_str);
        if state.contains("DRAIN") && reason.starts_with(REASON_PREFIX) {
            self.resume_node(&node).await?;
            info!(sink = %self.config.name, %node, %worker, "node resumed");
            self.count("resume");
        } else {
            info!(sink = %self.config.name, %node, %state, %reason, "node no longer drained by memwatch; not resumed");
        }
        self.state.drained.remove(&node);
        Ok(())
    }

    async fn requeue(&mut self, job: u64) -> Result<(), ScontrolError> {
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
}

impl SlurmSink {
    /// Waits (bounded by the sink's `timeout`) until `job` is pending;
    /// `false` when it started or ended first.
    async fn wait_pending(&self, job: u64) -> Result<bool, ScontrolError> {
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

/// The Slurm job of an `oom_kill` event: a `job_<N>` cgroup component, or
/// a `slurm-<N>-…` task id (`memwatch exec` inside a job).
pub(crate) fn job_id(event: &Event) -> Option<u64> {
    let from_cgroup = event.body.cgroup.as_deref().and_then(|path| {
        path.split('/')
            .rev()
            .find_map(|part| part.strip_prefix("job_")?.parse().ok())
    });
    let from_task = || {
        let rest = event.body.task_id.as_deref()?.strip_prefix("slurm-")?;
        rest.split('-').next()?.parse().ok()
    };
    from_cgroup.or_else(from_task)
}

/// The drain's `Reason=`: memwatch's mark, the worker and why, cut to what
/// Slurm keeps.
fn drain_reason(worker: &str, why: Option<&str>) -> String {
    let mut reason = format!(
        "{REASON_PREFIX} worker {worker} unhealthy: {}",
        why.unwrap_or("no reason given")
    );
    if reason.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    reason
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
