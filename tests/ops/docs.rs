//! The docs, the dashboard and the alert rules, checked against the code:
//! every metric they name is one the agent exports (and docs/metrics.md
//! names them all); every config key of the structs is in
//! docs/configuration.md (and nothing more); docs/design.md, the contract,
//! names every command, flag, route and event kind the code has (and no
//! route it does not serve); docs/events.md lists exactly the event fields
//! and every kind; the Helm chart's README lists exactly the values its
//! schema types; links between the docs resolve; and no tracked file points
//! outside the repository.
//!
//! Longer than 600 lines: every doc-against-code check, with the scanners
//! of the source they share (routes, flags, config keys, event fields);
//! not split by subject yet (`sink_guide` is its first module).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use memwatch::EventKind;
use memwatch_tests::ops::{read, repo};

mod sink_guide;

/// A source file of the agent, with `pub(crate)` read as `pub`: the
/// scanners below look for items whatever their visibility.
fn source(path: &str) -> String {
    read(path).replace("pub(crate) ", "pub ")
}

/// `memwatch_*` names exported by the agent: the constants of telemetry/mod.rs.
fn exported_metrics() -> BTreeSet<String> {
    let names: BTreeSet<String> = source("agent/src/telemetry/mod.rs")
        .lines()
        .filter(|l| l.trim_start().starts_with("pub const"))
        .filter_map(|l| l.split('"').nth(1))
        .filter(|n| n.starts_with("memwatch_"))
        .map(str::to_string)
        .collect();
    assert!(
        names.len() >= 20,
        "telemetry/mod.rs constants not found: {names:?}"
    );
    names
}

/// Every `memwatch_…` token in `text` (`…_bucket` as its histogram).
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("memwatch_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // A histogram's buckets are its own series of the same metric.
        let name = &tail[..end];
        found.insert(name.strip_suffix("_bucket").unwrap_or(name).to_string());
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
        } else if let Some(rest) = t
            .strip_prefix("pub struct ")
            .or_else(|| t.strip_prefix("struct "))
        {
            let name = rest.split([' ', '{', '(']).next().unwrap_or_default();
            current = strict.then(|| name.to_string());
            strict = false;
            if let Some(n) = &current {
                structs.insert(n.clone(), BTreeSet::new());
            }
        } else if t == "}" {
            current = None;
        } else if let (Some(n), Some(field)) = (
            &current,
            t.strip_prefix("pub ")
                .or(Some(t))
                .filter(|f| !f.starts_with("#[") && !f.starts_with("//")),
        ) && let Some((name, _)) = field.split_once(':')
        {
            structs.get_mut(n).unwrap().insert(name.trim().to_string());
        }
    }
    structs
}

/// The config tables of the sink registry: the `"name" => …` lines of the
/// `sinks! { … }` invocation in sinks/mod.rs.
fn registered_sinks(source: &str) -> Vec<String> {
    let (_, registry) = source
        .split_once("\nsinks! {")
        .expect("the sinks! registry in agent/src/sinks/mod.rs");
    let (registry, _) = registry.split_once('}').expect("its end");
    let names: Vec<String> = registry
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.split_once('"'))
        .map(|(name, _)| name.to_string())
        .collect();
    assert!(names.len() >= 4, "registry lines not found: {names:?}");
    names
}

