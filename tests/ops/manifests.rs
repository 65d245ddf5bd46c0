//! deploy/kubernetes and the Helm chart, validated offline against the
//! Kubernetes schemas (kubernetes-validate --strict), the chart rendered
//! and linted by Helm's own engine (values checked against its
//! values.schema.json) with each values file of deploy/check, and the config
//! it renders accepted by the agent. Needs no root; tools come from PyPI
//! when missing. Helm renders offline here, as `helm template` does: no
//! cluster, so `lookup` finds nothing and the Prometheus operator's API is
//! not served; or with `--api-versions` naming the operator's kinds; or as
//! an upgrade against a stub API server that serves the release's Secrets
//! to `lookup` (deploy/check/render_chart.py). The RBAC rules are compared
//! with the API calls the code makes, and the admission policy's CEL is
//! evaluated offline by cel-python (deploy/check/admission_policy.py)
//! against the agent's own patches and others.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use memwatch::{Config, KubernetesSinkConfig, Overrides, SinkConfig};
use memwatch_tests::ops::{
    self, documented_capabilities, kubernetes_validate, render_chart_with, repo, try_render_chart,
};
use serde_json::Value;

/// Kinds of the Prometheus operator: no schema ships for CRDs.
const CRD_KINDS: [&str; 2] = ["PrometheusRule", "ServiceMonitor"];

/// The kinds rendered for the Kubernetes API (`kubernetes.api`, the
/// default): RBAC and the admission policy, as kubernetes-validate names
/// them.
const API_KINDS: [&str; 4] = [
    "clusterrole",
    "clusterrolebinding",
    "validatingadmissionpolicy",
    "validatingadmissionpolicybinding",
];

