//! No blocking call on the async runtime: a text check of agent/src, run by
//! `cargo xtask layers` after the layer check.
//!
//! It finds the bodies of `async fn`s and `async` blocks (comments and string
//! literals blanked first) and, inside them but outside the argument of
//! `spawn_blocking(...)`/`block_in_place(...)`, the blocking APIs in
//! [`BLOCKING`]: std::fs, std::process::Command, std::thread::sleep and
//! rusqlite's Connection methods. A hit not in [`ALLOWED`] (file, API, and
//! the written reason it is short) is a problem.
//!
//! What a text check cannot see, honestly: types. It matches names, so
//! `fs::read` is flagged wherever `fs` is std's (a file that imports
//! `tokio::fs` as `fs` is told apart only by its `use` lines), `.execute(` on
//! anything is taken for rusqlite's, and a blocking call in a plain `fn`
//! that an `async fn` calls is not seen at all (only what is written inside
//! the async body). Closures defined inside an async body count as async
//! code unless passed straight to spawn_blocking. It is a tripwire for the
//! common mistake, not a proof.

use std::{fs, path::Path};

use anyhow::{Context as _, bail};

use crate::{layers, shell};

/// The blocking APIs looked for: (pattern, what it is). A pattern matches
/// at an identifier boundary in the stripped text.
pub(crate) const BLOCKING: &[(&str, &str)] = &[
    ("std::fs::", "std::fs"),
    ("fs::", "std::fs"),
    ("File::open(", "std::fs"),
    ("File::create(", "std::fs"),
    ("Command::new(", "std::process::Command"),
    ("thread::sleep(", "std::thread::sleep"),
    ("Connection::open", "rusqlite::Connection"),
    (".execute(", "rusqlite::Connection"),
    (".execute_batch(", "rusqlite::Connection"),
    (".query_row(", "rusqlite::Connection"),
    (".prepare(", "rusqlite::Connection"),
    (".prepare_cached(", "rusqlite::Connection"),
];

/// Blocking calls in async code that stay, each with why: (file under
/// agent/src, API as named in [`BLOCKING`], reason).
pub(crate) const ALLOWED: &[(&str, &str, &str)] = &[];

/// One blocking call found in async code.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Hit {
    pub file: String,
    pub line: usize,
    pub api: &'static str,
    pub pattern: &'static str,
}

pub(crate) fn run() -> anyhow::Result<()> {
    let (files, problems) = check(&shell::workspace_root(), ALLOWED)?;
    if problems.is_empty() {
        println!("blocking: {files} files checked, no blocking call in async code");
        return Ok(());
    }
    for p in &problems {
        println!("{p}");
    }
    bail!(
        "blocking: {} blocking call(s) in async code in agent/src: move them to spawn_blocking \
         or tokio's equivalents, or allow them with a reason (xtask/src/blocking.rs)",
        problems.len()
    )
}

/// Checks `root`/agent/src; returns the files checked and the problems.
pub(crate) fn check(
    root: &Path,
    allowed: &[(&str, &str, &str)],
) -> anyhow::Result<(usize, Vec<String>)> {
    let src = root.join("agent/src");
    let mut files = Vec::new();
    layers::walk(&src, &mut files).with_context(|| format!("reading {}", src.display()))?;
    files.sort();
    let mut problems = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).expect("under src");
        if rel.components().any(|c| c.as_os_str() == "tests") || rel.ends_with("tests.rs") {
            continue; // unit tests: each runs on a runtime of its own
        }
        let rel = rel.display().to_string();
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for hit in hits(&rel, &text) {
            if !allowed
                .iter()
                .any(|&(f, api, _)| f == hit.file && api == hit.api)
            {
                problems.push(format!(
                    "agent/src/{}:{}: `{}` ({}) in async code",
                    hit.file, hit.line, hit.pattern, hit.api
                ));
            }
        }
    }
    Ok((files.len(), problems))
}

/// The blocking calls inside async bodies of one file.
pub(crate) fn hits(file: &str, text: &str) -> Vec<Hit> {
    let stripped = layers::strip(text);
    let b = stripped.as_bytes();
    let tokio_fs = text.lines().any(|l| {
        let l = l.trim();
        l.starts_with("use ") && l.contains("tokio::fs") && !l.contains("tokio::fs::")
    });
    let tokio_command = text
        .lines()
        .any(|l| l.trim().starts_with("use ") && l.contains("tokio::process::Command"));
    let mut async_code = vec![false; b.len()];
    for range in regions(b, "async", true) {
        async_code[range.0..range.1]
            .iter_mut()
            .for_each(|x| *x = true);
    }
    // Unit tests may block (each runs on a runtime of its own).
    for range in regions(b, "cfg(test)", true) {
        async_code[range.0..range.1]
            .iter_mut()
            .for_each(|x| *x = false);
    }
    for name in ["spawn_blocking", "block_in_place"] {
        for range in regions(b, name, false) {
            async_code[range.0..range.1]
                .iter_mut()
                .for_each(|x| *x = false);
        }
    }
    let mut out = Vec::new();
    for &(pattern, api) in BLOCKING {
        if tokio_fs && pattern == "fs::" {
            continue;
        }
        let mut from = 0;
        while let Some(at) = stripped[from..].find(pattern).map(|i| i + from) {
            from = at + pattern.len();
            let boundary = pattern.starts_with('.')
                || at == 0
                || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
            // The path written before it: `tokio::fs::`, `tokio::process::`.
            let path_start = stripped[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(0, |i| i + 1);
            let tokio = stripped[path_start..at].contains("tokio::")
                || (pattern == "Command::new(" && tokio_command);
            if boundary && !tokio && async_code[at] {
                out.push(Hit {
                    file: file.to_string(),
                    line: stripped[..at].matches('\n').count() + 1,
                    api,
                    pattern,
                });
            }
        }
    }
    out.sort_by_key(|h| h.line);
    out.dedup_by(|a, b| a.line == b.line && a.api == b.api);
    out
}

/// Byte ranges after each `word` token: for `async` (braces), from the
/// next `{` to its match; else (parentheses) the call's argument list.
fn regions(b: &[u8], word: &str, braces: bool) -> Vec<(usize, usize)> {
    let (open, close) = if braces { (b'{', b'}') } else { (b'(', b')') };
    let w = word.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i + w.len() <= b.len() {
        let at_word = &b[i..i + w.len()] == w
            && (i == 0 || !ident(b[i - 1]))
            && b.get(i + w.len()).is_none_or(|&c| !ident(c));
        if !at_word {
            i += 1;
            continue;
        }
        let mut j = i + w.len();
        // `async fn f(..) -> T where ..  {`: the body's brace; a `;` first
        // is a declaration without a body (traits).
        while j < b.len() && b[j] != open && !(braces && b[j] == b';') {
            if !braces && !b[j].is_ascii_whitespace() && b[j] != b':' && !ident(b[j]) {
                break;
            }
            j += 1;
        }
        if j < b.len() && b[j] == open {
            let mut depth = 0usize;
            let start = j;
            while j < b.len() {
                if b[j] == open {
                    depth += 1;
                } else if b[j] == close {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                j += 1;
            }
            out.push((start, (j + 1).min(b.len())));
        }
        i += w.len();
    }
    out
}

#[cfg(test)]
mod tests;