/// The names in `DELIVERY_KEYS` of sinks/config.rs.
fn delivery_keys(source: &str) -> Vec<String> {
    let list = source
        .split_once("pub const DELIVERY_KEYS")
        .and_then(|(_, rest)| rest.split_once("];"))
        .map(|(list, _)| list)
        .expect("DELIVERY_KEYS in agent/src/sinks/config.rs");
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
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
    let mut code = config_structs(&source("agent/src/config/mod.rs"));
    code.extend(config_structs(&source("agent/src/config/kubernetes.rs")));
    // Each sink's own keys, and the delivery keys every sink table takes
    // (sinks/config.rs), but `connect_timeout` where the sink opens no
    // connection.
    let delivery = delivery_keys(&source("agent/src/sinks/config.rs"));
    let sinks = registered_sinks(&source("agent/src/sinks/mod.rs"));
    // The sink tables are top-level keys of the file, read by the registry.
    code.get_mut("FileConfig")
        .expect("FileConfig in config/mod.rs")
        .extend(sinks.iter().cloned());
    for sink in &sinks {
        let source = source(&format!("agent/src/sinks/{sink}/config.rs"));
        let mut own = config_structs(&source);
        let connects = !source.contains(".delivery(defaults, false)");
        for keys in own.values_mut() {
            keys.extend(
                delivery
                    .iter()
                    .filter(|k| connects || *k != "connect_timeout")
                    .cloned(),
            );
        }
        code.extend(own);
    }
    // `[kubernetes]` is one table: the pod-task keys (config/kubernetes.rs)
    // and the Kubernetes sink's (sinks/kubernetes/config.rs, with the
    // delivery keys), which the config reader hands to the registry.
    let sink_keys = code
        .remove("ApiKeys")
        .expect("ApiKeys in sinks/kubernetes/config.rs");
    code.get_mut("PodTaskKeys")
        .expect("PodTaskKeys in config/kubernetes.rs")
        .extend(sink_keys);
    let table_of = [
        ("FileConfig", ""),
        ("WorkerConfig", "worker"),
        ("RuleConfig", "rule"),
        ("PodTaskKeys", "kubernetes"),
        ("WebhookFile", "webhook"),
        ("NatsFile", "nats"),
        ("OtlpFile", "otlp"),
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
        "docs/design.md",
        "docs/install.md",
        "docs/configuration.md",
        "docs/metrics.md",
        "docs/events.md",
        "docs/delivery.md",
        "docs/troubleshooting.md",
        "docs/kernels.md",
        "docs/development.md",
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

/// Every `.rs` file under `dir`, recursively, leaving out unit-test modules
/// (`tests.rs`, `tests/`); paths relative to the repository.
fn sources_under(dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name == "tests" || name == "tests.rs" {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let root = repo();
    let mut files = Vec::new();
    walk(&root.join(dir), &mut files);
    let mut files: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap_or(f).to_path_buf())
        .collect();
    files.sort();
    files
}

/// A file of the repository (a path relative to it), as text.
fn text_of(path: &Path) -> String {
    source(&path.to_string_lossy())
}

/// Whether `doc` holds `token` followed by something that cannot continue
/// it (so `--token` is not found in `--token-file`, nor `/v1/tasks` in
/// `/v1/tasks/{task_id}`).
fn mentions(doc: &str, token: &str) -> bool {
    doc.match_indices(token).any(|(i, _)| {
        doc[i + token.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || "_-/{}".contains(c)))
    })
}

const HTTP_METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// `METHOD /path` of every `.route(...)` call in agent/src/api.
fn served_routes() -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for file in sources_under("agent/src/api") {
        let source = text_of(&file);
        for (start, _) in source.match_indices(".route(") {
            // The call's arguments, up to its closing parenthesis.
            let rest = &source[start + ".route(".len()..];
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(rest.len(), |(i, _)| i);
            let call = &rest[..end];
            let path = call
                .split('"')
                .nth(1)
                .unwrap_or_else(|| panic!("{}: a .route( without a path: {call}", file.display()));
            let after_path = &call[call.find(path).unwrap_or(0) + path.len()..];
            let mut methods = 0;
            for method in HTTP_METHODS {
                let call = format!("{method}(");
                if after_path.match_indices(&call).any(|(i, _)| {
                    !after_path[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                }) {
                    routes.insert(format!("{} {path}", method.to_uppercase()));
                    methods += 1;
                }
            }
            assert!(
                methods > 0,
                "{}: no method router in .route({call}): teach tests/ops/docs.rs its name",
                file.display()
            );
        }
    }
    assert!(
        routes.len() >= 5,
        "the API routes were not found in agent/src/api (moved? update tests/ops/docs.rs): {routes:?}"
    );
    routes
}

/// `METHOD /path` of every route in the first column of design.md's tables.
fn routes_listed_in(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|cell| {
            let (method, rest) = cell.split_once(' ')?;
            let is_method = HTTP_METHODS.iter().any(|m| m.to_uppercase() == method);
            let path_end = rest.find(['`', '[', '?', ' ']).unwrap_or(rest.len());
            (is_method && rest.starts_with('/')).then(|| format!("{method} {}", &rest[..path_end]))
        })
        .collect()
}

