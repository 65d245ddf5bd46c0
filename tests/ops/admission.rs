//! The admission policy (deploy/kubernetes/admission-policy.yaml and the
//! chart's copy) by allow-list, its CEL evaluated by cel-python
//! (deploy/check/admission_policy.py): a change of any field of the 1.37
//! Node's schema but memwatch's taint and condition is denied, and of a
//! field the schema does not have yet; memwatch's own Events (the sink's
//! samples) pass, Events under another reportingController or
//! reportingInstance, or from another node's token, are denied.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use memwatch::kubernetes_objects::{CONTROLLER, sample_node, samples};
use memwatch_tests::ops::{self, render_chart_with, repo};
use serde_json::{Value, json};

const ACCOUNT: &str = "system:serviceaccount:memwatch:memwatch";

/// A pod's token on 1.32+: the node's name among the pod's claims.
fn token(node: &str) -> Value {
    json!({
        "authentication.kubernetes.io/node-name": [node],
        "authentication.kubernetes.io/pod-name": ["memwatch-x7k2p"],
    })
}

/// An admission request by memwatch with `node`'s token.
fn request(
    name: &str,
    node: &str,
    resource: (&str, &str, &str),
    op: &str,
    old: &Value,
    new: &Value,
) -> Value {
    let (group, res, sub) = resource;
    let mut request = json!({
        "operation": op,
        "resource": {"group": group, "version": "v1", "resource": res},
        "userInfo": {"username": ACCOUNT, "extra": token(node)},
    });
    if !sub.is_empty() {
        request["subResource"] = sub.into();
    }
    json!({"name": name, "request": request, "object": new, "oldObject": old})
}