/// The text of `file` after `marker` (a YAML key opening a block), each
/// line with `indent` taken off where it has it.
fn block_after(file: &str, marker: &str, indent: &str) -> String {
    ops::read(file)
        .split_once(marker)
        .unwrap_or_else(|| panic!("{marker:?} in {file}"))
        .1
        .lines()
        .map(|l| l.strip_prefix(indent).unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn raw_manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(repo().join("deploy/kubernetes"))
        .expect("deploy/kubernetes")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every document passed, and the only ones without a schema are the CRDs.
fn assert_valid(files: &[PathBuf], expected_kinds: &[&str]) {
    let (ok, out) = kubernetes_validate(files);
    assert!(ok, "kubernetes-validate failed:\n{out}");
    for line in out.lines().filter(|l| l.starts_with("WARN")) {
        assert!(
            CRD_KINDS
                .iter()
                .any(|k| line.contains(&format!("kind {k} "))),
            "unexpected warning: {line}"
        );
    }
    for kind in expected_kinds {
        assert!(
            out.to_lowercase()
                .contains(&format!("passed for resource {kind}/")),
            "{kind} not validated:\n{out}"
        );
    }
}

/// Where the pod's token files are mounted (one per scope).
const TOKEN_DIR: &str = "/var/run/memwatch-token/";

/// The mode the manifests give the token files (`defaultMode` of the
/// Secret volumes): the agent refuses one open to group or others.
const TOKEN_MODE: u32 = 0o400;

/// The agent accepts the config as it would read it in the pod (the token
/// files are mounted from Secrets there, mode [`TOKEN_MODE`]; distinct
/// stand-ins here: the raw manifests' `token`, the chart's `admin`, `task`
/// and `read`).
fn assert_agent_accepts(toml: &str) -> Config {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    for name in ["token", "admin", "task", "read"] {
        let path = dir.path().join(name);
        fs::write(&path, format!("t0ken-{name}")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(TOKEN_MODE)).unwrap();
    }
    let text = toml.replace(TOKEN_DIR, &format!("{}/", dir.path().display()));
    let path = dir.path().join("memwatch.toml");
    fs::write(&path, text).unwrap();
    Config::load(Some(&path), &Overrides::default())
        .unwrap_or_else(|e| panic!("the agent rejects the config: {e}\n{toml}"))
}

/// A values file of deploy/check.
fn values(name: &str) -> PathBuf {
    repo().join("deploy/check").join(name)
}

/// One rendering of the chart, validated: every manifest passed the
/// Kubernetes schemas and lint passed.
struct Chart {
    docs: Vec<Value>,
    toml: String,
}

impl Chart {
    fn render(values: Option<&Path>, expected_kinds: &[&str]) -> Self {
        Self::render_with(values, &[], expected_kinds)
    }

    /// With render_chart.py's options (`--api-versions`, `--cluster`).
    fn render_with(values: Option<&Path>, options: &[&str], expected_kinds: &[&str]) -> Self {
        let out = tempfile::tempdir().unwrap();
        render_chart_with(out.path(), values, options);
        assert_valid(&[out.path().join("manifests.yaml")], expected_kinds);
        let json = fs::read_to_string(out.path().join("manifests.json")).unwrap();
        Self {
            docs: serde_json::from_str(&json).expect("manifests.json"),
            toml: fs::read_to_string(out.path().join("memwatch.toml")).unwrap(),
        }
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let found = self.all(kind);
        assert_eq!(found.len(), 1, "one {kind}: {found:?}");
        found[0]
    }

    fn kinds(&self) -> Vec<&str> {
        self.docs
            .iter()
            .filter_map(|d| d["kind"].as_str())
            .collect()
    }

    fn pod(&self) -> &Value {
        &self.one("DaemonSet")["spec"]["template"]
    }

    fn container(&self) -> &Value {
        &self.pod()["spec"]["containers"][0]
    }

    /// The pod's token volume: (Secret, key, file) for each scope's file.
    fn token_sources(&self) -> Vec<(String, String, String)> {
        let volume = self.pod()["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "tokens")
            .expect("the tokens volume");
        volume["projected"]["sources"]
            .as_array()
            .expect("a projected volume")
            .iter()
            .flat_map(|source| {
                let secret = &source["secret"];
                let name = secret["name"].as_str().unwrap().to_string();
                secret["items"].as_array().unwrap().iter().map(move |item| {
                    (
                        name.clone(),
                        item["key"].as_str().unwrap().to_string(),
                        item["path"].as_str().unwrap().to_string(),
                    )
                })
            })
            .collect()
    }
}

/// `array` (of objects) names `name`.
fn names(array: &Value) -> Vec<&str> {
    array
        .as_array()
        .map(|a| a.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn raw_manifests_pass_the_kubernetes_schemas() {
    let files = raw_manifests();
    assert!(files.len() >= 7, "{files:?}");
    let mut expected = vec![
        "daemonset",
        "configmap",
        "service",
        "namespace",
        "serviceaccount",
    ];
    expected.extend(API_KINDS);
    assert_valid(&files, &expected);
}

#[test]
fn the_validator_rejects_a_broken_daemonset() {
    // The check above means something: a misspelled field fails it.
    let broken = ops::read("deploy/kubernetes/daemonset.yaml").replace("hostPID:", "hostPid:");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemonset.yaml");
    fs::write(&path, broken).unwrap();
    let (ok, out) = kubernetes_validate(&[path]);
    assert!(!ok, "a misspelled field must fail:\n{out}");
}

#[test]
fn raw_configmap_holds_a_config_the_agent_accepts() {
    let toml = block_after(
        "deploy/kubernetes/configmap.yaml",
        "memwatch.toml: |\n",
        "    ",
    );
    let config = assert_agent_accepts(&toml);
    assert!(config.kubernetes.pod_tasks);
    assert_eq!(config.listen.port(), 9750);
    // The Kubernetes API is on, the taint off, the guard at its defaults.
    let sink = kubernetes_sink(&config).expect("[kubernetes] api = true");
    assert!(sink.condition && sink.events && sink.pod_names, "{sink:?}");
    assert!(!sink.taint, "{sink:?}");
    assert_eq!(sink.guard.min_remaining, 1);
    assert_eq!(sink.guard.min_remaining_fraction, 0.5);
    // The pod mounts its ServiceAccount's token for it.
    let pod = yaml_docs(&repo().join("deploy/kubernetes/daemonset.yaml"));
    assert_eq!(
        pod[0]["spec"]["template"]["spec"]["automountServiceAccountToken"],
        true
    );
    let account = yaml_docs(&repo().join("deploy/kubernetes/serviceaccount.yaml"));
    assert_eq!(account[0]["automountServiceAccountToken"], true);
}

/// The Kubernetes sink of a loaded config (`[kubernetes] api = true`).
fn kubernetes_sink(config: &Config) -> Option<&KubernetesSinkConfig> {
    config.sinks.iter().find_map(|s| match s {
        SinkConfig::Kubernetes(k) => Some(k),
        _ => None,
    })
}

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

#[test]
fn manifests_grant_exactly_the_documented_capabilities() {
    let expected: Vec<String> = documented_capabilities()
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect();
    let ds = ops::read("deploy/kubernetes/daemonset.yaml");
    let add = ds
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: "))
        .expect("capabilities.add in the DaemonSet");
    let granted: Vec<String> = add
        .trim_matches(['[', ']'])
        .split(',')
        .map(|c| c.trim().to_string())
        .collect();
    assert_eq!(granted, expected);
    assert!(ds.contains("drop: [ALL]"));
    assert!(!ds.contains("privileged: true"));
    let values = ops::read("deploy/helm/memwatch/values.yaml");
    assert!(
        values.contains(&format!("capabilities: [{}]", expected.join(", "))),
        "chart default capabilities"
    );
}

#[test]
fn chart_and_raw_alert_rules_are_the_same() {
    let spec = block_after("deploy/kubernetes/prometheusrule.yaml", "\nspec:\n", "  ");
    let chart = ops::read("deploy/helm/memwatch/files/alert-groups.yaml");
    assert_eq!(chart.trim_end(), spec.trim_end());
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

/// The YAML documents of `path`, parsed (PyYAML: no YAML crate here).
fn yaml_docs(path: &Path) -> Vec<Value> {
    ops::python_tools();
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], sys.stdout)",
        ])
        .arg(path)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}: {out:?}", path.display());
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The raw manifests, every document of deploy/kubernetes.
fn raw_docs() -> Vec<Value> {
    raw_manifests().iter().flat_map(|f| yaml_docs(f)).collect()
}

/// The one document of `kind` in `docs`.
fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}: {found:?}");
    found[0]
}

