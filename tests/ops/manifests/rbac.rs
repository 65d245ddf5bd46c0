//! RBAC: what the ClusterRole grants, compared with the API calls the
//! Kubernetes sink makes, in the raw manifests and the chart.

use super::*;

/// What a ClusterRole grants, rule by rule; a wildcard, a non-resource URL
/// or an aggregation rule (which grants whatever other roles do) fails.
fn grants(role: &Value) -> BTreeSet<Grant> {
    assert!(role.get("aggregationRule").is_none(), "{role}");
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule.get("nonResourceURLs").is_none(), "{rule}");
        let (groups, resources, verbs) = (
            strings(&rule["apiGroups"]),
            strings(&rule["resources"]),
            strings(&rule["verbs"]),
        );
        for name in groups.iter().chain(&resources).chain(&verbs) {
            assert!(!name.contains('*'), "a wildcard in {rule}");
        }
        for group in &groups {
            for resource in &resources {
                for verb in &verbs {
                    out.insert((group.to_string(), resource.to_string(), verb.to_string()));
                }
            }
        }
    }
    out
}

/// The calls the Kubernetes sink makes.
fn api_uses() -> BTreeSet<Grant> {
    memwatch::KUBERNETES_API_USES
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect()
}

/// The ClusterRole in `docs` grants exactly the sink's calls, and the
/// ClusterRoleBinding binds it to the pods' ServiceAccount only.
fn assert_rbac_is_the_calls(what: &str, docs: &[Value]) {
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Role" || d["kind"] == "RoleBinding"),
        "{what}: no namespaced RBAC"
    );
    let role = one(docs, "ClusterRole");
    let granted = grants(role);
    let calls = api_uses();
    assert!(
        granted == calls,
        "{what}: the ClusterRole against memwatch::KUBERNETES_API_USES: missing {:?}, extra {:?}",
        calls.difference(&granted).collect::<Vec<_>>(),
        granted.difference(&calls).collect::<Vec<_>>()
    );
    let binding = one(docs, "ClusterRoleBinding");
    assert_eq!(
        binding["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": role["metadata"]["name"]}),
        "{what}"
    );
    let (namespace, name) = service_account(docs);
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": namespace}]),
        "{what}"
    );
}

#[test]
fn rbac_grants_exactly_what_the_code_calls() {
    // The calls the code declares: nodes, their status, pods, Events.
    assert_eq!(api_uses().len(), memwatch::KUBERNETES_API_USES.len());
    assert_rbac_is_the_calls("deploy/kubernetes", &raw_docs());
    let chart = Chart::render(None, &["clusterrole", "clusterrolebinding"]);
    assert_rbac_is_the_calls("the chart", &chart.docs);
    assert_eq!(
        chart.one("ClusterRole")["metadata"]["name"],
        "memwatch-memwatch",
        "cluster-scoped: <namespace>-<fullname>"
    );
    // An existing ServiceAccount (create: false) is the one bound.
    let chart = Chart::render(Some(&values("values-usual.yaml")), &["clusterrole"]);
    assert_rbac_is_the_calls("the chart, values-usual.yaml", &chart.docs);
    assert_eq!(
        chart.one("ClusterRoleBinding")["subjects"][0]["name"],
        "node-agents"
    );

    // The check means something: a wildcard, an extra verb, a missing one.
    let raw = raw_docs();
    let role = one(&raw, "ClusterRole").clone();
    let mut wildcard = role.clone();
    wildcard["rules"][0]["verbs"] = serde_json::json!(["*"]);
    assert!(std::panic::catch_unwind(|| grants(&wildcard)).is_err());
    let mut extra = role.clone();
    extra["rules"][2]["verbs"] = serde_json::json!(["get", "list", "watch"]);
    assert_ne!(grants(&extra), api_uses());
    let mut missing = role;
    missing["rules"].as_array_mut().unwrap().pop();
    assert_ne!(grants(&missing), api_uses());
}

#[test]
fn helm_chart_without_the_api_renders_no_rbac_and_mounts_no_token() {
    let api_kinds = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    // kubernetes.api: false (values-minimal.yaml).
    let chart = Chart::render(
        Some(&values("values-minimal.yaml")),
        &["daemonset", "serviceaccount"],
    );
    for kind in api_kinds {
        assert!(chart.all(kind).is_empty(), "{kind}: {:?}", chart.kinds());
    }
    assert_eq!(chart.pod()["spec"]["automountServiceAccountToken"], false);
    assert_eq!(
        chart.one("ServiceAccount")["automountServiceAccountToken"],
        false
    );
    assert!(!chart.toml.contains("api ="), "{}", chart.toml);
    assert!(kubernetes_sink(&assert_agent_accepts(&chart.toml)).is_none());

    // The API on, RBAC or the policy left to the cluster's admins.
    let dir = tempfile::tempdir().unwrap();
    for (name, text, absent) in [
        ("no-rbac.yaml", "rbac:\n  create: false\n", &api_kinds[..2]),
        (
            "no-policy.yaml",
            "admissionPolicy:\n  enabled: false\n",
            &api_kinds[2..],
        ),
    ] {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        let chart = Chart::render(Some(&path), &["daemonset"]);
        for kind in api_kinds {
            assert_eq!(
                chart.all(kind).is_empty(),
                absent.contains(&kind),
                "{name}: {kind}"
            );
        }
        assert_eq!(chart.pod()["spec"]["automountServiceAccountToken"], true);
        assert!(kubernetes_sink(&assert_agent_accepts(&chart.toml)).is_some());
    }
}
