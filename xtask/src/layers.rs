//! `cargo xtask layers`: the agent's top-level modules import only lower
//! layers (docs/architecture.md). Run by `cargo xtask test` before the build.
//!
//! The scan reads agent/src as text, no compiler: comments and string/char
//! literals are blanked, the rest is split into tokens, and every path that
//! starts with `crate`, `$crate`, `super` or `self` is followed, through use
//! groups, until it names a top-level module. Inline `mod x { … }` blocks are
//! tracked so `super` climbs from the right place.
//!
//! Sinks are checked one level down as well: a sink is a folder under
//! agent/src/sinks with a `mod.rs`, and only the registry (sinks/mod.rs) and
//! the sink's own folder may name it (`sinks::<name>`, `super::<name>` from
//! a sibling, a bare `sinks::<name>` after `use crate::sinks`). What the rest
//! of the agent needs from a sink is lent through `sinks::Lent`. Test files
//! (`tests.rs`, anything under a `tests/` folder) are exempt: a test builds
//! the config it needs.
//!
//! Longer than 600 lines: the checker and its small tokenizer (comments and
//! literals blanked, paths followed) are one piece; the tests are in
//! layers/tests.rs, the architecture table in layers/architecture.rs.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use crate::shell;

/// Every top-level module of agent/src and its rank, lowest layer first. A
/// module may import only modules of strictly lower rank. A new module goes
/// here on purpose: one missing from this table is reported.
pub(crate) const LAYERS: &[(&str, u8)] = &[
    // Leaf data: events, pod identity, health verdicts, the host worker, units, time.
    ("model", 0),
    // Metrics, logging.
    ("telemetry", 1),
    // Every memory.* file read or written.
    ("cgroup", 2),
    // Pure policy.
    ("watchdog", 2),
    // Loads eBPF, reads ring buffers, the poll fallback.
    ("probe", 3),
    // The durable event log.
    ("outbox", 3),
    // The one way a new event is stored: enriched, counted, appended.
    ("record", 4),
    // The Sink trait, the delivery loop, webhook/nats/dask/slurm.
    ("sinks", 5),
    // File and flags -> validated config.
    ("config", 6),
    // Runtime wiring: monitor, pipeline, sampling, reconcile, heartbeat, status.
    ("daemon", 7),
    // HTTP routes and the response types.
    ("api", 8),
    // CLI commands and the typed client.
    ("cmd", 9),
];

/// Imports that break the rule on purpose: (from, to, why). Each needs its
/// written reason.
pub(crate) const ALLOWED: &[(&str, &str, &str)] = &[];

/// Crate roots (directly in agent/src): they may import anything, and are
/// not scanned.
const ROOTS: &[&str] = &["lib.rs", "main.rs"];

/// The layer table and its exceptions.
pub(crate) struct Rules<'a> {
    pub layers: &'a [(&'a str, u8)],
    pub allowed: &'a [(&'a str, &'a str, &'a str)],
}

pub(crate) const RULES: Rules<'static> = Rules {
    layers: LAYERS,
    allowed: ALLOWED,
};

/// What a check found.
#[derive(Debug)]
pub(crate) struct Report {
    pub files: usize,
    pub imports: usize,
    pub problems: Vec<String>,
}

mod architecture;

pub(crate) fn run() -> anyhow::Result<()> {
    let root = shell::workspace_root();
    let mut report = check(&root, &RULES)?;
    report.problems.extend(architecture::check(&root, LAYERS)?);
    if report.problems.is_empty() {
        println!(
            "layers: {} files, {} imports checked, no violations",
            report.files, report.imports
        );
        return Ok(());
    }
    for problem in &report.problems {
        println!("{problem}");
    }
    bail!(
        "layers: {} problem(s) in agent/src ({} files, {} imports checked); see docs/architecture.md",
        report.problems.len(),
        report.files,
        report.imports
    )
}

/// One import of a top-level module: where, and which module.
struct Import {
    file: String,
    line: usize,
    from: String,
    to: String,
}

