//! The Helm chart: rendered and linted by Helm's own engine with each
//! values file of deploy/check, its config accepted by the agent, its
//! token Secrets across upgrades, its seccomp profile.

use super::*;

#[test]
fn helm_chart_renders_valid_manifests_and_a_config_the_agent_accepts() {
    // (values, workers, webhooks, pod tasks, the Prometheus operator's kinds
    // rendered, the chart's token Secret rendered, the Kubernetes API: its
    // taint and guard (min_remaining, min_remaining_fraction))
    let defaults = Some((false, 1, 0.5));
    for (file, workers, webhooks, pod_tasks, operator, secret, api) in [
        // Defaults: operator kinds `auto`, and no cluster serves them here.
        (None, 0, 0, true, false, true, defaults),
        (
            Some("values-full.yaml"),
            1,
            1,
            true,
            true,
            true,
            Some((true, 2, 0.25)),
        ),
        (Some("values-minimal.yaml"), 0, 0, false, false, true, None),
        (
            Some("values-operator-off.yaml"),
            0,
            0,
            true,
            false,
            true,
            defaults,
        ),
        (
            Some("values-existing-secrets.yaml"),
            0,
            0,
            true,
            false,
            false,
            defaults,
        ),
        (Some("values-usual.yaml"), 0, 0, true, false, true, defaults),
    ] {
        let path = file.map(values);
        let mut expected = vec!["daemonset", "configmap", "service"];
        if secret {
            expected.push("secret");
        }
        if api.is_some() {
            expected.extend(API_KINDS);
        }
        let chart = Chart::render(path.as_deref(), &expected);
        let toml = &chart.toml;
        let config = assert_agent_accepts(toml);
        assert_eq!(config.workers.len(), workers, "{file:?}: {toml}");
        let written = config
            .sinks
            .iter()
            .filter(|s| matches!(s, memwatch::SinkConfig::Webhook(_)))
            .count();
        assert_eq!(written, webhooks, "{file:?}: {toml}");
        assert_eq!(config.kubernetes.pod_tasks, pod_tasks, "{file:?}: {toml}");
        // The agent listens on the pod IP: it has a token of every scope.
        assert!(config.api_token.is_some(), "{file:?}: {toml}");
        assert!(config.task_token.is_some(), "{file:?}: {toml}");
        assert!(config.read_token.is_some(), "{file:?}: {toml}");
        for kind in CRD_KINDS {
            assert_eq!(
                chart.all(kind).len(),
                usize::from(operator),
                "{file:?}: {kind}"
            );
        }
        assert_eq!(chart.all("Secret").len(), usize::from(secret), "{file:?}");
        let sink = kubernetes_sink(&config);
        assert_eq!(sink.is_some(), api.is_some(), "{file:?}: {toml}");
        if let (Some(sink), Some((taint, min_remaining, fraction))) = (sink, api) {
            assert!(sink.condition && sink.events && sink.pod_names, "{sink:?}");
            assert_eq!(sink.taint, taint, "{file:?}: {toml}");
            assert_eq!(sink.guard.min_remaining, min_remaining, "{file:?}");
            assert_eq!(sink.guard.min_remaining_fraction, fraction, "{file:?}");
        }
        let automount = api.is_some();
        assert_eq!(
            chart.pod()["spec"]["automountServiceAccountToken"],
            automount,
            "{file:?}"
        );
        for account in chart.all("ServiceAccount") {
            assert_eq!(account["automountServiceAccountToken"], automount);
        }
    }
}

