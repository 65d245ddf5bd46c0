//! docs/architecture.md's module table kept true: every top-level module of
//! agent/src with its rank (as [`super::LAYERS`] has it) and every file or
//! folder directly under its folder (`tests` aside). Run by
//! `cargo xtask layers`, so CI fails when the code and the table part.

use std::{collections::BTreeSet, fs, path::Path};

use anyhow::Context as _;

/// A top-level module as agent/src has it.
#[derive(Debug)]
pub(crate) struct Module {
    pub name: String,
    pub rank: u8,
    pub submodules: BTreeSet<String>,
}

/// Reads `root`'s docs/architecture.md and agent/src; what does not match.
pub(crate) fn check(root: &Path, layers: &[(&str, u8)]) -> anyhow::Result<Vec<String>> {
    let path = root.join("docs/architecture.md");
    let doc = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut modules = Vec::new();
    for (name, rank) in layers {
        let dir = root.join("agent/src").join(name);
        modules.push(Module {
            name: name.to_string(),
            rank: *rank,
            submodules: submodules(&dir).with_context(|| format!("reading {}", dir.display()))?,
        });
    }
    Ok(problems(&doc, &modules))
}

/// The files (`.rs`, without it) and folders directly under `dir`, but
/// `mod.rs` and tests; empty for a one-file module.
fn submodules(dir: &Path) -> std::io::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.starts_with("tests") || name == "mod.rs" {
            continue;
        }
        if path.is_dir() {
            out.insert(name.to_string());
        } else if let Some(stem) = name.strip_suffix(".rs") {
            out.insert(stem.to_string());
        }
    }
    Ok(out)
}

/// One row of the doc's table: rank, module, its modules.
struct Row {
    rank: String,
    name: String,
    submodules: BTreeSet<String>,
}

/// The rows of the table under `## Modules` (header and `lib.rs` aside).
fn rows(doc: &str) -> Vec<Row> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Modules"))
        .unwrap_or_default();
    let ticked = |cell: &str| -> BTreeSet<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    section
        .lines()
        .filter(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let [rank, module, _, submodules, ..] = cells[..] else {
                return None;
            };
            let name = module.strip_prefix('`')?.strip_suffix('`')?;
            if name.contains('`') {
                return None; // `lib.rs`, `main.rs`
            }
            Some(Row {
                rank: rank.to_string(),
                name: name.to_string(),
                submodules: if submodules.starts_with('–') {
                    BTreeSet::new()
                } else {
                    ticked(submodules)
                },
            })
        })
        .collect()
}

/// Where the table and the modules part.
pub(crate) fn problems(doc: &str, modules: &[Module]) -> Vec<String> {
    let rows = rows(doc);
    let mut out = Vec::new();
    for m in modules {
        let Some(row) = rows.iter().find(|r| r.name == m.name) else {
            out.push(format!(
                "docs/architecture.md: module `{}` (rank {}) is not in the Modules table",
                m.name, m.rank
            ));
            continue;
        };
        if row.rank != m.rank.to_string() {
            out.push(format!(
                "docs/architecture.md: `{}` has rank {} in the table, {} in xtask/src/layers.rs",
                m.name, row.rank, m.rank
            ));
        }
        for missing in m.submodules.difference(&row.submodules) {
            out.push(format!(
                "docs/architecture.md: `{}` has `{missing}`, not named in its row",
                m.name
            ));
        }
        for gone in row.submodules.difference(&m.submodules) {
            out.push(format!(
                "docs/architecture.md: `{}`'s row names `{gone}`, which agent/src/{}/ does not have",
                m.name, m.name
            ));
        }
    }
    for row in &rows {
        if !modules.iter().any(|m| m.name == row.name) {
            out.push(format!(
                "docs/architecture.md: the table lists `{}`, which is not a module of agent/src",
                row.name
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# A\n\n## Modules\n\n\
        | rank | module | what it holds | its modules | may import |\n\
        |---|---|---|---|---|\n\
        | 0 | `model` | leaf data (`event.rs`) | `event`, `time` | nothing |\n\
        | 4 | `record` | one file | – (one file, `record.rs`) | ranks 0–3 |\n\
        | – | `lib.rs`, `main.rs` | roots | – | anything |\n\n## Next\n\n| 9 | `cmd` | x | `y` | z |\n";

    fn module(name: &str, rank: u8, subs: &[&str]) -> Module {
        Module {
            name: name.into(),
            rank,
            submodules: subs.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_table_that_matches_has_no_problem() {
        let modules = [
            module("model", 0, &["event", "time"]),
            module("record", 4, &[]),
        ];
        assert_eq!(problems(DOC, &modules), Vec::<String>::new());
    }

    #[test]
    fn a_new_or_gone_submodule_a_rank_or_a_module_is_named() {
        let modules = [
            module("model", 1, &["event", "process"]),
            module("cmd", 9, &[]),
        ];
        let found = problems(DOC, &modules);
        let expected = [
            "`model` has rank 0 in the table, 1 in xtask/src/layers.rs",
            "`model` has `process`, not named in its row",
            "`model`'s row names `time`, which agent/src/model/ does not have",
            "module `cmd` (rank 9) is not in the Modules table",
            "the table lists `record`, which is not a module of agent/src",
        ];
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        for (got, want) in found.iter().zip(expected) {
            assert!(got.ends_with(want), "{got} / {want}");
        }
    }

    #[test]
    fn this_repository_s_table_is_true() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let found = check(root, super::super::LAYERS).unwrap();
        assert!(found.is_empty(), "{found:#?}");
    }
}