#[test]
fn design_doc_lists_exactly_the_routes_the_api_serves() {
    let design = read("docs/design.md");
    let served = served_routes();
    let missing: Vec<_> = served
        .iter()
        .filter(|r| !mentions(&design, &format!("`{r}")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/design.md does not document the routes {missing:?} that agent/src/api serves: \
         add them to its HTTP API table"
    );
    let listed = routes_listed_in(&design);
    let stale: Vec<_> = listed.difference(&served).collect();
    assert!(
        stale.is_empty(),
        "docs/design.md lists routes {stale:?} that agent/src/api does not serve (served: {served:?})"
    );
}

/// `CamelCase` → `kebab-case`, as clap names subcommands and flags.
fn kebab(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(if c == '_' { '-' } else { c });
        }
    }
    out
}

/// The `memwatch` subcommands: the variants of the `Subcommand` enum
/// `Command` in agent/src (hidden ones left out).
fn subcommands() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in sources_under("agent/src") {
        let source = text_of(&file);
        let mut derive_subcommand = false;
        let mut inside = false;
        let mut renamed: Option<String> = None;
        let mut hidden = false;
        for line in source.lines() {
            let t = line.trim();
            if !inside {
                if t.starts_with("#[derive(") {
                    derive_subcommand = t.contains("Subcommand");
                } else if derive_subcommand
                    && (t.starts_with("pub enum Command ") || t.starts_with("enum Command "))
                {
                    inside = true;
                }
                continue;
            }
            if line.starts_with('}') {
                inside = false;
                derive_subcommand = false;
            } else if let Some(attr) = t.strip_prefix("#[command(") {
                hidden |= attr.contains("hide = true");
                if let Some(name) = attr
                    .split_once("name = \"")
                    .and_then(|(_, n)| n.split('"').next())
                {
                    renamed = Some(name.to_string());
                }
            } else if t.starts_with(|c: char| c.is_ascii_uppercase()) {
                let variant: String = t
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                let name = renamed.take().unwrap_or_else(|| kebab(&variant));
                if !std::mem::take(&mut hidden) {
                    names.insert(name);
                }
            }
        }
    }
    assert!(
        names.len() >= 5,
        "the `memwatch` subcommands (a `#[derive(Subcommand)] enum Command` in agent/src) \
         were not found (renamed? update tests/ops/docs.rs): {names:?}"
    );
    names
}

/// The visible long flags of every `#[arg(long …)]` field in agent/src.
fn cli_flags() -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for file in sources_under("agent/src") {
        let source = text_of(&file);
        let mut pending: Option<(Option<String>, bool)> = None;
        let mut attr = String::new();
        for line in source.lines() {
            let t = line.trim();
            if t.starts_with("#[arg(") || !attr.is_empty() {
                attr.push_str(t);
                if !t.ends_with(")]") {
                    continue;
                }
                let inner = attr
                    .trim_start_matches("#[arg(")
                    .trim_end_matches(")]")
                    .to_string();
                attr.clear();
                let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
                let long = parts.iter().find_map(|p| {
                    if *p == "long" {
                        Some(None)
                    } else {
                        p.strip_prefix("long")
                            .and_then(|r| r.trim_start().strip_prefix('='))
                            .map(|v| Some(v.trim().trim_matches('"').to_string()))
                    }
                });
                if let Some(name) = long {
                    pending = Some((name, parts.contains(&"hide = true")));
                }
            } else if let Some((name, hidden)) = pending.take() {
                let field = t.strip_prefix("pub ").unwrap_or(t);
                let Some((field, _)) = field.split_once(':') else {
                    // Another attribute or a doc comment between: keep waiting.
                    pending = Some((name, hidden));
                    continue;
                };
                if !hidden {
                    flags.insert(format!("--{}", name.unwrap_or_else(|| kebab(field.trim()))));
                }
            }
        }
    }
    assert!(
        flags.len() >= 10,
        "the CLI flags (`#[arg(long …)]` fields in agent/src) were not found: {flags:?}"
    );
    flags
}

