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

/// Every kind of object and patch the sink sends, filled as it fills them,
/// for the offline proofs: (file stem, what it is, the JSON). What it is:
/// `object` (validated as is), `status-patch` or `patch` (merged into a
/// Node with `kubectl patch --local --type=strategic`, the result
/// validated), `event-patch` (merged into the first `object` Event).
#[doc(hidden)]
pub fn samples() -> Vec<(&'static str, &'static str, Value)> {
    let now = DateTime::parse_from_rfc3339("2026-12-02T06:00:00.123456Z")
        .unwrap()
        .with_timezone(&Utc);
    let node: Node = serde_json::from_value(sample_node()).unwrap();
    let sick = [Unhealthy {
        worker: "w1".into(),
        reason: "memory 3.0 GiB over the soft cap 2.0 GiB".into(),
    }];
    let refresh = chrono::Duration::minutes(5);
    let pod = Regarding::Pod {
        namespace: "default".into(),
        name: "hog-7d9f".into(),
        uid: "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b".into(),
    };
    let spec = |regarding: Regarding, type_, reason, action, note: &str| EventSpec {
        regarding,
        type_,
        reason,
        action,
        note: note.into(),
    };
    let node_ref = Regarding::Node { name: "n1".into() };
    let name = event_name("n1", "0193a0b4-7c1e-7a2b-9c3d-4e5f60718293");
    vec![
        ("node", "node", sample_node()),
        (
            "condition-unhealthy",
            "status-patch",
            condition_patch(&node, &sick, now, refresh).unwrap(),
        ),
        (
            "condition-healthy",
            "status-patch",
            condition_patch(&node, &[], now, refresh).unwrap(),
        ),
        ("taint-on", "patch", taint_patch(&node, true)),
        ("taint-off", "patch", taint_patch(&node, false)),
        (
            "event-oom-pod",
            "object",
            event_object(
                &spec(
                    pod.clone(),
                    "Warning",
                    "OOMKilling",
                    "Observe",
                    "Memory cgroup out of memory: killed process 4242 (python3), total-vm 2.0 GiB",
                ),
                &name,
                "n1",
                now,
            ),
        ),
        (
            "event-soft-cap-pod",
            "object",
            event_object(
                &spec(
                    pod,
                    "Warning",
                    "SoftCapExceeded",
                    "Observe",
                    "task over its soft cap",
                ),
                &event_name("n1", "2"),
                "n1",
                now,
            ),
        ),
        (
            "event-unhealthy-node",
            "object",
            event_object(
                &spec(
                    node_ref.clone(),
                    "Warning",
                    "WorkerUnhealthy",
                    "MarkUnhealthy",
                    "worker w1 unhealthy",
                ),
                &event_name("n1", "3"),
                "n1",
                now,
            ),
        ),
        (
            "event-recovered-node",
            "object",
            event_object(
                &spec(
                    node_ref,
                    "Normal",
                    "WorkerRecovered",
                    "MarkHealthy",
                    "worker w1 recovered",
                ),
                &event_name("n1", "4"),
                "n1",
                now,
            ),
        ),
        (
            "event-series",
            "event-patch",
            series_patch(2, now, "second kill"),
        ),
    ]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .with_timezone(&Utc)
    }

    /// A node from its JSON (as the API server returns it).
    fn node(value: Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    /// The sample node with memwatch's condition as given.
    fn node_with_condition(status: &str, reason: &str, message: &str, beat: &str) -> Node {
        let mut value = sample_node();
        value["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({
                "type": CONDITION_TYPE, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": beat, "lastTransitionTime": "2026-12-01T12:00:00Z",
            }));
        node(value)
    }

    fn sick(worker: &str) -> Vec<Unhealthy> {
        vec![Unhealthy {
            worker: worker.into(),
            reason: "memory over the soft cap".into(),
        }]
    }

    /// The one condition a patch sets.
    fn patched(patch: &Value) -> &Value {
        let conditions = patch["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1, "{patch}");
        &conditions[0]
    }

    /// Kubernetes' DNS-1123 subdomain (IsDNS1123Subdomain, what the API
    /// server asks of an Event's name): at most 253 characters, labels
    /// split by `.`, each of lowercase letters, digits and `-`, starting and
    /// ending with a letter or digit.
    fn dns_subdomain(name: &str) -> bool {
        name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn a_long_note_is_cut_to_the_apis_limit_on_a_character_boundary() {
        let time = at("2026-12-02T06:00:00Z");
        let regarding = Regarding::Node { name: "n1".into() };
        for (note, expected) in [
            ("x".repeat(5000), MAX_NOTE),
            // 3 bytes a character: 1024 falls inside the 342nd.
            ("€".repeat(1000), 1023),
            ("short".to_string(), 5),
            ("x".repeat(MAX_NOTE), MAX_NOTE),
        ] {
            let spec = EventSpec {
                regarding: regarding.clone(),
                type_: "Warning",
                reason: "OOMKilling",
                action: "Observe",
                note: note.clone(),
            };
            let event = event_object(&spec, "memwatch.n1.1", "n1", time);
            let cut = event["note"].as_str().unwrap();
            assert_eq!(cut.len(), expected, "note of {} bytes", note.len());
            assert!(note.starts_with(cut));
            let series = series_patch(2, time, &note);
            assert_eq!(series["note"], event["note"]);
        }
    }

    #[test]
    fn event_names_are_dns_subdomains_for_odd_node_names_and_ids() {
        let long = "a".repeat(300);
        for (node, id) in [
            ("n1", "0193a0b4-7c1e-7a2b-9c3d-4e5f60718293"),
            ("Worker_01.Example.COM", "42"),
            ("-n1-", "-7-"),
            ("n1.", ".id."),
            ("_", "_"),
            ("", ""),
            ("ñode", "ïd"),
            ("n 1/2", "a:b@c"),
            ("n1", long.as_str()),
            (long.as_str(), "1"),
            ("n1", &format!("{}-x", "b".repeat(240))),
        ] {
            let name = event_name(node, id);
            assert!(dns_subdomain(&name), "{node:?} {id:?} -> {name:?}");
            assert_eq!(name, event_name(node, id), "the same on every attempt");
        }
        assert_eq!(
            event_name("n1", "0193a0b4-7c1e-7a2b-9c3d-4e5f60718293"),
            "memwatch.n1.0193a0b4-7c1e-7a2b-9c3d-4e5f60718293"
        );
        assert_ne!(event_name("n1", "1"), event_name("n1", "2"));
        assert_ne!(event_name("n1", "1"), event_name("n2", "1"));
    }

    #[test]
    fn the_condition_is_patched_only_when_it_changes_or_its_heartbeat_ages() {
        let refresh = chrono::Duration::minutes(5);
        let (status, reason, message) = condition_state(&sick("w1"));
        let current = node_with_condition(status, reason, &message, "2026-12-02T06:00:00Z");
        // Says the same, heartbeat 4 min old: nothing to send.
        assert_eq!(
            condition_patch(&current, &sick("w1"), at("2026-12-02T06:04:00Z"), refresh),
            None
        );
        // 5 min old: the heartbeat is refreshed, the transition kept.
        let patch =
            condition_patch(&current, &sick("w1"), at("2026-12-02T06:05:00Z"), refresh).unwrap();
        let condition = patched(&patch);
        assert_eq!(condition["type"], CONDITION_TYPE);
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["lastHeartbeatTime"], "2026-12-02T06:05:00Z");
        assert_eq!(condition["lastTransitionTime"], "2026-12-01T12:00:00Z");
        // Another worker, still unhealthy: sent at once, transition kept.
        let patch =
            condition_patch(&current, &sick("w2"), at("2026-12-02T06:01:00Z"), refresh).unwrap();
        let condition = patched(&patch);
        assert!(condition["message"].as_str().unwrap().contains("w2"));
        assert_eq!(condition["lastTransitionTime"], "2026-12-01T12:00:00Z");
        // Healthy now: the status changes, the transition moves.
        let patch = condition_patch(&current, &[], at("2026-12-02T06:01:00Z"), refresh).unwrap();
        let condition = patched(&patch);
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], "WorkersHealthy");
        assert_eq!(condition["lastHeartbeatTime"], "2026-12-02T06:01:00Z");
        assert_eq!(condition["lastTransitionTime"], "2026-12-02T06:01:00Z");
        // No condition yet: sent, transition now.
        let bare = node(sample_node());
        let patch = condition_patch(&bare, &[], at("2026-12-02T06:01:00Z"), refresh).unwrap();
        assert_eq!(
            patched(&patch)["lastTransitionTime"],
            "2026-12-02T06:01:00Z"
        );
    }

    /// A node named `name`, cordoned or not, with taints (key, effect).
    fn listed(name: &str, cordoned: bool, taints: &[(&str, &str)]) -> Node {
        let taints: Vec<Value> = taints
            .iter()
            .map(|(key, effect)| json!({"key": key, "effect": effect}))
            .collect();
        node(json!({
            "metadata": {"name": name},
            "spec": {"unschedulable": cordoned, "taints": taints},
        }))
    }

    #[test]
    fn capacity_counts_cordoned_and_no_schedule_or_no_execute_nodes_as_leaving() {
        let nodes = [
            listed("ready", false, &[]),
            node(json!({"metadata": {"name": "no-spec"}})),
            listed("prefer", false, &[("example.com/gpu", "PreferNoSchedule")]),
            listed("cordoned", true, &[]),
            listed("gpu", false, &[("example.com/gpu", "NoSchedule")]),
            listed("evicting", false, &[("example.com/drain", "NoExecute")]),
            listed("memwatch", false, &[(TAINT_KEY, TAINT_EFFECT)]),
        ];
        assert_eq!(
            capacity(&nodes),
            Capacity {
                listed: 7,
                leaving: 4,
                running: 3,
            }
        );
        assert_eq!(
            capacity(&[]),
            Capacity {
                listed: 0,
                leaving: 0,
                running: 0,
            }
        );
    }

    #[test]
    fn the_keeper_is_the_lowest_named_node_with_memwatchs_taint() {
        let nodes = [
            listed("n3", false, &[(TAINT_KEY, TAINT_EFFECT)]),
            listed("n0", false, &[("example.com/gpu", "NoSchedule")]),
            listed("n1", true, &[]),
            listed(
                "n2",
                false,
                &[("example.com/gpu", "NoSchedule"), (TAINT_KEY, TAINT_EFFECT)],
            ),
            listed("n4", false, &[(TAINT_KEY, TAINT_EFFECT)]),
        ];
        assert_eq!(keeper(&nodes), Some("n2"));
        assert_eq!(keeper(&nodes[..2]), Some("n3"));
        assert_eq!(keeper(&nodes[1..3]), None);
        assert_eq!(keeper(&[]), None);
    }
}
