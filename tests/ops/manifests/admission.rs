//! The ValidatingAdmissionPolicy: it holds the agent's ServiceAccount to its
//! own node, and its CEL (evaluated offline by cel-python) lets the agent's
//! own patches through and denies the rest.

use super::*;

/// The node-name claim of pods' ServiceAccount tokens (Kubernetes 1.32+).
const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";

/// Every CEL expression of the policy, one after the other.
fn policy_cel(policy: &Value) -> String {
    let spec = &policy["spec"];
    ["matchConditions", "variables", "validations"]
        .iter()
        .flat_map(|key| spec[key].as_array().cloned().unwrap_or_default())
        .map(|e| e["expression"].as_str().expect("expression").to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The policy and its binding in `docs`: the binding names the policy and
/// denies; the policy matches the pods' ServiceAccount only, node and node
/// status updates, and checks the token's node-name claim.
fn assert_policy_binds_the_service_account(what: &str, docs: &[Value]) {
    let policy = one(docs, "ValidatingAdmissionPolicy");
    let binding = one(docs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(
        binding["spec"]["policyName"], policy["metadata"]["name"],
        "{what}"
    );
    assert_eq!(strings(&binding["spec"]["validationActions"]), ["Deny"]);
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail", "{what}");
    let (namespace, name) = service_account(docs);
    let conditions = spec["matchConditions"].as_array().expect("matchConditions");
    assert_eq!(conditions.len(), 1, "{what}");
    assert_eq!(
        conditions[0]["expression"],
        format!("request.userInfo.username == 'system:serviceaccount:{namespace}:{name}'"),
        "{what}"
    );
    let rules = spec["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap();
    let matched: BTreeSet<(&str, &str, Vec<&str>)> = rules
        .iter()
        .flat_map(|r| {
            assert_eq!(strings(&r["apiGroups"]).len(), 1, "{what}");
            let group = strings(&r["apiGroups"])[0];
            strings(&r["resources"])
                .into_iter()
                .map(move |res| (group, res, strings(&r["operations"])))
        })
        .collect();
    assert_eq!(
        matched,
        BTreeSet::from([
            ("", "nodes", vec!["UPDATE"]),
            ("", "nodes/status", vec!["UPDATE"]),
            ("events.k8s.io", "events", vec!["CREATE", "UPDATE"]),
        ]),
        "{what}"
    );
    let cel = policy_cel(policy);
    for needed in [
        format!("'{NODE_CLAIM}' in request.userInfo.extra"),
        "has(request.userInfo.extra)".to_string(),
        "object.metadata.name in variables.tokenNodes".to_string(),
        "memwatch.io/unhealthy".to_string(),
        "MemwatchUnhealthy".to_string(),
        format!(
            "object.reportingController == '{}'",
            memwatch::kubernetes_objects::CONTROLLER
        ),
    ] {
        assert!(cel.contains(&needed), "{what}: {needed} in\n{cel}");
    }
    // "No other field", by allow-list: every field of the node at each
    // level is compared but those named (tests/ops/admission.rs changes
    // each field of the 1.37 Node's schema, and one it does not have yet).
    for (part, own) in [
        ("Node", "['metadata', 'spec', 'status']"),
        ("Meta", "['resourceVersion', 'managedFields', 'generation']"),
        ("Spec", "['taints']"),
        ("Status", "['conditions']"),
    ] {
        let compared = format!(
            "variables.new{part}.all(k, k in {own} || (k in variables.old{part} && \
             variables.new{part}[k] == variables.old{part}[k])) && \
             variables.old{part}.all(k, k in {own} || k in variables.new{part})"
        );
        assert!(
            cel.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .contains(&compared),
            "{what}: {part} is not compared by allow-list:\n{cel}"
        );
    }
}

#[test]
fn admission_policy_holds_the_service_account_to_its_own_node() {
    let raw = raw_docs();
    assert_policy_binds_the_service_account("deploy/kubernetes", &raw);
    let chart = Chart::render(
        None,
        &[
            "validatingadmissionpolicy",
            "validatingadmissionpolicybinding",
        ],
    );
    assert_policy_binds_the_service_account("the chart", &chart.docs);
    // The chart's policy is the raw one (the release memwatch in the
    // namespace memwatch has the same ServiceAccount).
    assert_eq!(
        chart.one("ValidatingAdmissionPolicy")["spec"],
        one(&raw, "ValidatingAdmissionPolicy")["spec"]
    );
    assert_eq!(
        chart.one("ValidatingAdmissionPolicy")["metadata"]["name"],
        "memwatch-memwatch-node-writes"
    );
    let chart = Chart::render(
        Some(&values("values-usual.yaml")),
        &["validatingadmissionpolicy"],
    );
    assert_policy_binds_the_service_account("the chart, values-usual.yaml", &chart.docs);
}

/// `patch` merged into `node` as the API server merges the sink's
/// strategic-merge patches: objects key by key, `status.conditions` by
/// `type`, every other list (`spec.taints` has no merge key) replaced; a
/// list left empty is absent (omitempty).
fn merged(node: &Value, patch: &Value) -> Value {
    fn merge(target: &mut Value, patch: &Value, path: &str) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (key, value) in p {
                    let inner = format!("{path}.{key}");
                    let slot = t.entry(key.clone()).or_insert(Value::Null);
                    merge(slot, value, &inner);
                    if slot.as_array().is_some_and(|a| a.is_empty()) {
                        t.remove(key);
                    }
                }
            }
            (Value::Array(t), Value::Array(p)) if path == ".status.conditions" => {
                for item in p {
                    match t.iter_mut().find(|c| c["type"] == item["type"]) {
                        Some(c) => merge(c, item, path),
                        None => t.push(item.clone()),
                    }
                }
            }
            (t, p) => *t = p.clone(),
        }
    }
    let mut out = node.clone();
    merge(&mut out, patch, "");
    out
}

/// An update of node `n1` (or its status) as admission sees it: by
/// `user`, its token's extra (`None`: a token without any).
fn update(
    name: &str,
    status: bool,
    user: &str,
    extra: Option<Value>,
    old: &Value,
    new: &Value,
) -> Value {
    let mut request = serde_json::json!({
        "operation": "UPDATE",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": new["metadata"]["name"],
        "userInfo": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]},
    });
    if status {
        request["subResource"] = "status".into();
    }
    if let Some(extra) = extra {
        request["userInfo"]["extra"] = extra;
    }
    serde_json::json!({"name": name, "request": request, "object": new, "oldObject": old})
}

