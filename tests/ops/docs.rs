//! The docs, the dashboard and the alert rules, checked against the code:
//! every metric they name is one the agent exports (and docs/metrics.md
//! names them all); every config key of the structs is in
//! docs/configuration.md (and nothing more).

use std::collections::{BTreeMap, BTreeSet};

use memwatch_tests::ops::read;

/// `memwatch_*` names exported by the agent: the constants of telemetry.rs.
fn exported_metrics() -> BTreeSet<String> {
    let names: BTreeSet<String> = read("agent/src/telemetry.rs")
        .lines()
        .filter(|l| l.trim_start().starts_with("pub const"))
        .filter_map(|l| l.split('"').nth(1))
        .filter(|n| n.starts_with("memwatch_"))
        .map(str::to_string)
        .collect();
    assert!(
        names.len() >= 20,
        "telemetry.rs constants not found: {names:?}"
    );
    names
}

/// Every `memwatch_…` token in `text`.
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("memwatch_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        found.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    found
}

fn assert_known(what: &str, used: &BTreeSet<String>, exported: &BTreeSet<String>) {
    let unknown: Vec<_> = used.difference(exported).collect();
    assert!(
        unknown.is_empty(),
        "{what} names metrics the agent does not export: {unknown:?}"
    );
}

/// The PromQL expressions of the dashboard (every `expr` anywhere in it).
fn dashboard_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                        out.push(s.clone())
                    }
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

#[test]
fn dashboard_is_json_and_names_only_exported_metrics() {
    let exported = exported_metrics();
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/memwatch.json")).expect("dashboard JSON");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "{exprs:?}");
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_tokens(e)).collect();
    assert_known("deploy/grafana/memwatch.json", &used, &exported);
    let missing: Vec<_> = exported.difference(&used).collect();
    assert!(
        missing.is_empty(),
        "the dashboard shows no panel for {missing:?}"
    );
}

#[test]
fn alert_rules_name_only_exported_metrics() {
    let exported = exported_metrics();
    for file in [
        "deploy/kubernetes/prometheusrule.yaml",
        "deploy/helm/memwatch/files/alert-groups.yaml",
    ] {
        let used = metric_tokens(&read(file));
        assert!(used.len() >= 5, "{file}: {used:?}");
        assert_known(file, &used, &exported);
    }
}

#[test]
fn metrics_doc_lists_exactly_the_exported_metrics() {
    let exported = exported_metrics();
    let doc = read("docs/metrics.md");
    let listed: BTreeSet<String> = doc
        .lines()
        .filter(|l| l.starts_with("| `memwatch_"))
        .flat_map(metric_tokens)
        .collect();
    assert_known("docs/metrics.md", &metric_tokens(&doc), &exported);
    let missing: Vec<_> = exported.difference(&listed).collect();
    assert!(missing.is_empty(), "docs/metrics.md lacks {missing:?}");
}

/// Fields of the `#[serde(deny_unknown_fields)]` structs in `source`, by struct name.
fn config_structs(source: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut structs = BTreeMap::new();
    let mut strict = false;
    let mut current: Option<String> = None;
    for line in source.lines() {
        let t = line.trim();
        if t.starts_with("#[serde(deny_unknown_fields)]") {
            strict = true;
        } else if let Some(rest) = t.strip_prefix("pub struct ") {
            let name = rest.split([' ', '{', '(']).next().unwrap_or_default();
            current = strict.then(|| name.to_string());
            strict = false;
            if let Some(n) = &current {
                structs.insert(n.clone(), BTreeSet::new());
            }
        } else if t == "}" {
            current = None;
        } else if let (Some(n), Some(field)) = (&current, t.strip_prefix("pub "))
            && let Some((name, _)) = field.split_once(':')
        {
            structs.get_mut(n).unwrap().insert(name.trim().to_string());
        }
    }
    structs
}

/// The keys in the first column of each `## ` section's tables, by section
/// (`""` for the top level, else the table name: `worker`, `kubernetes`…).
fn documented_keys(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut sections = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            current = if heading.starts_with("Top-level") {
                Some(String::new())
            } else if heading.starts_with('`') {
                Some(heading.trim_matches(['`', '[', ']']).to_string())
            } else {
                None
            };
            continue;
        }
        let (Some(section), Some(row)) = (&current, line.strip_prefix("| `")) else {
            continue;
        };
        let first = row.split(" |").next().unwrap_or_default();
        let keys = sections
            .entry(section.clone())
            .or_insert_with(BTreeSet::new);
        for (i, part) in format!("`{first}").split('`').enumerate() {
            if i % 2 == 1 {
                keys.insert(part.to_string());
            }
        }
    }
    sections
}

#[test]
fn configuration_doc_lists_exactly_the_config_keys() {
    let mut code = config_structs(&read("agent/src/config.rs"));
    code.extend(config_structs(&read("agent/src/config/sinks.rs")));
    code.extend(config_structs(&read("agent/src/config/kubernetes.rs")));
    code.extend(config_structs(&read("agent/src/config/schedulers.rs")));
    let table_of = [
        ("FileConfig", ""),
        ("WorkerConfig", "worker"),
        ("RuleConfig", "rule"),
        ("KubernetesFile", "kubernetes"),
        ("WebhookFile", "webhook"),
        ("NatsFile", "nats"),
        ("DaskFile", "dask"),
        ("SlurmFile", "slurm"),
    ];
    let strict: BTreeSet<&String> = code.keys().collect();
    let mapped: BTreeSet<String> = table_of.iter().map(|(s, _)| s.to_string()).collect();
    assert_eq!(
        strict,
        mapped.iter().collect(),
        "a config struct was added or renamed: map it to its docs section here"
    );
    let docs = documented_keys(&read("docs/configuration.md"));
    for (structure, section) in table_of {
        let in_code = &code[structure];
        let in_docs = docs
            .get(section)
            .unwrap_or_else(|| panic!("docs/configuration.md has no section for `{section}`"));
        let undocumented: Vec<_> = in_code.difference(in_docs).collect();
        let stale: Vec<_> = in_docs.difference(in_code).collect();
        assert!(
            undocumented.is_empty() && stale.is_empty(),
            "docs/configuration.md section `{section}`: undocumented keys {undocumented:?}, \
             documented keys the code does not have {stale:?}"
        );
    }
}

#[test]
fn readme_links_the_docs() {
    let readme = read("README.md");
    for doc in [
        "docs/install.md",
        "docs/configuration.md",
        "docs/metrics.md",
        "docs/events.md",
        "docs/troubleshooting.md",
        "docs/kernels.md",
    ] {
        assert!(
            readme.contains(&format!("({doc})")),
            "README does not link {doc}"
        );
        read(doc);
    }
}

#[test]
fn kernels_doc_is_written_by_vm_test_and_covers_the_ci_matrix() {
    let doc = read("docs/kernels.md");
    assert!(
        doc.contains("<!-- Written by `cargo xtask vm-test`"),
        "docs/kernels.md is written by `cargo xtask vm-test`, not by hand"
    );
    let rows: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| kernel "))
        .collect();
    for line in ["6.1.", "6.12."] {
        assert!(
            rows.iter()
                .any(|r| r.starts_with(&format!("| {line}")) && r.contains("| v2 |")),
            "docs/kernels.md has no {line}x row on cgroup v2: {rows:?}"
        );
    }
    assert!(
        rows.iter().any(|r| r.contains("| host |")),
        "docs/kernels.md has no row for the host's kernel: {rows:?}"
    );
    assert!(
        !doc.contains("FAILED"),
        "docs/kernels.md records a failed run"
    );
}