#[test]
fn design_doc_lists_every_command_and_flag() {
    let design = read("docs/design.md");
    let commands = subcommands();
    let missing: Vec<_> = commands
        .iter()
        .filter(|c| !mentions(&design, &format!("`memwatch {c}")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/design.md does not document the subcommands {missing:?}: add them to its Commands table"
    );
    let mut named = BTreeSet::new();
    for (i, _) in design.match_indices("`memwatch ") {
        let word: String = design[i + "`memwatch ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '-')
            .collect();
        if !word.is_empty() {
            named.insert(word);
        }
    }
    let stale: Vec<_> = named.difference(&commands).collect();
    assert!(
        stale.is_empty(),
        "docs/design.md names subcommands {stale:?} that `memwatch` does not have ({commands:?})"
    );
    let flags = cli_flags();
    let missing: Vec<_> = flags.iter().filter(|f| !mentions(&design, f)).collect();
    assert!(
        missing.is_empty(),
        "docs/design.md does not document the flags {missing:?}: add them to its Commands section"
    );
}

#[test]
fn design_doc_lists_every_event_kind_and_links_the_tables() {
    let design = read("docs/design.md");
    let missing: Vec<_> = EventKind::ALL
        .iter()
        .map(|k| k.as_str())
        .filter(|k| !design.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/design.md does not name the event kinds {missing:?}: add them to its Events table"
    );
    for doc in ["configuration.md", "events.md", "metrics.md"] {
        assert!(
            design.contains(&format!("({doc})")) || design.contains(&format!("({doc}#")),
            "docs/design.md does not link docs/{doc}, which holds the full table"
        );
    }
}

/// The `pub` fields of `struct name` in `source` (`body` is flattened).
fn struct_fields(source: &str, name: &str) -> Option<BTreeSet<String>> {
    let start = source.find(&format!("pub struct {name} {{"))?;
    let body = &source[start..];
    let body = &body[..body.find("\n}").unwrap_or(body.len())];
    Some(
        body.lines()
            .filter_map(|l| l.trim().strip_prefix("pub "))
            .filter_map(|f| f.split_once(':'))
            .map(|(f, _)| f.trim().to_string())
            .filter(|f| f != "body")
            .collect(),
    )
}

/// The names in the first column of `doc`'s tables between `## {section}`
/// and the next `## ` heading.
fn first_column(doc: &str, section: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut inside = false;
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            inside = heading == section;
        } else if inside && let Some(row) = line.strip_prefix("| `") {
            let first = format!("`{}", row.split(" |").next().unwrap_or_default());
            names.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
        }
    }
    names
}

#[test]
fn events_doc_lists_exactly_the_event_fields_and_every_kind() {
    let (file, source) = sources_under("agent/src")
        .into_iter()
        .map(|f| {
            let text = text_of(&f);
            (f, text)
        })
        .find(|(_, text)| text.contains("pub struct EventBody {"))
        .expect(
            "`pub struct EventBody` not found in agent/src (renamed? update tests/ops/docs.rs)",
        );
    let mut fields = struct_fields(&source, "Event").unwrap_or_else(|| {
        panic!(
            "{}: `pub struct Event` not found next to EventBody",
            file.display()
        )
    });
    fields.extend(struct_fields(&source, "EventBody").unwrap_or_default());
    let doc = read("docs/events.md");
    let listed = first_column(&doc, "Fields");
    let undocumented: Vec<_> = fields.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&fields).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "docs/events.md `## Fields`: undocumented fields {undocumented:?}, \
         documented fields {} does not have {stale:?}",
        file.display()
    );
    let kinds = first_column(&doc, "Kinds");
    let missing: Vec<_> = EventKind::ALL
        .iter()
        .map(|k| k.as_str().to_string())
        .filter(|k| !kinds.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/events.md `## Kinds` lacks {missing:?}"
    );
}

/// The chart's values as its README lists them: the dotted key paths, two
/// levels deep (`image.tag`), of values.schema.json (`global` is Helm's).
fn chart_schema_keys() -> BTreeSet<String> {
    fn walk(
        props: &serde_json::Map<String, serde_json::Value>,
        defs: &serde_json::Value,
        prefix: &str,
        depth: usize,
        out: &mut BTreeSet<String>,
    ) {
        for (key, mut value) in props {
            if key == "global" {
                continue;
            }
            while let Some(target) = value["$ref"].as_str() {
                let name = target.rsplit('/').next().expect("a $ref name");
                value = &defs[name];
            }
            match value["properties"].as_object() {
                Some(inner) if depth < 2 => {
                    walk(inner, defs, &format!("{prefix}{key}."), depth + 1, out)
                }
                _ => {
                    out.insert(format!("{prefix}{key}"));
                }
            }
        }
    }
    let schema: serde_json::Value =
        serde_json::from_str(&read("deploy/helm/memwatch/values.schema.json"))
            .expect("values.schema.json is JSON");
    let mut keys = BTreeSet::new();
    let props = schema["properties"].as_object().expect("properties");
    walk(props, &schema["definitions"], "", 1, &mut keys);
    keys
}