/// What the policy says of each case: (name, matched, allowed, message).
fn admit(policy_file: &Path, cases: &[Value]) -> Vec<(String, bool, bool, String)> {
    ops::admission_policy(policy_file, cases)
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["matched"].as_bool().unwrap(),
                r["allowed"].as_bool().unwrap(),
                r["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The policy's CEL, evaluated by cel-python, on the sink's own patches
/// (`memwatch::kubernetes_objects::samples`, merged into the sample node as
/// the API server merges them) and on writes it must deny.
#[test]
fn admission_policy_lets_the_agents_patches_through_and_denies_the_rest() {
    let node = memwatch::kubernetes_objects::sample_node();
    assert_eq!(node["metadata"]["name"], "n1");
    let samples = memwatch::kubernetes_objects::samples();
    let sample = |stem: &str| {
        samples
            .iter()
            .find(|(s, _, _)| *s == stem)
            .unwrap_or_else(|| panic!("sample {stem}"))
            .2
            .clone()
    };
    let account = "system:serviceaccount:memwatch:memwatch";
    // A pod's token on 1.32+: the node's name among the pod's claims.
    let token = |node: &str| {
        Some(serde_json::json!({
            NODE_CLAIM: [node],
            "authentication.kubernetes.io/pod-name": ["memwatch-x7k2p"],
            "authentication.kubernetes.io/pod-uid": ["0b6f7c1e-5a7d-4c3e-9f2a-1d8e6b4a3c21"],
            "authentication.kubernetes.io/credential-id": ["JTI=7f3e"],
        }))
    };
    let tainted = merged(&node, &sample("taint-on"));
    let unhealthy = merged(&node, &sample("condition-unhealthy"));
    let mut bare = node.clone();
    bare.as_object_mut().unwrap().remove("spec");
    bare["spec"] = serde_json::json!({});
    let bare_tainted = merged(
        &bare,
        &serde_json::json!({"spec": {"taints": [
            tainted["spec"]["taints"].as_array().unwrap().last().unwrap()
        ]}}),
    );
    let changed = |f: &dyn Fn(&mut Value)| {
        let mut n = node.clone();
        f(&mut n);
        n
    };
    let own = |name, status, old: &Value, new: &Value| {
        update(name, status, account, token("n1"), old, new)
    };

    // (case, allowed, what the denial names)
    let cases: Vec<(Value, bool, &str)> = vec![
        // The sink's own writes.
        (own("taint on", false, &node, &tainted), true, ""),
        (
            own(
                "taint off",
                false,
                &tainted,
                &merged(&tainted, &sample("taint-off")),
            ),
            true,
            "",
        ),
        (
            own("taint on, no taint before", false, &bare, &bare_tainted),
            true,
            "",
        ),
        (
            own("taint off, none left", false, &bare_tainted, &bare),
            true,
            "",
        ),
        (own("condition set", true, &node, &unhealthy), true, ""),
        (
            own(
                "condition cleared",
                true,
                &unhealthy,
                &merged(&unhealthy, &sample("condition-healthy")),
            ),
            true,
            "",
        ),
        // Another node, or no node-name claim.
        (
            update(
                "taint on n1 from n2",
                false,
                account,
                token("n2"),
                &node,
                &tainted,
            ),
            false,
            "only the node its pod runs on",
        ),
        (
            update(
                "condition of n1 from n2",
                true,
                account,
                token("n2"),
                &node,
                &unhealthy,
            ),
            false,
            "only the node its pod runs on",
        ),
        (
            update("no extra", false, account, None, &node, &tainted),
            false,
            "only the node its pod runs on",
        ),
        (
            update(
                "no node-name claim",
                false,
                account,
                Some(serde_json::json!({"authentication.kubernetes.io/credential-id": ["JTI=1"]})),
                &node,
                &tainted,
            ),
            false,
            "only the node its pod runs on",
        ),
        // Its own node, but more than its taint or condition.
        (
            own(
                "another taint removed",
                false,
                &node,
                &changed(&|n| n["spec"].as_object_mut().unwrap().clear()),
            ),
            false,
            "only its own taint",
        ),
        (
            own(
                "another taint's effect",
                false,
                &node,
                &changed(&|n| n["spec"]["taints"][0]["effect"] = "NoExecute".into()),
            ),
            false,
            "only its own taint",
        ),
        (
            own(
                "its taint as NoExecute",
                false,
                &node,
                &changed(&|n| {
                    n["spec"]["taints"]
                        .as_array_mut()
                        .unwrap()
                        .push(serde_json::json!(
                            {"key": "memwatch.io/unhealthy", "value": "true", "effect": "NoExecute"}
                        ))
                }),
            ),
            false,
            "only its own taint",
        ),
        (
            own(
                "cordon",
                false,
                &node,
                &changed(&|n| n["spec"]["unschedulable"] = true.into()),
            ),
            false,
            "only its own taint",
        ),
        (
            own(
                "podCIDR",
                false,
                &node,
                &changed(&|n| n["spec"]["podCIDR"] = "10.0.9.0/24".into()),
            ),
            false,
            "only its own taint",
        ),
        (
            own(
                "Ready flipped",
                true,
                &node,
                &changed(&|n| n["status"]["conditions"][0]["status"] = "False".into()),
            ),
            false,
            "only its own condition",
        ),
        (
            own(
                "allocatable",
                true,
                &node,
                &changed(&|n| n["status"]["allocatable"] = serde_json::json!({"memory": "1Ti"})),
            ),
            false,
            "only its own condition",
        ),
        (
            own(
                "a label",
                false,
                &node,
                &changed(&|n| {
                    n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = "".into()
                }),
            ),
            false,
            "labels, annotations",
        ),
        (
            own(
                "an annotation",
                true,
                &node,
                &changed(&|n| n["metadata"]["annotations"] = serde_json::json!({"a": "b"})),
            ),
            false,
            "labels, annotations",
        ),
    ];
    // Not memwatch's: the policy does not apply.
    let cordoned = changed(&|n| n["spec"]["unschedulable"] = true.into());
    let others = [
        update(
            "an admin cordons",
            false,
            "kubernetes-admin",
            None,
            &node,
            &cordoned,
        ),
        update(
            "another ServiceAccount",
            false,
            "system:serviceaccount:kube-system:memwatch",
            token("n2"),
            &node,
            &cordoned,
        ),
        update(
            "the kubelet",
            true,
            "system:node:n1",
            None,
            &node,
            &unhealthy,
        ),
    ];
    let all: Vec<Value> = cases
        .iter()
        .map(|(c, _, _)| c.clone())
        .chain(others.iter().cloned())
        .collect();

    let out = tempfile::tempdir().unwrap();
    render_chart_with(out.path(), None, &[]);
    for policy in [
        repo().join("deploy/kubernetes/admission-policy.yaml"),
        out.path().join("manifests.yaml"),
    ] {
        let results = admit(&policy, &all);
        assert_eq!(results.len(), all.len());
        for ((case, allowed, why), (name, matched, was_allowed, message)) in
            cases.iter().zip(&results)
        {
            assert_eq!(&case["name"], name.as_str());
            assert!(matched, "{name}: not matched ({})", policy.display());
            assert_eq!(
                was_allowed,
                allowed,
                "{name}: {message} ({})",
                policy.display()
            );
            assert!(message.contains(why), "{name}: {message}");
            assert!(!message.contains("expression error"), "{name}: {message}");
        }
        for (name, matched, was_allowed, message) in &results[cases.len()..] {
            assert!(!matched && *was_allowed, "{name}: {message}");
        }
    }
}
