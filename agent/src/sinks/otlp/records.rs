//! A batch of events as an OTLP logs export request: each event one
//! LogRecord, under the resource of the host and, where the event names
//! one, of its pod and container.
//!
//! OTLP resources are per `ResourceLogs`, so consecutive events of the same
//! pod (or of none) share one; events are never reordered, so a receiver
//! that reads the request in order sees them in `seq` order.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::{
    collector::logs::v1::ExportLogsServiceRequest,
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    resource::v1::Resource,
};

use crate::model::event::{Event, EventKind};

/// `service.name` of every resource.
pub(crate) const SERVICE_NAME: &str = "memwatch";
/// The instrumentation scope's name (its version is the agent's).
pub(crate) const SCOPE_NAME: &str = "memwatch";

/// Event fields that go on the resource (as the semantic conventions name
/// them), not on the record.
const RESOURCE_FIELDS: [(&str, &str); 5] = [
    ("pod_namespace", "k8s.namespace.name"),
    ("pod_name", "k8s.pod.name"),
    ("pod_uid", "k8s.pod.uid"),
    ("container_name", "k8s.container.name"),
    ("container_id", "container.id"),
];

/// Event fields with a semantic-convention name; the rest are
/// `memwatch.<field>`.
const RENAMED_FIELDS: [(&str, &str); 3] = [
    ("pid", "process.pid"),
    ("tid", "thread.id"),
    // The kernel's `comm`: the Name of /proc/<pid>/status, which is what
    // the conventions' process.executable.name is on Linux.
    ("comm", "process.executable.name"),
];

/// What every resource of this agent says, besides the pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AgentResource {
    /// `k8s.node.name`, when the agent runs on Kubernetes.
    pub(crate) k8s_node_name: Option<String>,
    /// The config's `resource_attributes`, added last (one named like a
    /// built-in attribute replaces it).
    pub(crate) extra: BTreeMap<String, String>,
}

/// The severity of a kind: the kill ERROR, what warns of trouble WARN,
/// heartbeats DEBUG, the rest INFO.
pub(crate) fn severity(kind: EventKind) -> SeverityNumber {
    use EventKind as K;
    match kind {
        K::OomKill => SeverityNumber::Error,
        K::OomImminent
        | K::WorkerUnhealthy
        | K::TaskRejected
        | K::SoftCapExceeded
        | K::MemoryHighThrottled
        | K::GuardBlocked
        | K::ActionRefused
        | K::EventQuarantined => SeverityNumber::Warn,
        K::Heartbeat => SeverityNumber::Debug,
        K::AgentStarted
        | K::TaskStarted
        | K::TaskFinished
        | K::WorkerRecovered
        | K::ActionSkipped
        | K::OomAverted => SeverityNumber::Info,
    }
}

fn severity_text(severity: SeverityNumber) -> &'static str {
    match severity {
        SeverityNumber::Error => "ERROR",
        SeverityNumber::Warn => "WARN",
        SeverityNumber::Debug => "DEBUG",
        _ => "INFO",
    }
}

/// The export request of `batch`, in order.
pub(crate) fn request(batch: &[Event], agent: &AgentResource) -> ExportLogsServiceRequest {
    let mut resource_logs: Vec<ResourceLogs> = Vec::new();
    let mut current: Option<Vec<KeyValue>> = None;
    for event in batch {
        let resource = resource(event, agent);
        if current.as_ref() != Some(&resource) {
            resource_logs.push(ResourceLogs {
                resource: Some(Resource {
                    attributes: resource.clone(),
                    ..Default::default()
                }),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: SCOPE_NAME.into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            });
            current = Some(resource);
        }
        let records = &mut resource_logs.last_mut().expect("pushed above").scope_logs[0];
        records.log_records.push(record(event));
    }
    ExportLogsServiceRequest { resource_logs }
}

/// The resource attributes of `event`.
fn resource(event: &Event, agent: &AgentResource) -> Vec<KeyValue> {
    let mut attributes = BTreeMap::new();
    attributes.insert("service.name", SERVICE_NAME.to_string());
    attributes.insert("service.version", env!("CARGO_PKG_VERSION").to_string());
    attributes.insert("host.name", event.host.clone());
    if let Some(node) = &agent.k8s_node_name {
        attributes.insert("k8s.node.name", node.clone());
    }
    let body = &event.body;
    let pod = [
        &body.pod_namespace,
        &body.pod_name,
        &body.pod_uid,
        &body.container_name,
        &body.container_id,
    ];
    for ((_, name), value) in RESOURCE_FIELDS.iter().zip(pod) {
        if let Some(value) = value {
            attributes.insert(name, value.clone());
        }
    }
    for (name, value) in &agent.extra {
        attributes.insert(name, value.clone());
    }
    attributes
        .into_iter()
        .map(|(key, value)| key_value(key, Value::StringValue(value)))
        .collect()
}

