//! What the Kubernetes sink sends (`memwatch::kubernetes_objects::samples`,
//! filled as the sink fills them), offline: Events and the sample Node
//! against the Kubernetes 1.37 schemas (kubernetes-validate --strict), and
//! the node patches merged by kubectl's own strategic merge
//! (`kubectl patch --local`, which knows the Node's merge keys: conditions
//! merge by `type`, taints have none), the results validated again. The
//! schemas check fields and their types, not enum values, lengths or name
//! formats: what the API server checks of those is checked here by hand
//! ([`api_server_refusals`]). Needs no root and no cluster; kubectl must be
//! installed (in CI its absence fails the tests), kubernetes-validate comes
//! from PyPI when missing.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use memwatch::kubernetes_objects::{self as objects, CONDITION_TYPE, TAINT_EFFECT, TAINT_KEY};
use memwatch_test_support::env::in_ci;
use memwatch_tests::{
    ops::kubernetes_validate,
    process::{combined_output, run_bounded},
};
use serde_json::{Value, json};

/// The samples that are `what`: (file stem, JSON).
fn samples(what: &str) -> Vec<(&'static str, Value)> {
    objects::samples()
        .into_iter()
        .filter(|(_, w, _)| *w == what)
        .map(|(stem, _, value)| (stem, value))
        .collect()
}

/// The sample that is `what` and satisfies `pick`, the only one.
fn one_sample(what: &str, pick: impl Fn(&Value) -> bool) -> Value {
    let found: Vec<Value> = samples(what)
        .into_iter()
        .map(|(_, v)| v)
        .filter(|v| pick(v))
        .collect();
    assert_eq!(found.len(), 1, "one such {what}: {found:?}");
    found.into_iter().next().unwrap()
}

/// Writes `value` to `dir/name.json`.
fn write(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    fs::write(&path, serde_json::to_string_pretty(value).unwrap()).unwrap();
    path
}

/// kubernetes-validate --strict passed every file, each named in a
/// `passed` line (none skipped for want of a schema).
fn assert_valid(files: &[PathBuf]) {
    let (ok, out) = kubernetes_validate(files);
    assert!(ok, "kubernetes-validate failed:\n{out}");
    for file in files {
        assert!(
            out.lines()
                .any(|l| l.contains(&format!("{} passed for resource", file.display()))),
            "{} not validated:\n{out}",
            file.display()
        );
    }
}

/// kubectl, or `None` (the test skips, saying so) when it is missing
/// outside CI. In CI a missing kubectl fails the test.
fn kubectl(test: &str) -> Option<PathBuf> {
    match which::which("kubectl") {
        Ok(path) => Some(path),
        Err(e) if in_ci() => panic!(
            "{test}: kubectl is missing ({e}); CI must run this test: install kubectl \
             (a client only: `kubectl patch --local`; 1.32 here)"
        ),
        Err(_) => {
            eprintln!("skipped {test}: needs kubectl (`kubectl patch --local`)");
            None
        }
    }
}

/// `kubectl patch --local --type=<kind>` of `target` by `patch` (files in
/// `dir`, named after `name`): the patched object.
fn kubectl_patch(
    kubectl: &Path,
    dir: &Path,
    name: &str,
    kind: &str,
    target: &Value,
    patch: &Value,
) -> Value {
    let file = write(dir, &format!("{name}.target"), target);
    let mut cmd = Command::new(kubectl);
    cmd.args(["patch", "--local", "-o", "json"])
        .arg(format!("--type={kind}"))
        .arg("-f")
        .arg(&file)
        .arg("-p")
        .arg(patch.to_string())
        // No cluster, and no kubeconfig of whoever runs the tests.
        .env("KUBECONFIG", dir.join("no-kubeconfig"));
    let out = run_bounded("kubectl patch --local", &mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "kubectl patch --local --type={kind} of {name} failed:\n{}",
        combined_output(&out)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("kubectl printed no JSON ({e}):\n{}", combined_output(&out)))
}

/// A Node's conditions of `type_`.
fn conditions<'a>(node: &'a Value, type_: &str) -> Vec<&'a Value> {
    node["status"]["conditions"]
        .as_array()
        .expect("status.conditions")
        .iter()
        .filter(|c| c["type"] == type_)
        .collect()
}

/// The one condition a status patch sets.
fn patched_condition(patch: &Value) -> &Value {
    let list = patch["status"]["conditions"]
        .as_array()
        .expect("conditions");
    assert_eq!(list.len(), 1, "{patch}");
    assert_eq!(list[0]["type"], CONDITION_TYPE);
    &list[0]
}

