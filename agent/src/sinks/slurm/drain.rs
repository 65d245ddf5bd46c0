//! Draining and resuming nodes: Slurm's part of the action protocol
//! (sinks/action.rs runs the sequence: stale, gate, guard, the drain, the
//! re-check), and what a restarting controller asks of a resume.

use tracing::{info, warn};

use super::{
    MAX_REASON, REASON_PREFIX, SlurmSink,
    nodes::{self, Node},
    scontrol::ScontrolError,
};
use crate::{
    model::event::{Event, EventKind},
    sinks::{
        action::{Acted, Plan, Read, Scheduler, Words, heartbeat_statuses},
        guard::Capacity,
        report, stale, stale_prediction,
    },
};

impl Scheduler for SlurmSink {
    type Error = ScontrolError;

    fn sink(&self) -> &str {
        &self.config.name
    }

    fn words(&self) -> Words {
        Words {
            doing: "draining",
            done: "drained",
            noun: "drain",
            undone: "resumed",
        }
    }

    fn subject(&self, worker: &str) -> String {
        format!("node {}", self.node_of(worker))
    }

    fn stale(&self, worker: &str) -> Option<String> {
        stale(&self.health, worker)
    }

    fn stale_prediction(&self, worker: &str) -> Option<String> {
        stale_prediction(&self.eta, worker)
    }

    /// The nodes of the worker's node's partitions, as the controller
    /// lists them: every node drained, draining or down, by anyone, counts
    /// as gone.
    async fn read(&mut self, worker: &str) -> Result<Read, ScontrolError> {
        let node = self.node_of(worker);
        let all = self.nodes().await?;
        let Some(me) = all.iter().find(|n| n.name == node) else {
            warn!(sink = %self.config.name, %node, %worker, "the controller does not know this node; not drained");
            return Ok(Read::Nothing(format!(
                "the controller does not know node {node}"
            )));
        };
        if self.state.drained.contains_key(&node) && !me.drained_by_memwatch() {
            // Resumed (or re-drained) by an operator since: what the state
            // file says is the past, and the node is drainable again.
            info!(sink = %self.config.name, %node, state = %me.state, "node memwatch drained was changed by someone else; forgotten");
            self.state.drained.remove(&node);
        }
        if let Some(workers) = self.state.drained.get_mut(&node) {
            workers.insert(worker.to_string());
            return Ok(Read::Done(format!("node {node} is drained by memwatch")));
        }
        if me.state.contains("DRAIN") {
            return Ok(self.already_drained(worker, &node, me));
        }
        let taking = usize::from(!me.gone());
        Ok(Read::Act(Plan {
            subject: format!("node {node}"),
            members: vec![node.clone()],
            taking,
            running: taking,
            capacity: nodes::capacity(&nodes::pool(&all, me)),
        }))
    }

    async fn act(
        &mut self,
        worker: &str,
        plan: &Plan,
        why: Option<&str>,
    ) -> Result<Acted, ScontrolError> {
        let node = plan.scheduler_worker();
        self.scontrol(&[
            "update".into(),
            format!("NodeName={node}"),
            "State=DRAIN".into(),
            format!(
                "Reason={}",
                drain_reason(worker, why, self.stale(worker).is_some())
            ),
        ])
        .await?;
        // Kept as memwatch's drain from now: a resume that must wait for
        // the node is the recovery's to finish.
        self.state
            .drained
            .entry(node.to_string())
            .or_default()
            .insert(worker.to_string());
        self.count("drain");
        Ok(Acted::Done)
    }

    async fn undo(&mut self, _worker: &str, plan: &Plan) -> Result<bool, ScontrolError> {
        self.resume_node(plan.scheduler_worker()).await?;
        self.state.drained.remove(plan.scheduler_worker());
        Ok(true)
    }

    async fn recheck(&mut self, plan: &Plan) -> Result<(Capacity, Option<String>), ScontrolError> {
        let all = self.nodes().await?;
        let Some(me) = all.iter().find(|n| n.name == plan.scheduler_worker()) else {
            // Gone from the controller: nothing of ours to undo.
            return Ok((
                Capacity::default(),
                Some(plan.scheduler_worker().to_string()),
            ));
        };
        let pool = nodes::pool(&all, me);
        Ok((
            nodes::capacity(&pool),
            nodes::keeper(&pool).map(str::to_string),
        ))
    }

    fn report(
        &self,
        kind: EventKind,
        worker: &str,
        scheduler_worker: Option<&str>,
        reason: String,
    ) {
        let node = scheduler_worker
            .map(str::to_string)
            .unwrap_or_else(|| self.node_of(worker));
        report(&self.recorder, kind, Some(worker), Some(&node), reason);
    }

    fn count(&self, action: &str) {
        SlurmSink::count(self, action);
    }
}

impl SlurmSink {
    /// Runs the action protocol over the workers it holds.
    pub(super) async fn run_actions(&mut self) -> Result<(), ScontrolError> {
        let mut actions = std::mem::take(&mut self.actions);
        let result = actions.run(self).await;
        self.actions = actions;
        result
    }

    /// Actions follow the present: a worker whose node memwatch drained
    /// and that a heartbeat says is not unhealthy now is let go as if its
    /// `worker_recovered` had come (the node is resumed once none of its
    /// workers is unhealthy), so a lost recovery event leaves no node
    /// drained for ever.
    pub(super) async fn resume_healthy(&mut self, heartbeat: &Event) -> Result<(), ScontrolError> {
        let healthy: Vec<String> = heartbeat_statuses(heartbeat)
            .filter(|(_, status)| *status != "unhealthy")
            // A drain for a predicted kill lasts while the kill is predicted.
            .filter(|(name, _)| !self.config.imminent.drain || (self.eta)(name).is_none())
            .map(|(name, _)| name.to_string())
            .filter(|name| self.state.drained.values().any(|ws| ws.contains(name)))
            .collect();
        for worker in healthy {
            info!(sink = %self.config.name, %worker, "a heartbeat says the worker of a drained node is healthy: resumed as recovered");
            self.resume(&worker).await?;
        }
        Ok(())
    }

    /// `State=RESUME`. Right after the controller restarted, a node it has
    /// not heard from yet cannot be resumed ("Invalid node state
    /// specified"): that is tried again later, not given up.
    pub(super) async fn resume_node(&self, node: &str) -> Result<(), ScontrolError> {
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
    /// file lost: adopted) or by someone else (left alone, looked at again
    /// while the worker stays unhealthy).
    fn already_drained(&mut self, worker: &str, node: &str, me: &Node) -> Read {
        if me.drained_by_memwatch() {
            self.state
                .drained
                .entry(node.to_string())
                .or_default()
                .insert(worker.into());
            Read::Done(format!("node {node} was drained by memwatch"))
        } else {
            info!(sink = %self.config.name, %node, %worker, reason = %me.reason, "node already drained by someone else; left alone");
            Read::Nothing(format!("node {node} is drained by someone else"))
        }
    }

    pub(super) async fn resume(&mut self, worker: &str) -> Result<(), ScontrolError> {
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
}

/// The drain's `Reason=`: memwatch's mark, the worker and why, cut to what
/// Slurm keeps. `predicted`: drained for a predicted kill (the worker is
/// not unhealthy; `why` says when the kill is due).
fn drain_reason(worker: &str, why: Option<&str>, predicted: bool) -> String {
    let why = why.unwrap_or("no reason given");
    let mut reason = if predicted {
        format!("{REASON_PREFIX} worker {worker}: {why}")
    } else {
        format!("{REASON_PREFIX} worker {worker} unhealthy: {why}")
    };
    if reason.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    reason
}