/// One event as a LogRecord: body the kind, `event.name` memwatch.<kind>,
/// the event's fields as attributes, time stamps the event's.
pub(crate) fn record(event: &Event) -> LogRecord {
    let time = event
        .time
        .timestamp_nanos_opt()
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0);
    let severity = severity(event.body.kind);
    let event_name = format!("memwatch.{}", event.body.kind.as_str());
    let mut attributes = vec![
        key_value("event.name", Value::StringValue(event_name.clone())),
        key_value("log.record.uid", Value::StringValue(event.id.clone())),
        key_value("memwatch.seq", int(event.seq)),
    ];
    if let Some(epoch) = &event.epoch {
        attributes.push(key_value(
            "memwatch.epoch",
            Value::StringValue(epoch.clone()),
        ));
    }
    attributes.extend(field_attributes(event));
    LogRecord {
        time_unix_nano: time,
        // Stored when observed: the same on every attempt to send it.
        observed_time_unix_nano: time,
        severity_number: severity as i32,
        severity_text: severity_text(severity).into(),
        body: Some(AnyValue {
            value: Some(Value::StringValue(event.body.kind.as_str().into())),
        }),
        attributes,
        event_name,
        ..Default::default()
    }
}

/// The event's fields (as its JSON names them, the kind and the pod's
/// aside): renamed by the conventions or `memwatch.<field>`; `oom`'s
/// members as `memwatch.oom.<member>`; the heartbeat's `state` as its JSON.
fn field_attributes(event: &Event) -> Vec<KeyValue> {
    let serde_json::Value::Object(fields) =
        serde_json::to_value(&event.body).unwrap_or(serde_json::Value::Null)
    else {
        return Vec::new();
    };
    let mut attributes = Vec::new();
    for (field, value) in fields {
        if field == "kind" || RESOURCE_FIELDS.iter().any(|(f, _)| *f == field) {
            continue;
        }
        let name = RENAMED_FIELDS
            .iter()
            .find(|(f, _)| *f == field)
            .map_or_else(|| format!("memwatch.{field}"), |(_, n)| n.to_string());
        match value {
            serde_json::Value::Object(members) if field == "oom" => {
                for (member, value) in members {
                    attributes.push(key_value(&format!("{name}.{member}"), json_value(value)));
                }
            }
            value => attributes.push(key_value(&name, json_value(value))),
        }
    }
    attributes
}

/// A JSON value as an attribute value: objects and arrays as their JSON.
fn json_value(value: serde_json::Value) -> Value {
    use serde_json::Value as J;
    match value {
        J::Bool(b) => Value::BoolValue(b),
        J::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::IntValue(i),
            (None, Some(f)) => Value::DoubleValue(f),
            (None, None) => Value::StringValue(n.to_string()),
        },
        J::String(s) => Value::StringValue(s),
        other => Value::StringValue(other.to_string()),
    }
}

/// An integer attribute (past i64's range, which no seq reaches, saturated).
fn int(n: u64) -> Value {
    Value::IntValue(i64::try_from(n).unwrap_or(i64::MAX))
}

