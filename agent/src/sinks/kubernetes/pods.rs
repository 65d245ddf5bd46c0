//! Pods by name: a watch of this node's pods (field selector
//! `spec.nodeName`) that keeps [`PodNames`] filled, so that every event
//! with a `pod_uid` also names its namespace, pod and container. While the
//! API cannot be reached, events carry the UID alone; the watch lists
//! again when it comes back (kube-runtime's watcher, with its backoff).

use std::collections::HashMap;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::sync::watch;
use tracing::{info, warn};

use super::names::{PodName, PodNames};

/// The pod's UID and names.
pub(crate) fn pod_name(pod: &Pod) -> Option<(String, PodName)> {
    let meta = &pod.metadata;
    let uid = meta.uid.clone()?;
    let containers = pod
        .status
        .iter()
        .flat_map(|s| {
            let all = [
                s.init_container_statuses.as_deref(),
                s.container_statuses.as_deref(),
                s.ephemeral_container_statuses.as_deref(),
            ];
            all.into_iter().flatten().flatten()
        })
        .filter_map(|c| {
            let id = c.container_id.as_deref()?;
            let bare = id.split_once("://").map_or(id, |(_, rest)| rest);
            Some((bare.to_string(), c.name.clone()))
        })
        .collect();
    Some((
        uid,
        PodName {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone()?,
            containers,
        },
    ))
}

/// Watches `node`'s pods into `names` until `stop` turns true.
pub(crate) async fn watch_pods(
    client: Client,
    node: String,
    names: PodNames,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut listing: Option<HashMap<String, PodName>> = None;
    let mut failing = false;
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            _ = stop.changed() => return,
        };
        let Some(next) = next else { return };
        let event = match next {
            Ok(event) => event,
            Err(e) => {
                if !failing {
                    warn!(%node, error = %e, "pod watch failing: events carry pod UIDs without names until it lists again");
                }
                failing = true;
                continue;
            }
        };
        match event {
            watcher::Event::Init => listing = Some(HashMap::new()),
            watcher::Event::InitApply(pod) => {
                if let (Some(list), Some((uid, name))) = (listing.as_mut(), pod_name(&pod)) {
                    list.insert(uid, name);
                }
            }
            watcher::Event::InitDone => {
                if let Some(list) = listing.take() {
                    if failing {
                        info!(%node, pods = list.len(), "pod watch listing again");
                    }
                    failing = false;
                    names.replace(list);
                }
            }
            watcher::Event::Apply(pod) => {
                if let Some((uid, name)) = pod_name(&pod) {
                    names.insert(uid, name);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    names.delete(uid);
                }
            }
        }
    }
}
