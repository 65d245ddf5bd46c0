//! What the Kubernetes sink sends, as JSON: the node condition's
//! strategic-merge patch, the taint list, Events and their series, and the
//! node view the cluster guard reads. Pure: every object here is validated
//! offline against the Kubernetes OpenAPI schemas (tests/ops/kube_api.rs,
//! through [`samples`]).

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use crate::sinks::guard::Capacity;

/// The NodeCondition's type.
pub const CONDITION_TYPE: &str = "MemwatchUnhealthy";
/// The taint's key (effect `NoSchedule`).
pub const TAINT_KEY: &str = "memwatch.io/unhealthy";
pub const TAINT_EFFECT: &str = "NoSchedule";
/// `reportingController` of every Event (a qualified name, as the API asks).
pub const CONTROLLER: &str = "memwatch.io/agent";
/// Longest `note` the API takes (events.k8s.io/v1: 1 kB).
pub const MAX_NOTE: usize = 1024;
/// Longest condition message kept (the API sets no limit; `kubectl
/// describe` shows it on one line).
pub const MAX_MESSAGE: usize = 1024;

/// A worker unhealthy now, with why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    pub worker: String,
    pub reason: String,
}

/// `status`, `reason` and `message` of the condition for `unhealthy`.
pub fn condition_state(unhealthy: &[Unhealthy]) -> (&'static str, &'static str, String) {
    if unhealthy.is_empty() {
        return (
            "False",
            "WorkersHealthy",
            "memwatch: every worker is healthy".into(),
        );
    }
    let list = unhealthy
        .iter()
        .map(|u| format!("{} ({})", u.worker, u.reason))
        .collect::<Vec<_>>()
        .join("; ");
    let message = cut(
        format!("memwatch: {} worker(s) unhealthy: {list}", unhealthy.len()),
        MAX_MESSAGE,
    );
    ("True", "WorkerUnhealthy", message)
}

/// The node's memwatch condition as it stands: (status, reason, message,
/// lastHeartbeatTime, lastTransitionTime).
pub fn current_condition(node: &Node) -> Option<&k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_TYPE)
}

/// The strategic-merge patch of `nodes/status` that sets the condition
/// (conditions merge by `type`: no other condition is touched). `None`
/// when the node already says so and its heartbeat is younger than
/// `refresh`. `lastTransitionTime` moves only when the status does.
pub fn condition_patch(
    node: &Node,
    unhealthy: &[Unhealthy],
    now: DateTime<Utc>,
    refresh: chrono::Duration,
) -> Option<Value> {
    let (status, reason, message) = condition_state(unhealthy);
    let current = current_condition(node);
    let same = current.is_some_and(|c| {
        c.status == status
            && c.reason.as_deref() == Some(reason)
            && c.message.as_deref() == Some(message.as_str())
    });
    let beat = current
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0));
    if same && beat.is_some_and(|b| now - b < refresh) {
        return None;
    }
    let transition = match current {
        Some(c) if c.status == status => c
            .last_transition_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| stamp(now)),
        _ => stamp(now),
    };
    Some(json!({
        "status": {
            "conditions": [{
                "type": CONDITION_TYPE,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp(now),
                "lastTransitionTime": transition,
            }]
        }
    }))
}

/// Whether the node carries memwatch's taint.
pub fn has_taint(node: &Node) -> bool {
    taints(node).iter().any(|t| t["key"] == TAINT_KEY)
}

/// The node's taints, as JSON.
fn taints(node: &Node) -> Vec<Value> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .map(|t| serde_json::to_value(t).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// The patch of the node that adds (`on`) or removes memwatch's taint and
/// leaves every other taint as it is. `spec.taints` has no merge key (a
/// patch replaces the list): the patch carries the node's
/// `resourceVersion`, so that it is refused (409) if anyone changed the
/// node since it was read.
pub fn taint_patch(node: &Node, on: bool) -> Value {
    let mut list: Vec<Value> = taints(node)
        .into_iter()
        .filter(|t| t["key"] != TAINT_KEY)
        .collect();
    if on {
        list.push(json!({"key": TAINT_KEY, "effect": TAINT_EFFECT, "value": "true"}));
    }
    json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": list}
    })
}

