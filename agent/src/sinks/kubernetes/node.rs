//! The node says the present: the `MemwatchUnhealthy` condition, and with
//! `taint = true` the `memwatch.io/unhealthy:NoSchedule` taint, under the
//! cluster guard.

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams};
use tracing::info;

use super::{
    KubernetesSink, NAME,
    objects::{self, Unhealthy},
};
use crate::{
    model::{event::EventKind, health::Health},
    sinks::{
        action::{Acted, Plan, Read, Scheduler, Words},
        guard::Capacity,
        report,
    },
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
            // The episode is over: a later refusal is said again.
            self.actions.forget(&self.node.clone());
        }
        Ok(())
    }

    async fn reconcile_taint(&mut self, node: Node, want: bool) -> Result<(), kube::Error> {
        let has = objects::has_taint(&node);
        let key = self.node.clone();
        if !want {
            self.actions.forget(&key);
            if has {
                self.set_taint(node, false).await?;
                info!(node = %self.node, "taint {} removed: every worker is healthy", objects::TAINT_KEY);
                self.count("untaint");
            }
            return Ok(());
        }
        self.current = Some(node);
        self.actions.want(&key, None);
        let mut actions = std::mem::take(&mut self.actions);
        let result = actions.run(self).await;
        self.actions = actions;
        result
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
}

/// The taint's part of the action protocol. The protocol's worker is the
/// node (the taint is the node's, whichever workers are unhealthy): stale
/// once no worker is unhealthy.
impl Scheduler for KubernetesSink {
    type Error = kube::Error;

    fn sink(&self) -> &str {
        NAME
    }

    fn words(&self) -> Words {
        Words {
            doing: "tainting",
            done: "tainted",
            noun: "taint",
            undone: "untainted",
        }
    }

    fn subject(&self, _node: &str) -> String {
        format!("node {}", self.node)
    }

    fn stale(&self, _node: &str) -> Option<String> {
        self.unhealthy()
            .is_empty()
            .then(|| "no worker is unhealthy now: nothing done".to_string())
    }

    async fn read(&mut self, _node: &str) -> Result<Read, kube::Error> {
        let node = match self.current.clone() {
            Some(node) => node,
            None => self.nodes().get(&self.node).await?,
        };
        if objects::has_taint(&node) {
            return Ok(Read::Done(format!("node {} has the taint", self.node)));
        }
        let all = self.nodes().list(&ListParams::default()).await?.items;
        let taking = usize::from(!objects::unschedulable(&node));
        Ok(Read::Act(Plan {
            subject: format!("node {}", self.node),
            members: vec![self.node.clone()],
            taking,
            running: taking,
            capacity: objects::capacity(&all),
        }))
    }

    async fn act(
        &mut self,
        _node: &str,
        _plan: &Plan,
        _why: Option<&str>,
    ) -> Result<Acted, kube::Error> {
        let node = match self.current.take() {
            Some(node) => node,
            None => self.nodes().get(&self.node).await?,
        };
        self.set_taint(node, true).await?;
        info!(node = %self.node, "taint {}:{} set", objects::TAINT_KEY, objects::TAINT_EFFECT);
        self.count("taint");
        Ok(Acted::Done)
    }

    async fn undo(&mut self, _node: &str, _plan: &Plan) -> Result<bool, kube::Error> {
        let node = self.nodes().get(&self.node).await?;
        self.set_taint(node, false).await?;
        Ok(true)
    }

    async fn recheck(&mut self, _plan: &Plan) -> Result<(Capacity, Option<String>), kube::Error> {
        let all = self.nodes().list(&ListParams::default()).await?.items;
        Ok((
            objects::capacity(&all),
            objects::keeper(&all).map(str::to_string),
        ))
    }

    fn report(&self, kind: EventKind, _node: &str, scheduler_worker: Option<&str>, reason: String) {
        let worker = self.unhealthy().first().map(|u| u.worker.clone());
        report(
            &self.recorder,
            kind,
            worker.as_deref(),
            Some(scheduler_worker.unwrap_or(&self.node)),
            reason,
        );
    }

    fn count(&self, action: &str) {
        KubernetesSink::count(self, action);
    }
}
