//! The builders' own rules: names, cuts, when the condition is patched,
//! the guard's view of the nodes.

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
