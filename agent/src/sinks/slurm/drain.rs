//! Draining and resuming nodes: the cluster guard, the re-check after a
//! drain, and what a restarting controller asks of both.

use tracing::{debug, info, warn};

use super::{
    MAX_REASON, REASON_PREFIX, SlurmSink,
    nodes::{self, Node},
    scontrol::ScontrolError,
};
use crate::{
    model::event::{Event, EventKind},
    sinks::{report, stale},
};

impl SlurmSink {
    /// Drains the node of an unhealthy worker, within the cluster guard:
    /// never when fewer nodes of its partitions than the floor would stay
    /// open, counting every node drained, draining or down by anyone. After
    /// draining, the view is read again (once drains started elsewhere in
    /// the same moment have landed): if they crossed the floor together,
    /// the lowest-named node keeps its drain and the others are resumed.
    // Long, on purpose: the same ordered checks as the Dask sink's
    // retirement (stale, gate, operator's drain, guard, stale again, the
    // update, stale after it, the re-check), sharing the node view.
    pub(super) async fn drain(
        &mut self,
        worker: &str,
        why: Option<&str>,
    ) -> Result<(), ScontrolError> {
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
    pub(super) fn skip_stale(&mut self, worker: &str, node: &str, why: String) {
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
    /// file lost: adopted) or by someone else (left alone).
    pub(super) fn already_drained(&mut self, worker: &str, node: &str, me: &Node) {
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
    pub(super) async fn recheck(
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
    pub(super) fn hold(&mut self, worker: &str, node: &str, reason: &str) {
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
    pub(super) async fn retry_pending(&mut self, heartbeat: &Event) -> Result<(), ScontrolError> {
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
