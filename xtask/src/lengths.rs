//! Files a reader can hold: a Rust file of the workspace over [`LIMIT`]
//! lines says why near its top, in a comment with [`MARK`] (the subject it
//! keeps together, and why splitting it would scatter that). Run by
//! `cargo xtask layers` and `cargo xtask test`.

use std::{fs, path::Path};

use anyhow::{Context as _, bail};

use crate::shell;

/// Lines a file may have without saying why.
pub(crate) const LIMIT: usize = 600;

/// What the reason starts with.
pub(crate) const MARK: &str = "Longer than 600 lines:";

/// How far down the reason may be: the module comment and its first lines.
const WITHIN: usize = 40;

/// The crates' folders that are scanned (their `target/` is not).
const DIRS: &[&str] = &["agent", "agent-common", "agent-ebpf", "tests", "xtask"];

pub(crate) fn run() -> anyhow::Result<()> {
    let (files, problems) = check(&shell::workspace_root())?;
    if problems.is_empty() {
        println!("lengths: {files} files checked, every file over {LIMIT} lines says why");
        return Ok(());
    }
    for p in &problems {
        println!("{p}");
    }
    bail!(
        "lengths: {} file(s) over {LIMIT} lines without a reason: split them by subject, or say \
         why near the top in a comment starting `{MARK}` (xtask/src/lengths.rs)",
        problems.len()
    )
}

/// Checks the Rust files under `root`'s crate folders: the files checked,
/// and one problem per long file without its reason.
pub(crate) fn check(root: &Path) -> anyhow::Result<(usize, Vec<String>)> {
    let mut files = Vec::new();
    for dir in DIRS {
        let dir = root.join(dir);
        if dir.is_dir() {
            walk(&dir, &mut files).with_context(|| format!("reading {}", dir.display()))?;
        }
    }
    files.sort();
    let mut problems = Vec::new();
    for path in &files {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let lines = text.lines().count();
        if lines > LIMIT && !says_why(&text) {
            let rel = path.strip_prefix(root).unwrap_or(path);
            problems.push(format!(
                "{}: {lines} lines, and no `{MARK}` comment in its first {WITHIN} lines",
                rel.display()
            ));
        }
    }
    Ok((files.len(), problems))
}

/// Whether a comment in the first lines of `text` gives the reason.
fn says_why(text: &str) -> bool {
    text.lines().take(WITHIN).any(|l| {
        let l = l.trim_start();
        l.starts_with("//") && l.contains(MARK)
    })
}

/// Every `.rs` file under `dir`, build output (`target/`) left out.
fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn long(head: &str) -> String {
        let mut text = head.to_string();
        text.push_str(&"fn f() {}\n".repeat(LIMIT));
        text
    }

    #[test]
    fn a_long_file_without_its_reason_is_named_and_one_with_it_passes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        file(root, "agent/src/short.rs", "fn f() {}\n");
        file(root, "agent/src/long.rs", &long("//! A module.\n"));
        file(
            root,
            "tests/kernel/said.rs",
            &long(&format!("//! A module.\n//!\n//! {MARK} one subject.\n")),
        );
        // A reason in a string, or too far down, is no reason.
        file(
            root,
            "xtask/src/string.rs",
            &long(&format!("const X: &str = \"{MARK}\";\n")),
        );
        let mut late = long("//! A module.\n");
        late.push_str(&format!("// {MARK} too late.\n"));
        file(root, "agent-common/src/late.rs", &late);
        // Build output is not the workspace's code.
        file(root, "agent/target/debug/build/gen.rs", &long(""));
        let (files, problems) = check(root).unwrap();
        assert_eq!(files, 5);
        let named: Vec<&str> = problems
            .iter()
            .map(|p| p.split(':').next().unwrap())
            .collect();
        assert_eq!(
            named,
            [
                "agent/src/long.rs",
                "agent-common/src/late.rs",
                "xtask/src/string.rs"
            ],
            "{problems:#?}"
        );
        assert!(
            problems[0].contains(&format!("{} lines", LIMIT + 1)),
            "{problems:?}"
        );
    }

    #[test]
    fn this_workspace_passes() {
        let (files, problems) = check(&shell::workspace_root()).unwrap();
        assert!(files > 100, "{files}");
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