#[test]
fn helm_chart_makes_the_token_secret_and_mounts_it_when_none_is_given() {
    let chart = Chart::render(None, &["daemonset", "secret", "serviceaccount"]);
    let secret = chart.one("Secret");
    assert_eq!(secret["metadata"]["name"], "memwatch-tokens");
    assert_eq!(
        secret["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    let data = secret["data"].as_object().expect("data");
    let mut tokens: Vec<String> = Vec::new();
    for scope in ["admin", "task", "read"] {
        let b64 = data[scope].as_str().unwrap_or_else(|| panic!("{scope}"));
        let token = decode_base64(b64);
        assert_eq!(token.len(), 48, "{scope}: {token}");
        assert!(token.chars().all(|c| c.is_ascii_alphanumeric()), "{token}");
        tokens.push(token);
    }
    assert_eq!(data.len(), 3, "{data:?}");
    let distinct: std::collections::BTreeSet<&String> = tokens.iter().collect();
    assert_eq!(distinct.len(), 3, "each scope its own token");
    // Offline lookup finds nothing: fresh tokens. Kept across upgrades:
    // helm_chart_keeps_the_tokens_across_upgrades.
    // Mounted read-only, one file per scope, and named in the config.
    assert_eq!(
        chart.token_sources(),
        ["admin", "task", "read"].map(|s| ("memwatch-tokens".into(), s.into(), s.into()))
    );
    let mount = chart.container()["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "tokens")
        .expect("the tokens mount");
    assert_eq!(mount["mountPath"], TOKEN_DIR.trim_end_matches('/'));
    assert_eq!(mount["readOnly"], true);
    for (key, scope) in [
        ("api_token_file", "admin"),
        ("task_token_file", "task"),
        ("read_token_file", "read"),
    ] {
        let line = format!("{key} = \"{TOKEN_DIR}{scope}\"");
        assert!(chart.toml.contains(&line), "{line}:\n{}", chart.toml);
    }
}

#[test]
fn helm_chart_uses_existing_token_secrets_and_makes_none() {
    let chart = Chart::render(
        Some(&values("values-existing-secrets.yaml")),
        &["daemonset"],
    );
    assert!(chart.all("Secret").is_empty(), "{:?}", chart.kinds());
    let expected = [
        ("memwatch-admin", "token", "admin"),
        ("scheduler-memwatch", "memwatch-task-token", "task"),
        ("grafana-memwatch", "read", "read"),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(chart.token_sources(), expected);
}

#[test]
fn helm_chart_takes_the_usual_values() {
    let chart = Chart::render(Some(&values("values-usual.yaml")), &["daemonset", "secret"]);
    let ds = chart.one("DaemonSet");
    assert_eq!(ds["metadata"]["name"], "node-memwatch");
    assert_eq!(ds["metadata"]["labels"]["app.kubernetes.io/name"], "mw");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        "10%"
    );
    let pod = chart.pod();
    assert_eq!(pod["metadata"]["labels"]["team"], "platform");
    assert_eq!(
        pod["metadata"]["annotations"]["example.com/owner"],
        "platform"
    );
    let spec = &pod["spec"];
    assert_eq!(names(&spec["imagePullSecrets"]), ["regcred"]);
    assert_eq!(spec["serviceAccountName"], "node-agents");
    assert!(chart.all("ServiceAccount").is_empty(), "create: false");
    // The Kubernetes API is on by default: the named account's token.
    assert_eq!(spec["automountServiceAccountToken"], true);
    assert!(spec.get("priorityClassName").is_none(), "\"\": none");
    assert_eq!(spec["nodeSelector"]["node-role.example.com/batch"], "true");
    assert_eq!(spec["tolerations"][0]["key"], "gpu");
    assert!(spec["affinity"]["nodeAffinity"].is_object());
    assert!(names(&spec["volumes"]).contains(&"run-memwatch"));
    let container = chart.container();
    assert_eq!(
        container["image"],
        "registry.example.com/ops/memwatch:0.1.0-rc1"
    );
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(
        names(&container["env"]),
        ["NODE_NAME", "RUST_LOG", "POD_IP"]
    );
    assert!(names(&container["volumeMounts"]).contains(&"run-memwatch"));
    // The admin token from the Secret given; task and read made by the chart.
    let secret = chart.one("Secret");
    assert_eq!(secret["metadata"]["name"], "node-memwatch-tokens");
    let mut keys: Vec<&String> = secret["data"].as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["read", "task"]);
    assert_eq!(
        chart.token_sources()[0],
        ("memwatch-admin".into(), "token".into(), "admin".into())
    );
}

#[test]
fn helm_chart_renders_the_operator_kinds_where_the_cluster_serves_them() {
    // `auto` (the default) follows .Capabilities.APIVersions, kind by kind;
    // false wins over a cluster that serves them; true needs no cluster
    // (values-full.yaml, above).
    let both = "monitoring.coreos.com/v1/ServiceMonitor,monitoring.coreos.com/v1/PrometheusRule";
    let monitor_only = "monitoring.coreos.com/v1/ServiceMonitor";
    for (file, api, monitors, rules) in [
        (None, both, 1, 1),
        (None, monitor_only, 1, 0),
        (Some("values-operator-off.yaml"), both, 0, 0),
    ] {
        let path = file.map(values);
        let chart = Chart::render_with(
            path.as_deref(),
            &["--api-versions", api],
            &["daemonset", "secret"],
        );
        assert_eq!(
            chart.all("ServiceMonitor").len(),
            monitors,
            "{file:?} {api}"
        );
        assert_eq!(chart.all("PrometheusRule").len(), rules, "{file:?} {api}");
    }
}

/// The chart's token Secret rendered as an upgrade of a release whose
/// namespace holds `secrets` ({name: {key: base64}}): its data.
fn tokens_after_upgrade(secrets: Value) -> serde_json::Map<String, Value> {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("secrets.json");
    fs::write(&cluster, secrets.to_string()).unwrap();
    let chart = Chart::render_with(
        None,
        &["--cluster", cluster.to_str().unwrap()],
        &["daemonset", "secret"],
    );
    let secret = chart.one("Secret");
    assert_eq!(secret["metadata"]["name"], "memwatch-tokens");
    secret["data"].as_object().unwrap().clone()
}

#[test]
fn helm_chart_keeps_the_tokens_across_upgrades() {
    // The tokens of the release's Secret come back unchanged.
    let kept = serde_json::json!({"admin": "QURNSU4=", "task": "VEFTSw==", "read": "UkVBRA=="});
    let data = tokens_after_upgrade(serde_json::json!({"memwatch-tokens": kept}));
    assert_eq!(Value::Object(data), kept);
    // A scope missing from it (an admin-only Secret) gets a fresh token;
    // the others are kept.
    let data = tokens_after_upgrade(serde_json::json!({"memwatch-tokens": {"admin": "QURNSU4="}}));
    assert_eq!(data["admin"], "QURNSU4=");
    for scope in ["task", "read"] {
        assert_eq!(decode_base64(data[scope].as_str().unwrap()).len(), 48);
    }
    // Upgrading from the chart before scopes: its admin token is kept.
    let data = tokens_after_upgrade(serde_json::json!({"memwatch-api-token": {"token": "T0xE"}}));
    assert_eq!(data["admin"], "T0xE");
    assert_ne!(data["task"], data["read"]);
}

#[test]
fn helm_lint_refuses_values_the_schema_refuses() {
    // The schema means something: values.yaml passes it (every test above),
    // these fail lint, each for its own reason.
    let schema: Value =
        serde_json::from_str(&ops::read("deploy/helm/memwatch/values.schema.json")).unwrap();
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let out = tempfile::tempdir().unwrap();
    let (ok, output) = try_render_chart(out.path(), Some(&values("invalid/values-bad-types.yaml")));
    assert!(!ok, "lint must fail:\n{output}");
    for why in [
        "at '/port': got string, want integer",
        "at '/serviceMonitor/enabled': value must be one of 'auto', true, false",
        "additional properties 'imagePullSecret' not allowed",
    ] {
        assert!(output.contains(why), "{why}:\n{output}");
    }
}

#[test]
fn helm_chart_never_binds_the_default_service_account() {
    // serviceAccount.create=false: a named account made for memwatch, or no
    // rendering at all; never the namespace's `default`, which every pod of
    // the namespace runs as.
    let dir = tempfile::tempdir().unwrap();
    for (name, text, why) in [
        (
            "unnamed.yaml",
            "serviceAccount:\n  create: false\n",
            "serviceAccount.create=false needs serviceAccount.name",
        ),
        (
            "default.yaml",
            "serviceAccount:\n  create: false\n  name: default\n",
            "serviceAccount.name must not be",
        ),
    ] {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        let out = tempfile::tempdir().unwrap();
        let (ok, output) = try_render_chart(out.path(), Some(&path));
        assert!(!ok, "{name} must not render:\n{output}");
        assert!(output.contains(why), "{name}: {why}:\n{output}");
    }
    // A named account: bound, not made, and the pods run as it.
    let path = dir.path().join("named.yaml");
    fs::write(
        &path,
        "serviceAccount:\n  create: false\n  name: node-agents\n",
    )
    .unwrap();
    let chart = Chart::render(
        Some(&path),
        &["daemonset", "clusterrole", "clusterrolebinding"],
    );
    assert!(
        chart.all("ServiceAccount").is_empty(),
        "{:?}",
        chart.kinds()
    );
    assert_eq!(chart.pod()["spec"]["serviceAccountName"], "node-agents");
    let subjects = &chart.one("ClusterRoleBinding")["subjects"];
    assert_eq!(subjects[0]["name"], "node-agents", "{subjects}");
}

/// Standard base64 (the Secret's data), without a crate for it.
fn decode_base64(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        bits = (bits << 6) | v;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    String::from_utf8(out).expect("UTF-8 token")
}

/// `seccomp.profile`: the runtime's default unless told; `localhost` runs
/// an init container (no capability) that writes memwatch's profile with
/// the agent's own binary to the kubelet's seccomp directory, at the path
/// the agent's `Localhost` profile names.
#[test]
fn helm_chart_installs_memwatchs_seccomp_profile_when_asked() {
    let chart = Chart::render(None, &["daemonset", "configmap", "service", "secret"]);
    assert_eq!(
        chart.container()["securityContext"]["seccompProfile"],
        serde_json::json!({"type": "RuntimeDefault"})
    );
    assert!(chart.pod()["spec"]["initContainers"].is_null());

    let chart = Chart::render(
        Some(&values("values-full.yaml")),
        &["daemonset", "configmap", "service", "secret"],
    );
    let spec = &chart.pod()["spec"];
    let profile = &chart.container()["securityContext"]["seccompProfile"];
    assert_eq!(profile["type"], "Localhost");
    let relative = profile["localhostProfile"].as_str().unwrap();
    let init = &spec["initContainers"][0];
    assert_eq!(init["image"], chart.container()["image"], "the same image");
    let args: Vec<&str> = init["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "seccomp-profile");
    let written = args
        .iter()
        .find_map(|a| a.strip_prefix("--output="))
        .expect("--output=");
    let mount = &init["volumeMounts"][0];
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the init container's volume");
    // Only memwatch's own subdirectory of the kubelet's seccomp directory,
    // made if missing: the other workloads' profiles are out of its reach.
    assert_eq!(
        volume["hostPath"],
        serde_json::json!({"path": "/var/lib/kubelet/seccomp/memwatch", "type": "DirectoryOrCreate"})
    );
    assert_eq!(init["volumeMounts"].as_array().unwrap().len(), 1, "{init}");
    assert!(mount["readOnly"].is_null() || mount["readOnly"] == false);
    // The file the init container writes is the one the kubelet resolves
    // (its seccomp directory joined with localhostProfile).
    let inside = written
        .strip_prefix(mount["mountPath"].as_str().unwrap())
        .expect("written under the mount");
    assert_eq!(
        format!("{}{inside}", volume["hostPath"]["path"].as_str().unwrap()),
        format!("/var/lib/kubelet/seccomp/{relative}")
    );
    assert_eq!(
        init["securityContext"]["capabilities"],
        serde_json::json!({"drop": ["ALL"]})
    );
    assert_eq!(init["securityContext"]["readOnlyRootFilesystem"], true);
    // The command exists in the binary the image holds.
    let out = std::process::Command::new(memwatch_tests::workspace_bin("memwatch"))
        .args(["seccomp-profile", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--output"));
}