/// The node's taints as (key, effect).
fn taints(node: &Value) -> Vec<(String, String)> {
    node["spec"]["taints"]
        .as_array()
        .expect("spec.taints")
        .iter()
        .map(|t| {
            (
                t["key"].as_str().unwrap().to_string(),
                t["effect"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// What the API server refuses of an events.k8s.io/v1 Event that its
/// OpenAPI schema lets through (ValidateEventCreate): a `type` other than
/// Normal or Warning, a name that is no DNS-1123 subdomain, a note over
/// 1 kB, `reportingController` not a qualified name, `reportingInstance`,
/// `action` or `reason` over 128 characters, an Event of a pod outside the
/// pod's namespace, of a node outside `default`.
fn api_server_refusals(event: &Value) -> Vec<String> {
    let text = |field: &str| event[field].as_str().unwrap_or_default();
    let mut refused = Vec::new();
    if !["Normal", "Warning"].contains(&text("type")) {
        refused.push(format!("type {:?}", text("type")));
    }
    let name = event["metadata"]["name"].as_str().unwrap_or_default();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() > 253 || !name.split('.').all(label_ok) {
        refused.push(format!("name {name:?}"));
    }
    if text("note").len() > 1024 {
        refused.push(format!("note of {} bytes", text("note").len()));
    }
    // A qualified name: an optional DNS-subdomain prefix and `/`, then at
    // most 63 of [-A-Za-z0-9_.], starting and ending alphanumeric.
    let controller = text("reportingController");
    let (prefix, base) = controller.split_once('/').unwrap_or(("", controller));
    let base_ok = (1..=63).contains(&base.len())
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && base.starts_with(|c: char| c.is_ascii_alphanumeric())
        && base.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok =
        !controller.contains('/') || (prefix.len() <= 253 && prefix.split('.').all(label_ok));
    if !base_ok || !prefix_ok {
        refused.push(format!("reportingController {controller:?}"));
    }
    for field in ["reportingInstance", "action", "reason"] {
        if text(field).is_empty() || text(field).len() > 128 {
            refused.push(format!("{field} {:?}", text(field)));
        }
    }
    let namespace = event["metadata"]["namespace"].as_str().unwrap_or_default();
    match event["regarding"]["namespace"].as_str() {
        Some(theirs) if theirs != namespace => refused.push(format!(
            "namespace {namespace:?} for an object in {theirs:?}"
        )),
        None if !["", "default"].contains(&namespace) => refused.push(format!(
            "namespace {namespace:?} for a cluster-scoped object"
        )),
        _ => {}
    }
    refused
}

#[test]
fn every_object_the_sink_sends_passes_the_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let events = samples("object");
    assert!(events.len() >= 4, "the sink's Events: {events:?}");
    let mut files = vec![write(dir.path(), "node", &objects::sample_node())];
    for (stem, event) in &events {
        assert_eq!(event["apiVersion"], "events.k8s.io/v1", "{stem}");
        assert_eq!(event["kind"], "Event", "{stem}");
        let refused = api_server_refusals(event);
        assert!(
            refused.is_empty(),
            "the API server would refuse {stem}: {refused:?}\n{event}"
        );
        files.push(write(dir.path(), stem, event));
    }
    assert_valid(&files);
}

#[test]
fn strategic_merge_patches_keep_other_conditions_and_taints() {
    let test = "strategic_merge_patches_keep_other_conditions_and_taints";
    let Some(kubectl) = kubectl(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = objects::sample_node();
    let ready = conditions(&node, "Ready");
    assert_eq!(ready.len(), 1, "the sample node is Ready: {node}");
    let patch = |name: &str, target: &Value, patch: &Value| {
        kubectl_patch(&kubectl, dir.path(), name, "strategic", target, patch)
    };
    let mut results = Vec::new();

    // The condition: merged by type, Ready kept as it was.
    let unhealthy = one_sample("status-patch", |p| patched_condition(p)["status"] == "True");
    let healthy = one_sample("status-patch", |p| {
        patched_condition(p)["status"] == "False"
    });
    assert_eq!(samples("status-patch").len(), 2);
    for (name, status_patch) in [
        ("condition-unhealthy", &unhealthy),
        ("condition-healthy", &healthy),
    ] {
        let result = patch(name, &node, status_patch);
        assert_eq!(conditions(&result, "Ready"), ready, "{name}: {result}");
        assert_eq!(
            conditions(&result, CONDITION_TYPE),
            [patched_condition(status_patch)],
            "{name}: {result}"
        );
        assert_eq!(result["status"]["conditions"].as_array().unwrap().len(), 2);
        assert_eq!(result["spec"], node["spec"], "{name} touched the spec");
        results.push((name.to_string(), result));
    }
    // One after the other, either way: still one memwatch condition, the
    // last one's (merged by type, not appended).
    for (name, first, then, status) in [
        ("unhealthy-then-healthy", &unhealthy, &healthy, "False"),
        ("healthy-then-unhealthy", &healthy, &unhealthy, "True"),
    ] {
        let between = patch(&format!("{name}.1"), &node, first);
        let result = patch(name, &between, then);
        let ours = conditions(&result, CONDITION_TYPE);
        assert_eq!(ours, [patched_condition(then)], "{name}: {result}");
        assert_eq!(ours[0]["status"], status, "{name}: {result}");
        assert_eq!(conditions(&result, "Ready"), ready, "{name}: {result}");
        assert_eq!(result["status"]["conditions"].as_array().unwrap().len(), 2);
        results.push((name.to_string(), result));
    }

    // The taint: the other controller's kept, resourceVersion the node's.
    let has_ours = |p: &Value| taints(p).iter().any(|(k, _)| k == TAINT_KEY);
    let on = one_sample("patch", has_ours);
    let off = one_sample("patch", |p| !has_ours(p));
    assert_eq!(samples("patch").len(), 2);
    let other = ("example.com/gpu".to_string(), "NoSchedule".to_string());
    let ours = (TAINT_KEY.to_string(), TAINT_EFFECT.to_string());
    assert_eq!(TAINT_EFFECT, "NoSchedule");
    for taint_patch in [&on, &off] {
        assert_eq!(
            taint_patch["metadata"]["resourceVersion"], "4711",
            "the patch carries the node's resourceVersion: {taint_patch}"
        );
        assert_eq!(
            taint_patch["metadata"]["resourceVersion"],
            node["metadata"]["resourceVersion"]
        );
    }
    let tainted = patch("taint-on", &node, &on);
    assert_eq!(taints(&tainted), [other.clone(), ours], "{tainted}");
    assert_eq!(tainted["status"], node["status"], "taint-on touched status");
    assert_eq!(tainted["metadata"]["resourceVersion"], "4711");
    let untainted = patch("taint-off", &node, &off);
    assert_eq!(
        taints(&untainted),
        std::slice::from_ref(&other),
        "{untainted}"
    );
    let cleared = patch("taint-on-then-off", &tainted, &off);
    assert_eq!(taints(&cleared), [other], "{cleared}");
    assert_eq!(cleared["status"], node["status"]);
    for (name, result) in [
        ("taint-on", tainted),
        ("taint-off", untainted),
        ("taint-on-then-off", cleared),
    ] {
        results.push((name.to_string(), result));
    }

    let files: Vec<PathBuf> = results
        .iter()
        .map(|(name, result)| write(dir.path(), &format!("{name}.result"), result))
        .collect();
    assert_valid(&files);
}

#[test]
fn the_event_series_patch_merges_into_its_event() {
    let test = "the_event_series_patch_merges_into_its_event";
    let Some(kubectl) = kubectl(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (stem, event) = samples("object").into_iter().next().expect("an Event");
    let series = one_sample("event-patch", |_| true);
    let result = kubectl_patch(&kubectl, dir.path(), stem, "merge", &event, &series);
    assert_eq!(result["series"]["count"], 2, "{result}");
    assert_eq!(
        result["series"]["lastObservedTime"],
        series["series"]["lastObservedTime"]
    );
    assert_eq!(result["note"], series["note"]);
    assert_ne!(result["note"], event["note"], "the note changed");
    // Nothing else moved.
    let without = |v: &Value| {
        let mut v = v.clone();
        let map = v.as_object_mut().unwrap();
        map.remove("series");
        map.remove("note");
        v
    };
    assert_eq!(without(&result), without(&event));
    assert!(api_server_refusals(&result).is_empty());
    assert_valid(&[write(dir.path(), &format!("{stem}.result"), &result)]);
}

#[test]
fn the_validator_rejects_a_broken_event() {
    let dir = tempfile::tempdir().unwrap();
    let (_, event) = samples("object").into_iter().next().expect("an Event");
    let broken = |name: &str, change: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut value = event.clone();
        change(value.as_object_mut().unwrap());
        (name.to_string(), value)
    };
    // What the schemas catch: an unknown field (--strict), a missing
    // required one, a field of the wrong type.
    for (name, value) in [
        broken("misspelled", &|e| {
            let regarding = e.remove("regarding").unwrap();
            e.insert("regardin".into(), regarding);
        }),
        broken("no-event-time", &|e| {
            e.remove("eventTime");
        }),
        broken("count-as-text", &|e| {
            e.insert("series".into(), json!({"count": "two"}));
        }),
    ] {
        let file = write(dir.path(), &name, &value);
        let (ok, out) = kubernetes_validate(std::slice::from_ref(&file));
        assert!(!ok, "kubernetes-validate --strict passed {name}:\n{out}");
        assert!(
            out.contains(&format!("{} did not validate", file.display())),
            "{name}: {out}"
        );
    }
    // What they do not (kubernetes-validate 1.37.0 passes each of these):
    // the API server's own rules, checked by hand in the first test.
    for (refusal, (name, value)) in [
        (
            "type",
            broken("type", &|e| {
                e.insert("type".into(), json!("Warn"));
            }),
        ),
        (
            "note of 1025 bytes",
            broken("note", &|e| {
                e.insert("note".into(), json!("x".repeat(1025)));
            }),
        ),
        (
            "name",
            broken("name", &|e| {
                e["metadata"]["name"] = json!("Memwatch_1");
            }),
        ),
        (
            "reportingController",
            broken("controller", &|e| {
                e.insert("reportingController".into(), json!("memwatch agent"));
            }),
        ),
        (
            "namespace",
            broken("namespace", &|e| {
                e["metadata"]["namespace"] = json!("kube-system");
            }),
        ),
    ] {
        let refused = api_server_refusals(&value);
        assert!(
            refused.iter().any(|r| r.starts_with(refusal)),
            "{name}: {refused:?}"
        );
    }
}