fn strings(array: &Value) -> Vec<&str> {
    array
        .as_array()
        .unwrap_or_else(|| panic!("an array: {array}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_else(|| panic!("a string: {v}")))
        .collect()
}

/// (apiGroup, resource, verb)
type Grant = (String, String, String);

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

/// The pods' ServiceAccount: (namespace, name), from the DaemonSet's pod
/// template and the ServiceAccount (or, not made, the namespace's).
fn service_account(docs: &[Value]) -> (String, String) {
    let ds = one(docs, "DaemonSet");
    let name = ds["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_string();
    let namespace = ds["metadata"]["namespace"].as_str().unwrap().to_string();
    if let Some(account) = docs
        .iter()
        .find(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == name.as_str())
    {
        assert_eq!(account["metadata"]["namespace"], namespace.as_str());
    }
    (namespace, name)
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
    ops::python_tools();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.json");
    fs::write(&path, serde_json::to_string(cases).unwrap()).unwrap();
    let out = Command::new("python3")
        .arg(repo().join("deploy/check/admission_policy.py"))
        .arg(policy_file)
        .arg(&path)
        .output()
        .expect("python3 admission_policy.py");
    assert!(out.status.success(), "{out:?}");
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    results
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

/// Both shipped forms mount the token files with [`TOKEN_MODE`]: with the
/// Secret volume's default (0644) the agent would refuse to start.
#[test]
fn token_volumes_give_the_files_the_mode_the_agent_accepts() {
    let mode = format!("defaultMode: {TOKEN_MODE:04o}");
    for file in [
        "deploy/kubernetes/daemonset.yaml",
        "deploy/helm/memwatch/templates/daemonset.yaml",
    ] {
        let text = fs::read_to_string(repo().join(file)).unwrap();
        let modes: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("defaultMode:"))
            .collect();
        assert_eq!(modes, [mode.as_str()], "{file}");
    }
}

/// No bpffs in either shipped DaemonSet: the agent pins nothing, and with
/// CAP_BPF a mounted bpffs would open other components' pinned maps to it.
#[test]
fn daemonsets_mount_no_bpffs() {
    for file in [
        "deploy/kubernetes/daemonset.yaml",
        "deploy/helm/memwatch/templates/daemonset.yaml",
    ] {
        let text = fs::read_to_string(repo().join(file)).unwrap();
        assert!(!text.contains("/sys/fs/bpf"), "{file} mounts bpffs");
    }
}