fn key_value(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{EventBody, OomDetails};

    fn event(seq: u64, body: EventBody) -> Event {
        Event {
            id: format!("id-{seq}"),
            seq,
            time: "2026-01-02T03:04:05.123456789Z".parse().unwrap(),
            host: "node-1".into(),
            epoch: Some("epoch-1".into()),
            body,
        }
    }

    fn attrs(list: &[KeyValue]) -> BTreeMap<String, Value> {
        list.iter()
            .map(|kv| {
                let value = kv.value.clone().and_then(|v| v.value).expect("a value");
                (kv.key.clone(), value)
            })
            .collect()
    }

    fn string(s: &str) -> Value {
        Value::StringValue(s.into())
    }

    fn oom_kill_in_a_pod() -> EventBody {
        let mut body = EventBody::new(EventKind::OomKill);
        body.pid = Some(4242);
        body.tid = Some(4243);
        body.comm = Some("python3".into());
        body.cgroup = Some("/sys/fs/cgroup/memory/kubepods/pod1/c1".into());
        body.worker = Some("w1".into());
        body.rss_bytes = Some(1 << 30);
        body.recovered = Some(false);
        body.predicted_lead_seconds = Some(12.5);
        body.pod_namespace = Some("ml".into());
        body.pod_name = Some("train-0".into());
        body.pod_uid = Some("uid-1".into());
        body.container_name = Some("trainer".into());
        body.container_id = Some("cid-1".into());
        body.oom = Some(OomDetails {
            anon_rss_bytes: 100,
            trigger_pid: 7,
            ..OomDetails::default()
        });
        body
    }

    #[test]
    fn an_oom_kill_is_an_error_record_with_the_conventions_names() {
        let record = record(&event(9, oom_kill_in_a_pod()));
        assert_eq!(record.severity_number, SeverityNumber::Error as i32);
        assert_eq!(record.severity_text, "ERROR");
        assert_eq!(record.body.unwrap().value, Some(string("oom_kill")));
        assert_eq!(record.event_name, "memwatch.oom_kill");
        // 2026-01-02T03:04:05.123456789Z
        assert_eq!(record.time_unix_nano, 1_767_323_045_123_456_789);
        assert_eq!(record.observed_time_unix_nano, record.time_unix_nano);
        let a = attrs(&record.attributes);
        assert_eq!(a["event.name"], string("memwatch.oom_kill"));
        assert_eq!(a["log.record.uid"], string("id-9"));
        assert_eq!(a["memwatch.seq"], Value::IntValue(9));
        assert_eq!(a["memwatch.epoch"], string("epoch-1"));
        assert_eq!(a["process.pid"], Value::IntValue(4242));
        assert_eq!(a["thread.id"], Value::IntValue(4243));
        assert_eq!(a["process.executable.name"], string("python3"));
        assert_eq!(a["memwatch.worker"], string("w1"));
        assert_eq!(
            a["memwatch.cgroup"],
            string("/sys/fs/cgroup/memory/kubepods/pod1/c1")
        );
        assert_eq!(a["memwatch.rss_bytes"], Value::IntValue(1 << 30));
        assert_eq!(a["memwatch.recovered"], Value::BoolValue(false));
        assert_eq!(
            a["memwatch.predicted_lead_seconds"],
            Value::DoubleValue(12.5)
        );
        assert_eq!(a["memwatch.oom.anon_rss_bytes"], Value::IntValue(100));
        assert_eq!(a["memwatch.oom.trigger_pid"], Value::IntValue(7));
        for absent in [
            "memwatch.kind",
            "memwatch.pid",
            "memwatch.pod_name",
            "k8s.pod.name",
        ] {
            assert!(!a.contains_key(absent), "{absent} on the record: {a:?}");
        }
    }

    #[test]
    fn severities_follow_the_kind() {
        assert_eq!(severity(EventKind::OomImminent), SeverityNumber::Warn);
        assert_eq!(severity(EventKind::WorkerUnhealthy), SeverityNumber::Warn);
        assert_eq!(severity(EventKind::Heartbeat), SeverityNumber::Debug);
        assert_eq!(severity(EventKind::TaskStarted), SeverityNumber::Info);
        for kind in EventKind::ALL {
            let r = record(&event(1, EventBody::new(kind)));
            assert_eq!(r.event_name, format!("memwatch.{}", kind.as_str()));
            assert!(!r.severity_text.is_empty());
        }
    }

    #[test]
    fn a_heartbeats_state_is_one_json_attribute() {
        let mut body = EventBody::new(EventKind::Heartbeat);
        body.state = Some(serde_json::json!({"tasks": [], "health": "healthy"}));
        let a = attrs(&record(&event(1, body)).attributes);
        let Value::StringValue(state) = &a["memwatch.state"] else {
            panic!("state as a string: {a:?}");
        };
        let back: serde_json::Value = serde_json::from_str(state).unwrap();
        assert_eq!(back["health"], "healthy");
    }

    #[test]
    fn consecutive_events_of_a_pod_share_its_resource_and_order_is_kept() {
        let agent = AgentResource {
            k8s_node_name: Some("node-1".into()),
            extra: [(
                "deployment.environment.name".to_string(),
                "prod".to_string(),
            )]
            .into(),
        };
        let batch = [
            event(1, EventBody::new(EventKind::AgentStarted)),
            event(2, oom_kill_in_a_pod()),
            event(3, oom_kill_in_a_pod()),
            event(4, EventBody::new(EventKind::Heartbeat)),
        ];
        let exported = request(&batch, &agent);
        assert_eq!(exported.resource_logs.len(), 3, "host, pod, host");
        let seqs: Vec<Value> = exported
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .flat_map(|s| &s.log_records)
            .map(|r| attrs(&r.attributes)["memwatch.seq"].clone())
            .collect();
        assert_eq!(seqs, (1..=4).map(Value::IntValue).collect::<Vec<_>>());
        let host = attrs(
            &exported.resource_logs[0]
                .resource
                .as_ref()
                .unwrap()
                .attributes,
        );
        assert_eq!(host["service.name"], string("memwatch"));
        assert_eq!(host["service.version"], string(env!("CARGO_PKG_VERSION")));
        assert_eq!(host["host.name"], string("node-1"));
        assert_eq!(host["k8s.node.name"], string("node-1"));
        assert_eq!(host["deployment.environment.name"], string("prod"));
        assert!(!host.contains_key("k8s.pod.name"));
        let pod = &exported.resource_logs[1];
        assert_eq!(pod.scope_logs[0].log_records.len(), 2);
        let scope = pod.scope_logs[0].scope.as_ref().unwrap();
        assert_eq!(scope.name, "memwatch");
        let pod = attrs(&pod.resource.as_ref().unwrap().attributes);
        assert_eq!(pod["k8s.namespace.name"], string("ml"));
        assert_eq!(pod["k8s.pod.name"], string("train-0"));
        assert_eq!(pod["k8s.pod.uid"], string("uid-1"));
        assert_eq!(pod["k8s.container.name"], string("trainer"));
        assert_eq!(pod["container.id"], string("cid-1"));
        assert_eq!(pod["host.name"], string("node-1"));
        let without = request(&batch[..1], &AgentResource::default());
        let host = attrs(
            &without.resource_logs[0]
                .resource
                .as_ref()
                .unwrap()
                .attributes,
        );
        assert!(!host.contains_key("k8s.node.name"), "off Kubernetes: none");
    }
}