/// Whether kube-scheduler places no new pod on the node, for any reason:
/// cordoned, or a `NoSchedule`/`NoExecute` taint by anyone (a
/// control-plane node's too).
pub fn unschedulable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.unschedulable).unwrap_or(false)
        || spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
            ts.iter()
                .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        })
}

/// The cluster guard's view of the nodes: every node listed, those
/// unschedulable count as leaving.
pub(crate) fn capacity(nodes: &[Node]) -> Capacity {
    let leaving = nodes.iter().filter(|n| unschedulable(n)).count();
    Capacity {
        listed: nodes.len(),
        leaving,
        running: nodes.len() - leaving,
    }
}

/// Of the nodes carrying memwatch's taint, the one that keeps it when
/// taints set in the same moment crossed the floor: the lowest name.
pub fn keeper(nodes: &[Node]) -> Option<&str> {
    nodes
        .iter()
        .filter(|n| has_taint(n))
        .filter_map(|n| n.metadata.name.as_deref())
        .min()
}

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Regarding {
    Node {
        name: String,
    },
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
}

impl Regarding {
    /// The Event's namespace: the pod's, or `default` for the node (as
    /// kubelet does).
    pub fn namespace(&self) -> &str {
        match self {
            Self::Node { .. } => "default",
            Self::Pod { namespace, .. } => namespace,
        }
    }

    fn reference(&self) -> Value {
        match self {
            Self::Node { name } => json!({"apiVersion": "v1", "kind": "Node", "name": name}),
            Self::Pod {
                namespace,
                name,
                uid,
            } => json!({
                "apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid
            }),
        }
    }
}

/// One Event to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub regarding: Regarding,
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// UpperCamelCase: `OOMKilling`, `SoftCapExceeded`, `WorkerUnhealthy`, `WorkerRecovered`.
    pub reason: &'static str,
    /// What memwatch did or saw: `Observe`, `MarkUnhealthy`, `MarkHealthy`.
    pub action: &'static str,
    pub note: String,
}

/// The Event object for `spec`, named `name`, first seen at `time`.
pub fn event_object(spec: &EventSpec, name: &str, node: &str, time: DateTime<Utc>) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": spec.regarding.namespace()},
        "eventTime": micro(time),
        "reportingController": CONTROLLER,
        "reportingInstance": cut(format!("memwatch-{node}"), 128),
        "action": spec.action,
        "reason": spec.reason,
        "type": spec.type_,
        "note": cut(spec.note.clone(), MAX_NOTE),
        "regarding": spec.regarding.reference(),
    })
}

/// The merge patch that counts one more occurrence of an Event (its
/// series), with the latest note.
pub fn series_patch(count: i32, last: DateTime<Utc>, note: &str) -> Value {
    json!({
        "series": {"count": count, "lastObservedTime": micro(last)},
        "note": cut(note.to_string(), MAX_NOTE),
    })
}

/// An Event name from a memwatch event id: a DNS subdomain (lowercase,
/// digits, `-`, `.`; each `.`-separated label starting and ending with a
/// letter or digit), unique per event, the same on every attempt.
pub fn event_name(node: &str, id: &str) -> String {
    let clean = |s: &str| -> String {
        s.to_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    let name = format!("memwatch.{}.{}", clean(node), clean(id));
    // The API refuses an empty label or one starting or ending with `-`
    // (a node name `n1.`, an id `-7-`).
    let name = name
        .split('.')
        .map(|label| label.trim_matches('-'))
        .filter(|label| !label.is_empty())
        .collect::<Vec<_>>()
        .join(".");
    cut(name, 253).trim_end_matches(['-', '.']).to_string()
}

/// RFC 3339 to the second, as `metav1.Time`.
fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// RFC 3339 to the microsecond, as `metav1.MicroTime`.
fn micro(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

mod samples;
#[cfg(test)]
mod tests;

#[doc(hidden)]
pub use self::samples::{sample_node, samples};
