//! The node says the present: the `MemwatchUnhealthy` condition, and with
//! `taint = true` the `memwatch.io/unhealthy:NoSchedule` taint, under the
//! cluster guard.

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams};
use tracing::{info, warn};

use super::{
    KubernetesSink,
    objects::{self, Unhealthy},
};
use crate::{
    model::{event::EventKind, health::Health},
    sinks::report,
};

/// How long after tainting the nodes are read again: longer than another
/// agent takes from its read of the nodes to its own taint landing (one API
/// round trip), so taints set in the same moment are seen from both sides.
pub(super) const GUARD_SETTLE: Duration = Duration::from_secs(2);
/// The condition's heartbeat is renewed at least this often.
pub(super) const CONDITION_REFRESH: chrono::Duration = chrono::Duration::minutes(5);
/// Times a taint change is tried again at once after a conflict (someone
/// changed the node between the read and the patch).
const CONFLICT_RETRIES: usize = 5;

impl KubernetesSink {
    /// The workers unhealthy now, with why.
    fn unhealthy(&self) -> Vec<Unhealthy> {
        self.workers
            .iter()
            .filter(|w| (self.health)(w) == Some(Health::Unhealthy))
            .map(|w| Unhealthy {
                worker: w.clone(),
                reason: self
                    .reasons
                    .get(w)
                    .cloned()
                    .unwrap_or_else(|| "reason not known yet".into()),
            })
            .collect()
    }

    /// Makes the node say what the watchdog says now.
    pub(super) async fn reconcile(&mut self) -> Result<(), kube::Error> {
        let unhealthy = self.unhealthy();
        let node = self.nodes().get(&self.node).await?;
        if self.config.condition
            && let Some(patch) =
                objects::condition_patch(&node, &unhealthy, Utc::now(), CONDITION_REFRESH)
        {
            self.nodes()
                .patch_status(
                    &self.node,
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await?;
            if objects::current_condition(&node).map(|c| c.status.as_str())
                != patch["status"]["conditions"][0]["status"].as_str()
            {
                info!(node = %self.node, unhealthy = unhealthy.len(), "node condition {} set", objects::CONDITION_TYPE);
                self.count("condition");
            }
        }
        if self.config.taint {
            self.reconcile_taint(node, !unhealthy.is_empty()).await?;
        }
        if unhealthy.is_empty() {
            self.blocked = false;
        }
        Ok(())
    }

    async fn reconcile_taint(&mut self, node: Node, want: bool) -> Result<(), kube::Error> {
        let has = objects::has_taint(&node);
        if !want {
            if has {
                self.set_taint(node, false).await?;
                info!(node = %self.node, "taint {} removed: every worker is healthy", objects::TAINT_KEY);
                self.count("untaint");
            }
            return Ok(());
        }
        if has {
            return Ok(());
        }
        if let Some(why) = self.gate.holds() {
            self.hold(
                EventKind::ActionSkipped,
                format!("node {} not tainted yet: {why}", self.node),
            );
            return Ok(());
        }
        let all = self.nodes().list(&ListParams::default()).await?.items;
        let taking = usize::from(!objects::unschedulable(&node));
        if let Err(blocked) = self
            .config
            .guard
            .check(&objects::capacity(&all), taking, taking)
        {
            self.hold(
                EventKind::GuardBlocked,
                format!(
                    "not tainting node {}: {blocked}; retried while a worker stays unhealthy",
                    self.node
                ),
            );
            return Ok(());
        }
        // The list may have waited on the API: the present may have moved.
        if self.unhealthy().is_empty() {
            return Ok(());
        }
        self.set_taint(node, true).await?;
        info!(node = %self.node, "taint {}:{} set", objects::TAINT_KEY, objects::TAINT_EFFECT);
        self.count("taint");
        self.recheck().await
    }

    /// The check after tainting: when taints set in the same moment on
    /// other nodes crossed the floor, the lowest-named node keeps its taint
    /// and the others take theirs off.
    async fn recheck(&mut self) -> Result<(), kube::Error> {
        tokio::time::sleep(self.settle).await;
        let all = self.nodes().list(&ListParams::default()).await?.items;
        let keeper = objects::keeper(&all).map(str::to_string);
        if !self.config.guard.crossed(&objects::capacity(&all))
            || keeper.as_deref() == Some(&self.node)
        {
            return Ok(());
        }
        let node = self.nodes().get(&self.node).await?;
        self.set_taint(node, false).await?;
        self.count("undo");
        warn!(node = %self.node, "taints set in the same moment crossed the cluster guard's floor; ours taken off");
        let keeper = keeper.unwrap_or_else(|| "another node".into());
        self.hold(
            EventKind::GuardBlocked,
            format!(
                "taint on node {} taken off: set in the same moment as {keeper}'s, which crossed the cluster \
                 guard's floor; {keeper} keeps its taint (the lowest name); retried while a worker stays unhealthy",
                self.node
            ),
        );
        Ok(())
    }

    /// Adds or removes the taint, reading the node again after a conflict.
    async fn set_taint(&self, mut node: Node, on: bool) -> Result<(), kube::Error> {
        let mut conflicts = 0;
        loop {
            let patch = objects::taint_patch(&node, on);
            match self
                .nodes()
                .patch(
                    &self.node,
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 409 && conflicts < CONFLICT_RETRIES => {
                    conflicts += 1;
                    node = self.nodes().get(&self.node).await?;
                    if objects::has_taint(&node) == on {
                        return Ok(());
                    }
                }
                other => return other.map(|_| ()),
            }
        }
    }

    /// Says once per episode why the node stays schedulable.
    fn hold(&mut self, kind: EventKind, reason: String) {
        if self.blocked {
            return;
        }
        self.blocked = true;
        warn!(node = %self.node, %reason, "taint held");
        self.count(if kind == EventKind::GuardBlocked {
            "guard_blocked"
        } else {
            "skipped"
        });
        let worker = self.unhealthy().first().map(|u| u.worker.clone());
        report(
            &self.recorder,
            kind,
            worker.as_deref(),
            Some(&self.node),
            reason,
        );
    }
}