#[test]
fn chart_readme_lists_exactly_the_values_of_the_schema() {
    let readme = read("deploy/helm/memwatch/README.md");
    let listed = first_column(&readme, "Values");
    let typed = chart_schema_keys();
    assert!(typed.contains("serviceMonitor.enabled"), "{typed:?}");
    assert_eq!(
        listed,
        typed,
        "deploy/helm/memwatch/README.md `## Values` against values.schema.json: missing {:?}, extra {:?}",
        typed.difference(&listed).collect::<Vec<_>>(),
        listed.difference(&typed).collect::<Vec<_>>()
    );
}

#[test]
fn links_between_the_docs_resolve() {
    let mut docs = vec![
        PathBuf::from("README.md"),
        PathBuf::from("deploy/helm/memwatch/README.md"),
    ];
    for entry in std::fs::read_dir(repo().join("docs")).expect("docs/") {
        let path = entry.expect("docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(
                path.strip_prefix(repo())
                    .expect("under the repo")
                    .to_path_buf(),
            );
        }
    }
    let mut broken = Vec::new();
    for doc in &docs {
        let text = read(&doc.to_string_lossy());
        for (i, _) in text.match_indices("](") {
            let target = &text[i + 2..];
            let target = &target[..target.find(')').unwrap_or(target.len())];
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target, None),
            };
            if file.contains("://") || file.starts_with("mailto:") {
                continue;
            }
            let base = doc.parent().unwrap_or(Path::new(""));
            let linked = if file.is_empty() {
                repo().join(doc)
            } else {
                repo().join(base).join(file)
            };
            if !linked.exists() {
                broken.push(format!("{}: {target}", doc.display()));
                continue;
            }
            // An anchor into a Markdown file names one of its headings.
            if let Some(anchor) = anchor
                && linked.extension().is_some_and(|e| e == "md")
            {
                let text = std::fs::read_to_string(&linked).expect("a linked doc");
                if !heading_anchors(&text).contains(anchor) {
                    broken.push(format!("{}: {target} (no such heading)", doc.display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to files or headings that do not exist: {broken:?}"
    );
}

/// The anchors GitHub makes of a Markdown file's headings: lower case,
/// punctuation but `-` and `_` dropped, spaces as `-`; a repeated one gets
/// `-1`, `-2`, ….
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let title = title.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while !anchors.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
    }
    anchors
}

#[test]
fn heading_anchors_are_githubs() {
    let anchors = heading_anchors(
        "# memwatch with Slurm\n## `[kubernetes]`\n### RBAC and the admission policy\n\
         ```sh\n# not a heading\n```\n## Set up\n## Set up\n#hashtag\n",
    );
    let expected: BTreeSet<String> = [
        "memwatch-with-slurm",
        "kubernetes",
        "rbac-and-the-admission-policy",
        "set-up",
        "set-up-1",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    assert_eq!(anchors, expected);
}

/// What a clone of memwatch alone does not have: written in two pieces so
/// that this file does not hold it.
const OUTSIDE: &str = concat!("..", "/shared");

#[test]
fn no_tracked_file_points_outside_the_repository() {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(
        out.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(str::to_string)
        .collect();
    assert!(
        files.len() > 50,
        "git ls-files listed too little: {files:?}"
    );
    let offenders: Vec<&String> = files
        .iter()
        .filter(|f| {
            let first = f.split('/').next().unwrap_or_default();
            first != ".git" && first != ".ci"
        })
        .filter(|f| {
            std::fs::read(repo().join(f)).is_ok_and(|bytes| {
                bytes
                    .windows(OUTSIDE.len())
                    .any(|w| w == OUTSIDE.as_bytes())
            })
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "these tracked files refer to `{OUTSIDE}`, which a clone of memwatch does not have \
         (the contract is docs/design.md, the machine facts docs/development.md): {offenders:?}"
    );
}
