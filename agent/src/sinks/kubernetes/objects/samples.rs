//! Every object and patch the sink sends, filled as it fills them, for the
//! offline proofs (tests/ops/kube_api.rs) and the admission policy's check.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::*;

/// Every kind of object and patch the sink sends, filled as it fills them,
/// for the offline proofs: (file stem, what it is, the JSON). What it is:
/// `object` (validated as is), `status-patch` or `patch` (merged into a
/// Node with `kubectl patch --local --type=strategic`, the result
/// validated), `event-patch` (merged into the first `object` Event).
#[doc(hidden)]
pub fn samples() -> Vec<(&'static str, &'static str, Value)> {
    let mut all = vec![("node", "node", sample_node())];
    all.extend(node_patches());
    all.extend(events());
    all
}

/// When the samples were made.
fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-02T06:00:00.123456Z")
        .unwrap()
        .with_timezone(&Utc)
}

/// The condition and taint patches of [`sample_node`].
fn node_patches() -> Vec<(&'static str, &'static str, Value)> {
    let node: Node = serde_json::from_value(sample_node()).unwrap();
    let sick = [Unhealthy {
        worker: "w1".into(),
        reason: "memory 3.0 GiB over the soft cap 2.0 GiB".into(),
    }];
    let refresh = chrono::Duration::minutes(5);
    let condition = |unhealthy: &[Unhealthy]| {
        condition_patch(&node, unhealthy, now(), refresh).expect("a node without the condition")
    };
    vec![
        ("condition-unhealthy", "status-patch", condition(&sick)),
        ("condition-healthy", "status-patch", condition(&[])),
        ("taint-on", "patch", taint_patch(&node, true)),
        ("taint-off", "patch", taint_patch(&node, false)),
    ]
}

/// One Event of each kind the sink makes, then the series patch of the first.
fn events() -> Vec<(&'static str, &'static str, Value)> {
    let pod = Regarding::Pod {
        namespace: "default".into(),
        name: "hog-7d9f".into(),
        uid: "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b".into(),
    };
    let node = Regarding::Node { name: "n1".into() };
    let kinds = [
        (
            "event-oom-pod",
            pod.clone(),
            "Warning",
            "OOMKilling",
            "Observe",
            "Memory cgroup out of memory: killed process 4242 (python3), total-vm 2.0 GiB",
        ),
        (
            "event-imminent-pod",
            pod.clone(),
            "Warning",
            "OOMImminent",
            "Observe",
            "memwatch: oom imminent, kill in 12 s, limit 512 MiB, task t1, worker w1",
        ),
        (
            "event-soft-cap-pod",
            pod,
            "Warning",
            "SoftCapExceeded",
            "Observe",
            "task over its soft cap",
        ),
        (
            "event-unhealthy-node",
            node.clone(),
            "Warning",
            "WorkerUnhealthy",
            "MarkUnhealthy",
            "worker w1 unhealthy",
        ),
        (
            "event-recovered-node",
            node,
            "Normal",
            "WorkerRecovered",
            "MarkHealthy",
            "worker w1 recovered",
        ),
    ];
    let ids = ["0193a0b4-7c1e-7a2b-9c3d-4e5f60718293", "5", "2", "3", "4"];
    let mut all: Vec<_> = kinds
        .into_iter()
        .zip(ids)
        .map(|((stem, regarding, type_, reason, action, note), id)| {
            let spec = EventSpec {
                regarding,
                type_,
                reason,
                action,
                note: note.into(),
            };
            (
                stem,
                "object",
                event_object(&spec, &event_name("n1", id), "n1", now()),
            )
        })
        .collect();
    all.push((
        "event-series",
        "event-patch",
        series_patch(2, now(), "second kill"),
    ));
    all
}

/// A Node as the API server would return it, with another controller's
/// condition and taint (a patch must keep both).
#[doc(hidden)]
pub fn sample_node() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "resourceVersion": "4711", "labels": {"kubernetes.io/hostname": "n1"}},
        "spec": {"taints": [{"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": "2026-12-02T05:59:50Z",
                "lastTransitionTime": "2026-12-01T00:00:00Z"
            }]
        }
    })
}