/// (name, allowed, message) of each case, for one policy file.
fn admit(policy: &Path, cases: &[Value]) -> Vec<(String, bool, String)> {
    ops::admission_policy(policy, cases)
        .iter()
        .map(|r| {
            assert_eq!(r["matched"], true, "{r}");
            (
                r["name"].as_str().unwrap().to_string(),
                r["allowed"].as_bool().unwrap(),
                r["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The properties of a Kubernetes 1.37 kind (`nodespec`) in
/// kubernetes-validate's schemas.
fn schema_properties(kind: &str) -> BTreeSet<String> {
    ops::python_tools();
    let out = Command::new("python3")
        .args([
            "-c",
            "import kubernetes_validate, os; print(os.path.dirname(kubernetes_validate.__file__))",
        ])
        .output()
        .expect("python3");
    let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        .join("kubernetes-json-schema/v1.37.0-local-strict");
    let path = dir.join(format!("{kind}-v1.json"));
    let schema: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{}", path.display()))
        .keys()
        .cloned()
        .collect()
}

/// Both policy files: the raw manifests' and the chart's rendering.
fn policies(out: &Path) -> [PathBuf; 2] {
    render_chart_with(out, None, &[]);
    [
        repo().join("deploy/kubernetes/admission-policy.yaml"),
        out.join("manifests.yaml"),
    ]
}

fn check(cases: &[(Value, bool, &str)]) {
    let all: Vec<Value> = cases.iter().map(|(c, _, _)| c.clone()).collect();
    let out = tempfile::tempdir().unwrap();
    for policy in policies(out.path()) {
        let results = admit(&policy, &all);
        assert_eq!(results.len(), cases.len());
        for ((case, allowed, why), (name, was_allowed, message)) in cases.iter().zip(&results) {
            assert_eq!(&case["name"], name.as_str());
            assert_eq!(
                was_allowed,
                allowed,
                "{name} ({}): {message}",
                policy.display()
            );
            assert!(message.contains(why), "{name}: {why:?} in {message:?}");
        }
    }
}

#[test]
fn every_node_field_but_memwatchs_own_is_denied() {
    let node = sample_node();
    let mut cases = Vec::new();
    let status_sub = |part: &str| if part == "status" { "status" } else { "" };
    for (part, kind, own) in [
        ("spec", "nodespec", vec!["taints"]),
        ("status", "nodestatus", vec!["conditions"]),
        (
            "metadata",
            "objectmeta-meta",
            vec!["resourceVersion", "managedFields", "generation", "name"],
        ),
    ] {
        let fields = schema_properties(kind);
        assert!(fields.len() > 5, "{kind}: {fields:?}");
        // Every field of the schema, and one it does not have (yet).
        for field in fields.iter().map(String::as_str).chain(["fieldOfTomorrow"]) {
            if own.contains(&field) {
                continue;
            }
            let mut new = node.clone();
            new[part][field] = json!({"changed-by": "memwatch"});
            let name = format!("{part}.{field}");
            let case = request(
                &name,
                "n1",
                ("", "nodes", status_sub(part)),
                "UPDATE",
                &node,
                &new,
            );
            cases.push((case, false, "memwatch may"));
        }
    }
    // A field at the top of the object.
    let mut new = node.clone();
    new["fieldOfTomorrow"] = json!(1);
    cases.push((
        request(
            "top-level field",
            "n1",
            ("", "nodes", ""),
            "UPDATE",
            &node,
            &new,
        ),
        false,
        "only its own taint and condition",
    ));
    // Its name as the server changes it: allowed.
    let mut new = node.clone();
    new["metadata"]["resourceVersion"] = "4712".into();
    new["metadata"]["managedFields"] = json!([{"manager": "memwatch", "operation": "Update"}]);
    cases.push((
        request(
            "resourceVersion, managedFields",
            "n1",
            ("", "nodes", ""),
            "UPDATE",
            &node,
            &new,
        ),
        true,
        "",
    ));
    check(&cases);
}

#[test]
fn only_memwatchs_own_events_from_its_own_node_pass() {
    let events: Vec<(&str, Value)> = samples()
        .into_iter()
        .filter(|(_, kind, _)| *kind == "object")
        .filter(|(stem, _, _)| stem.starts_with("event-"))
        .map(|(stem, _, v)| (stem, v))
        .collect();
    assert!(events.len() >= 5, "{events:?}");
    let create = |name: &str, node: &str, event: &Value| {
        request(
            name,
            node,
            ("events.k8s.io", "events", ""),
            "CREATE",
            &Value::Null,
            event,
        )
    };
    let mut cases = Vec::new();
    for (stem, event) in &events {
        assert_eq!(event["reportingController"], CONTROLLER);
        cases.push((create(stem, "n1", event), true, ""));
        cases.push((
            create(&format!("{stem} from n2"), "n2", event),
            false,
            "reportingInstance",
        ));
    }
    let event = &events[0].1;
    // A series patch of its own Event (UPDATE: the Event after the patch).
    let mut patched = event.clone();
    patched["series"] = json!({"count": 2, "lastObservedTime": "2026-01-01T00:00:00.000000Z"});
    cases.push((
        request(
            "series",
            "n1",
            ("events.k8s.io", "events", ""),
            "UPDATE",
            event,
            &patched,
        ),
        true,
        "",
    ));
    let forged = |f: &dyn Fn(&mut Value)| {
        let mut e = event.clone();
        f(&mut e);
        e
    };
    for (name, e) in [
        (
            "another instance",
            forged(&|e| e["reportingInstance"] = "memwatch-n2".into()),
        ),
        (
            "the kubelet's instance",
            forged(&|e| e["reportingInstance"] = "n1".into()),
        ),
        (
            "no instance",
            forged(&|e| {
                e.as_object_mut().unwrap().remove("reportingInstance");
            }),
        ),
        (
            "another controller",
            forged(&|e| e["reportingController"] = "kubelet".into()),
        ),
        (
            "no controller",
            forged(&|e| {
                e.as_object_mut().unwrap().remove("reportingController");
            }),
        ),
    ] {
        cases.push((create(name, "n1", &e), false, "reportingInstance"));
    }
    // Another controller's Event patched: denied too.
    let theirs = forged(&|e| e["reportingController"] = "kubelet".into());
    let mut theirs_patched = theirs.clone();
    theirs_patched["series"] =
        json!({"count": 2, "lastObservedTime": "2026-01-01T00:00:00.000000Z"});
    cases.push((
        request(
            "patch of another's",
            "n1",
            ("events.k8s.io", "events", ""),
            "UPDATE",
            &theirs,
            &theirs_patched,
        ),
        false,
        "reportingController",
    ));
    // A node name too long for reportingInstance (128): the cut one passes.
    let long = "n".repeat(200);
    let cut = forged(&|e| e["reportingInstance"] = format!("memwatch-{long}")[..128].into());
    cases.push((create("long node name, cut", &long, &cut), true, ""));
    let shorter = forged(&|e| e["reportingInstance"] = format!("memwatch-{long}")[..100].into());
    cases.push((
        create("long node name, cut short", &long, &shorter),
        false,
        "reportingInstance",
    ));
    check(&cases);
}