/// Checks `root`/agent/src against `rules`.
pub(crate) fn check(root: &Path, rules: &Rules) -> anyhow::Result<Report> {
    let src = root.join("agent/src");
    let mut files = Vec::new();
    walk(&src, &mut files).with_context(|| format!("reading {}", src.display()))?;
    files.sort();

    // Top-level module -> where it is (for reports).
    let mut modules: BTreeMap<String, String> = BTreeMap::new();
    let mut imports = Vec::new();
    let mut scanned = 0;
    let sinks = sink_names(&src);
    let mut sink_problems = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).expect("under src");
        if rel.components().count() == 1 && ROOTS.iter().any(|r| rel == Path::new(r)) {
            continue;
        }
        let module_path = module_path(rel);
        let top = module_path[0].clone();
        let shown = format!("agent/src/{}", rel.display());
        modules
            .entry(top.clone())
            .or_insert_with(|| home(&src, &top));
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        scanned += 1;
        for (to, line) in references(&text, &module_path) {
            if let Some(sink) = to.strip_prefix("sinks::") {
                if sinks.contains(sink) && !may_name_sink(rel, &module_path, sink) {
                    sink_problems.push(format!(
                        "{shown}:{line}: names the `{sink}` sink outside the registry \
                         (agent/src/sinks/mod.rs) and its own folder; lend what is needed \
                         through sinks::Lent (docs/writing-a-sink.md)"
                    ));
                }
            } else if to != top {
                imports.push(Import {
                    file: shown.clone(),
                    line,
                    from: top.clone(),
                    to,
                });
            }
        }
    }

    let rank = |m: &str| rules.layers.iter().find(|(n, _)| *n == m).map(|&(_, r)| r);
    let mut problems = Vec::new();
    for (module, file) in &modules {
        if rank(module).is_none() {
            problems.push(format!(
                "{file}: module `{module}` is not in the layer table (xtask/src/layers.rs): place it on purpose"
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for i in &imports {
        if !seen.insert((&i.file, i.line, &i.to)) {
            continue;
        }
        let (Some(from_rank), to_rank) = (rank(&i.from), rank(&i.to)) else {
            continue; // importer already reported as missing
        };
        let Some(to_rank) = to_rank else {
            if !modules.contains_key(&i.to) {
                problems.push(format!(
                    "{}:{}: module `{}` imports `{}` from the crate root, which is not a module in the layer table",
                    i.file, i.line, i.from, i.to
                ));
            }
            continue;
        };
        let allowed = rules
            .allowed
            .iter()
            .any(|&(f, t, _)| f == i.from && t == i.to);
        if to_rank >= from_rank && !allowed {
            problems.push(format!(
                "{}:{}: module `{}` (rank {from_rank}) imports `{}` (rank {to_rank})",
                i.file, i.line, i.from, i.to
            ));
        }
    }
    problems.extend(cycles(&imports, &modules));
    sink_problems.dedup();
    problems.extend(sink_problems);
    Ok(Report {
        files: scanned,
        imports: imports.len(),
        problems,
    })
}

pub(crate) fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The sinks: folders under `src`/sinks with a `mod.rs`.
fn sink_names(src: &Path) -> BTreeSet<String> {
    let Ok(entries) = fs::read_dir(src.join("sinks")) else {
        return BTreeSet::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("mod.rs").is_file())
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

/// Whether the file at `rel` (module `module_path`) may name `sink`: the
/// registry, the sink's own folder, and test files.
fn may_name_sink(rel: &Path, module_path: &[String], sink: &str) -> bool {
    let test_file = rel.file_name().is_some_and(|n| n == "tests.rs")
        || rel.components().any(|c| c.as_os_str() == "tests");
    test_file
        || module_path == ["sinks"]
        || (module_path.len() >= 2 && module_path[0] == "sinks" && module_path[1] == sink)
}

/// Where a top-level module is, for reports: `x.rs`, `x/mod.rs` or `x/`.
fn home(src: &Path, top: &str) -> String {
    if src.join(format!("{top}.rs")).is_file() {
        format!("agent/src/{top}.rs")
    } else if src.join(top).join("mod.rs").is_file() {
        format!("agent/src/{top}/mod.rs")
    } else {
        format!("agent/src/{top}/")
    }
}

/// `a/b/c.rs` -> [a, b, c]; `a/mod.rs` -> [a]; `a.rs` -> [a].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    if stem != "mod" || parts.is_empty() {
        parts.push(stem.to_string());
    }
    parts
}

/// Import cycles among top-level modules: one line per strongly connected
/// group, with its shortest cycle and where each step of it is imported.
fn cycles(imports: &[Import], modules: &BTreeMap<String, String>) -> Vec<String> {
    // Edge -> first place it is imported.
    let mut edges: BTreeMap<(&str, &str), String> = BTreeMap::new();
    for i in imports.iter().filter(|i| modules.contains_key(&i.to)) {
        edges
            .entry((&i.from, &i.to))
            .or_insert_with(|| format!("{}:{}", i.file, i.line));
    }
    let names: Vec<&str> = modules.keys().map(String::as_str).collect();
    let index = |m: &str| names.iter().position(|n| *n == m).expect("a module");
    let n = names.len();
    let mut reach = vec![vec![false; n]; n];
    for &(a, b) in edges.keys() {
        reach[index(a)][index(b)] = true;
    }
    for k in 0..n {
        let via = reach[k].clone();
        for row in reach.iter_mut().filter(|row| row[k]) {
            for (r, v) in row.iter_mut().zip(&via) {
                *r |= *v;
            }
        }
    }
    let mut done = vec![false; n];
    let mut out = Vec::new();
    for s in 0..n {
        if done[s] || !reach[s][s] {
            continue;
        }
        let group: Vec<usize> = (0..n).filter(|&j| reach[s][j] && reach[j][s]).collect();
        for &j in &group {
            done[j] = true;
        }
        // The shortest cycle in the group (the first module's, on a tie).
        let path = group
            .iter()
            .map(|&from| shortest_cycle(from, &group, &names, &edges))
            .min_by_key(Vec::len)
            .expect("a group has a module");
        let steps: Vec<String> = path
            .windows(2)
            .map(|w| {
                let (a, b) = (names[w[0]], names[w[1]]);
                format!("{a} -> {b} at {}", edges[&(a, b)])
            })
            .collect();
        let cycle: Vec<&str> = path.iter().map(|&i| names[i]).collect();
        let mut line = format!(
            "import cycle: {} ({})",
            cycle.join(" -> "),
            steps.join("; ")
        );
        if group.len() + 1 > path.len() {
            let all: Vec<&str> = group.iter().map(|&i| names[i]).collect();
            line.push_str(&format!("; all tied together: {}", all.join(", ")));
        }
        out.push(line);
    }
    out
}

/// The shortest cycle from `s` back to itself inside `group`, breadth
/// first: [s, …, s].
fn shortest_cycle(
    s: usize,
    group: &[usize],
    names: &[&str],
    edges: &BTreeMap<(&str, &str), String>,
) -> Vec<usize> {
    let mut prev: Vec<Option<usize>> = vec![None; names.len()];
    let mut queue = VecDeque::from([s]);
    let mut last = None;
    'bfs: while let Some(u) = queue.pop_front() {
        for &v in group {
            if edges.contains_key(&(names[u], names[v])) {
                if v == s {
                    last = Some(u);
                    break 'bfs;
                }
                if prev[v].is_none() {
                    prev[v] = Some(u);
                    queue.push_back(v);
                }
            }
        }
    }
    let mut path = vec![s];
    let mut at = last.expect("s is in a cycle");
    while at != s {
        path.push(at);
        at = prev[at].expect("on the way from s");
    }
    path[1..].reverse();
    path.push(s);
    path
}

/// Every top-level module that `text` (a file of module `here`) names
/// through a `crate::`/`$crate::`/`super::`/`self::` path, with its line.
/// Names found in the crate root that are not modules come out too.
fn references(text: &str, here: &[String]) -> Vec<(String, usize)> {
    let tokens = tokens(&strip(text));
    let mut refs = Vec::new();
    let mut depth = 0;
    // Inline `mod name {`, with the brace depth inside it.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].kind {
            Kind::Open => depth += 1,
            Kind::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Kind::Ident(word) if word == "mod" => {
                if let (Some(Kind::Ident(name)), Some(Kind::Open)) = (
                    tokens.get(i + 1).map(|t| &t.kind),
                    tokens.get(i + 2).map(|t| &t.kind),
                ) {
                    inline.push((name.clone(), depth + 1));
                }
            }
            Kind::Ident(word)
                if matches!(word.as_str(), "crate" | "super" | "self")
                    && !(i > 0 && tokens[i - 1].kind == Kind::PathSep) =>
            {
                let mut current: Vec<String> = here.to_vec();
                current.extend(inline.iter().map(|(n, _)| n.clone()));
                let base = match word.as_str() {
                    "crate" => Some(Vec::new()),
                    "super" => current.pop().map(|_| current),
                    _ => Some(current),
                };
                i = follow(&tokens, i + 1, base, &mut refs);
                continue;
            }
            // `sinks::x` after `use crate::sinks`: the top-level import is
            // already counted, so only what is below it is followed.
            Kind::Ident(word)
                if word == "sinks"
                    && !(i > 0 && tokens[i - 1].kind == Kind::PathSep)
                    && tokens.get(i + 1).is_some_and(|t| t.kind == Kind::PathSep) =>
            {
                i = follow(&tokens, i + 1, Some(vec![word.clone()]), &mut refs);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    refs
}

/// Follows `::segment…` from `i` with `base` (the absolute module path so
/// far; None once unknown); records the first segment under the crate
/// root. Returns the index after the path (groups included).
fn follow(
    tokens: &[Token],
    mut i: usize,
    mut base: Option<Vec<String>>,
    refs: &mut Vec<(String, usize)>,
) -> usize {
    while tokens.get(i).is_some_and(|t| t.kind == Kind::PathSep) {
        i += 1;
        match tokens.get(i).map(|t| &t.kind) {
            Some(Kind::Ident(_)) => {
                base = step(base, &tokens[i], refs);
                i += 1;
            }
            Some(Kind::Open) => return group(tokens, i, base, refs),
            _ => return i,
        }
    }
    i
}

/// One path segment on top of `base`.
fn step(
    base: Option<Vec<String>>,
    token: &Token,
    refs: &mut Vec<(String, usize)>,
) -> Option<Vec<String>> {
    let Kind::Ident(name) = &token.kind else {
        return None;
    };
    let mut base = base?;
    match name.as_str() {
        "super" => {
            base.pop()?;
        }
        "self" => {}
        "crate" => base.clear(),
        _ => {
            if base.is_empty() {
                refs.push((name.clone(), token.line));
            } else if base == ["sinks"] {
                // One level down, for the sink check: `sinks::<name>`.
                refs.push((format!("sinks::{name}"), token.line));
            }
            base.push(name.clone());
        }
    }
    Some(base)
}

/// A use group `{ a, b::{c, d}, e::f as g, * }` at `i` (its `{`); returns
/// the index after its `}`.
fn group(
    tokens: &[Token],
    mut i: usize,
    base: Option<Vec<String>>,
    refs: &mut Vec<(String, usize)>,
) -> usize {
    i += 1;
    loop {
        // One item.
        match tokens.get(i).map(|t| &t.kind) {
            None => return i,
            Some(Kind::Ident(_)) => {
                let next = step(base.clone(), &tokens[i], refs);
                i = follow(tokens, i + 1, next, refs);
            }
            Some(Kind::Open) => i = group(tokens, i, base.clone(), refs),
            _ => {}
        }
        // Then whatever is left of it (`as g`, `*`) up to `,` or `}`.
        loop {
            match tokens.get(i).map(|t| &t.kind) {
                None => return i,
                Some(Kind::Close) => return i + 1,
                Some(Kind::Comma) => {
                    i += 1;
                    break;
                }
                Some(Kind::Open) => i = group(tokens, i, None, refs),
                _ => i += 1,
            }
        }
    }
}

#[derive(Debug, PartialEq)]
enum Kind {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other,
}

#[derive(Debug)]
struct Token {
    kind: Kind,
    line: usize,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// Identifiers (raw ones without `r#`), `::`, braces, commas; the rest as
/// `Other`. Lines count from 1.
fn tokens(text: &str) -> Vec<Token> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let kind = if c == b'\n' {
            line += 1;
            i += 1;
            continue;
        } else if c.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if is_ident(c) {
            let mut start = i;
            if c == b'r'
                && b.get(i + 1) == Some(&b'#')
                && b.get(i + 2).is_some_and(|&n| is_ident(n))
            {
                start = i + 2;
            }
            i = start;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            out.push(Token {
                kind: Kind::Ident(text[start..i].to_string()),
                line,
            });
            continue;
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            i += 1;
            Kind::PathSep
        } else if c == b'{' {
            Kind::Open
        } else if c == b'}' {
            Kind::Close
        } else if c == b',' {
            Kind::Comma
        } else {
            Kind::Other
        };
        out.push(Token { kind, line });
        i += 1;
    }
    out
}

/// `text` with comments and string, byte-string, raw-string and char
/// literals blanked out (newlines kept, so lines stay where they were).
/// Lifetimes and labels (`'a`) are left alone.
pub(crate) fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut blank = |from: usize, to: usize| {
        for byte in &mut out[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let len = b.len();
    let mut i = 0;
    while i < len {
        let c = b[i];
        let next = b.get(i + 1).copied();
        let end = if c == b'/' && next == Some(b'/') {
            b[i..]
                .iter()
                .position(|&x| x == b'\n')
                .map_or(len, |p| i + p)
        } else if c == b'/' && next == Some(b'*') {
            let (mut j, mut depth) = (i + 2, 1);
            while j < len && depth > 0 {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            j.min(len)
        } else if c == b'"' {
            let mut j = i + 1;
            while j < len && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(len)
        } else if c == b'\'' {
            match char_end(b, i) {
                Some(end) => end,
                None => {
                    i += 1; // a lifetime or a label
                    continue;
                }
            }
        } else if is_ident(c) {
            match raw_string_end(b, i) {
                Some(end) => end,
                None => {
                    // Skip the whole word: an `r` inside it starts nothing.
                    while i < len && is_ident(b[i]) {
                        i += 1;
                    }
                    continue;
                }
            }
        } else {
            i += 1;
            continue;
        };
        blank(i, end);
        i = end;
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced, whole characters")
}

/// The end of a char literal opening at `i` (`'x'`, `'\n'`, `'\u{..}'`,
/// `'é'`), or None for a lifetime or label (`'a`, `'static`).
fn char_end(b: &[u8], i: usize) -> Option<usize> {
    let first = *b.get(i + 1)?;
    if first == b'\\' {
        let close = b.get(i + 3..)?.iter().position(|&x| x == b'\'')?;
        return Some(i + 3 + close + 1);
    }
    let width = match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    (b.get(i + 1 + width) == Some(&b'\'') && first != b'\'').then_some(i + 2 + width)
}

/// The end of a raw string (`r"…"`, `r#"…"#`, `br#"…"#`, `cr"…"`) starting
/// at `i`, the start of a word; None if none starts there.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    if matches!(b[j], b'b' | b'c') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&x| x == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    j += 1;
    while j < b.len() {
        if b[j] == b'"'
            && b[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&x| x == b'#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(b.len())
}

#[cfg(test)]
mod tests;
