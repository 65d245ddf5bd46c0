//! The names of the node's pods by UID, the Kubernetes sink's state: filled
//! by its watch of the node's pods (pods.rs) and lent to the recorder as an
//! event enricher (`sinks::Lent`), so every event with a `pod_uid` gets the
//! pod's namespace, name and container name.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::Instant,
};

use crate::model::event::{Enrich, EventBody};

/// How long a deleted pod's names are kept: an event read after its pod
/// is gone (a kill at the pod's end) is still named.
pub(crate) const DELETED_POD_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

/// A pod as the API names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodName {
    pub namespace: String,
    pub name: String,
    /// Container names by runtime id (without `containerd://`).
    pub containers: HashMap<String, String>,
}

/// Pod names by UID, shared: filled from a watch of the node's pods
/// (sinks/kubernetes/pods.rs), read by every event with a `pod_uid`.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodNames(Arc<RwLock<Names>>);

#[derive(Debug, Default)]
struct Names {
    pods: HashMap<String, PodName>,
    /// Deleted pods, kept for [`DELETED_POD_KEPT`]: (UID, when).
    deleted: Vec<(String, Instant)>,
}

impl PodNames {
    /// The pod of `uid`, when known.
    pub(crate) fn get(&self, uid: &str) -> Option<PodName> {
        self.read().pods.get(uid).cloned()
    }

    /// Adds or replaces a pod.
    pub(crate) fn insert(&self, uid: String, pod: PodName) {
        let mut names = self.write();
        names.deleted.retain(|(u, _)| *u != uid);
        names.pods.insert(uid, pod);
    }

    /// A pod was deleted: its names stay for a while.
    pub(crate) fn delete(&self, uid: &str) {
        let mut names = self.write();
        let now = Instant::now();
        names.deleted.push((uid.to_string(), now));
        names.prune(now);
    }

    /// A fresh list replaces what was known (a watch restarted): pods not
    /// in it count as deleted now.
    pub(crate) fn replace(&self, pods: HashMap<String, PodName>) {
        let mut names = self.write();
        let now = Instant::now();
        let gone: Vec<String> = names
            .pods
            .keys()
            .filter(|uid| !pods.contains_key(*uid) && !names.deleted.iter().any(|(u, _)| u == *uid))
            .cloned()
            .collect();
        names.deleted.extend(gone.into_iter().map(|uid| (uid, now)));
        for (uid, pod) in pods {
            names.pods.insert(uid, pod);
        }
        names.prune(now);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Names> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Names> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Lent by the Kubernetes sink, whose pod watch fills it.
impl Enrich for PodNames {
    /// Fills `pod_namespace`, `pod_name` and `container_name` of an event
    /// that has a `pod_uid`, when the pod is known.
    fn enrich(&self, body: &mut EventBody) {
        let Some(uid) = body.pod_uid.as_deref() else {
            return;
        };
        let names = self.read();
        let Some(pod) = names.pods.get(uid) else {
            return;
        };
        body.pod_namespace = Some(pod.namespace.clone());
        body.pod_name = Some(pod.name.clone());
        body.container_name = body
            .container_id
            .as_deref()
            .and_then(|id| pod.containers.get(id))
            .cloned();
    }
}

impl Names {
    fn prune(&mut self, now: Instant) {
        let Self { pods, deleted } = self;
        deleted.retain(|(uid, at)| {
            let keep = now.duration_since(*at) < DELETED_POD_KEPT;
            if !keep {
                pods.remove(uid);
            }
            keep
        });
    }
}
