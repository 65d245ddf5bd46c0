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

mod admission;
mod chart;
mod rbac;

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
