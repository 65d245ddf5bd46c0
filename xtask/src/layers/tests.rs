use std::{fs, path::Path};

use tempfile::TempDir;

use super::{LAYERS, RULES, Rules, check, strip};

/// A clean tree: one file or folder per module of the real table, each
/// importing only lower layers, in every form the scanner follows.
const CLEAN: &[(&str, &str)] = &[
    (
        "lib.rs",
        "pub mod api;\npub mod cgroup;\npub mod cmd;\npub mod config;\npub mod daemon;\n\
         pub mod model;\npub mod outbox;\npub mod probe;\npub mod sinks;\npub mod telemetry;\n\
         pub mod watchdog;\n",
    ),
    ("main.rs", "use memwatch::{cmd, daemon};\nfn main() {}\n"),
    ("model/mod.rs", "pub mod time;\npub struct Event;\n"),
    ("model/time.rs", "use super::Event;\n"),
    ("telemetry.rs", "use crate::model::Event;\n"),
    (
        "cgroup/mod.rs",
        "pub mod files;\npub mod read;\nuse crate::{model, telemetry::Metrics};\n",
    ),
    ("cgroup/files.rs", "pub fn f() {}\n"),
    (
        "cgroup/read.rs",
        "use super::super::model::Event;\n\
         #[cfg(test)]\nmod tests {\n    use super::super::files;\n    use super::*;\n}\n",
    ),
    (
        "watchdog.rs",
        "use crate::model::Verdict;\npub fn level() -> crate::telemetry::Level { todo() }\n",
    ),
    (
        "probe/mod.rs",
        "use crate::{cgroup::Read, watchdog::Policy};\n",
    ),
    (
        "outbox.rs",
        "use crate::model::*;\npub use crate::telemetry::Metrics;\n",
    ),
    (
        "sinks/mod.rs",
        "use crate::{\n    model::{Event, time::Clock},\n    outbox::Outbox as Log,\n    probe,\n};\n",
    ),
    (
        "config.rs",
        "use crate::sinks::Sink;\nconst HELP: &str = r#\"see crate::api \"and\" crate::cmd\"#;\n",
    ),
    (
        "daemon/mod.rs",
        "mod monitor;\nuse crate::{config, sinks::Sink};\n",
    ),
    ("daemon/monitor.rs", "use super::super::config::Config;\n"),
    (
        "api/mod.rs",
        "use crate::daemon::Status;\nfn f<'a>(x: &'a str) -> &'a str { x }\n",
    ),
    ("cmd/mod.rs", "use crate::{api::routes, daemon};\n"),
];

fn tree(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), files);
    dir
}

fn write(root: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = root.join("agent/src").join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
}

/// The clean tree with `changes` written over it.
fn clean_with(changes: &[(&str, &str)]) -> TempDir {
    let dir = tree(CLEAN);
    write(dir.path(), changes);
    dir
}

fn problems(root: &Path) -> Vec<String> {
    check(root, &RULES).unwrap().problems
}

/// The problems less the import cycles: in the clean tree, any upward import
/// also closes a cycle (cycle_is_reported covers those lines).
fn violations(root: &Path) -> Vec<String> {
    let mut found = problems(root);
    found.retain(|p| !p.starts_with("import cycle:"));
    found
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn clean_tree_passes() {
    let dir = tree(CLEAN);
    let report = check(dir.path(), &RULES).unwrap();
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!(report.files, CLEAN.len() - 2, "roots are not scanned");
    assert!(report.imports >= 20, "{report:?}");
}

#[test]
fn plain_use_upward_is_caught() {
    let dir = clean_with(&[(
        "model/time.rs",
        "use super::Event;\nuse crate::sinks::Sink;\n",
    )]);
    assert_eq!(
        violations(dir.path()),
        ["agent/src/model/time.rs:2: module `model` (rank 0) imports `sinks` (rank 5)"]
    );
}

#[test]
fn grouped_multi_line_use_is_caught() {
    let text = "use crate::{\n    model::Event,\n    api::{routes, types::{A, B}},\n    \
                daemon::status as st,\n    outbox,\n};\n";
    let dir = clean_with(&[("sinks/mod.rs", text)]);
    assert_eq!(
        violations(dir.path()),
        [
            "agent/src/sinks/mod.rs:3: module `sinks` (rank 5) imports `api` (rank 8)",
            "agent/src/sinks/mod.rs:4: module `sinks` (rank 5) imports `daemon` (rank 7)",
        ]
    );
}

// Long, on purpose: a table of planted sources and the violation each
// must give; one case per row reads better than one function per case.
#[test]
fn inline_crate_paths_are_caught() {
    let text = "use crate::model::Event;\n\
                #[derive(crate::config::Derive)]\n\
                pub struct S { f: crate::daemon::Status }\n\
                pub fn f() -> u32 {\n    let x = crate::api::answer(1) + 2;\n    \
                println!(\"{}\", crate::cmd::NAME);\n    x\n}\n";
    let dir = clean_with(&[("probe/mod.rs", text)]);
    assert_eq!(
        violations(dir.path()),
        [
            "agent/src/probe/mod.rs:2: module `probe` (rank 3) imports `config` (rank 6)",
            "agent/src/probe/mod.rs:3: module `probe` (rank 3) imports `daemon` (rank 7)",
            "agent/src/probe/mod.rs:5: module `probe` (rank 3) imports `api` (rank 8)",
            "agent/src/probe/mod.rs:6: module `probe` (rank 3) imports `cmd` (rank 9)",
        ]
    );
}

#[test]
fn super_super_escape_is_caught() {
    let dir = clean_with(&[
        (
            "cgroup/read.rs",
            "use super::super::model::Event;\nfn f() { super::super::probe::start() }\n\
             #[cfg(test)]\nmod tests {\n    use super::super::files;\n    \
             use super::super::super::daemon;\n}\n",
        ),
        ("cgroup/mod.rs", "pub mod read;\nuse super::sinks;\n"),
    ]);
    assert_eq!(
        violations(dir.path()),
        [
            "agent/src/cgroup/mod.rs:2: module `cgroup` (rank 2) imports `sinks` (rank 5)",
            "agent/src/cgroup/read.rs:2: module `cgroup` (rank 2) imports `probe` (rank 3)",
            "agent/src/cgroup/read.rs:6: module `cgroup` (rank 2) imports `daemon` (rank 7)",
        ]
    );
}

#[test]
fn same_rank_peer_is_caught() {
    let dir = clean_with(&[("watchdog.rs", "use crate::{cgroup::Usage, model};\n")]);
    assert_eq!(
        violations(dir.path()),
        ["agent/src/watchdog.rs:1: module `watchdog` (rank 2) imports `cgroup` (rank 2)"]
    );
}

#[test]
fn allowed_pair_is_not_reported() {
    let dir = clean_with(&[("watchdog.rs", "use crate::cgroup::Usage;\n")]);
    let rules = Rules {
        layers: LAYERS,
        allowed: &[("watchdog", "cgroup", "a test reason")],
    };
    assert!(check(dir.path(), &rules).unwrap().problems.is_empty());
}

#[test]
fn module_missing_from_the_table_is_reported() {
    let dir = clean_with(&[
        ("kube/mod.rs", "use crate::model::Event;\n"),
        ("kube/pods.rs", "pub struct Pod;\n"),
        (
            "api/mod.rs",
            "use crate::{daemon::Status, kube::pods::Pod};\n",
        ),
        ("model/time.rs", "pub fn now() -> crate::VERSION {}\n"),
    ]);
    assert_eq!(
        problems(dir.path()),
        [
            "agent/src/kube/mod.rs: module `kube` is not in the layer table (xtask/src/layers.rs): place it on purpose",
            "agent/src/model/time.rs:1: module `model` imports `VERSION` from the crate root, which is not a module in the layer table",
        ]
    );
}

#[test]
fn cycle_is_reported() {
    let dir = clean_with(&[
        ("probe/mod.rs", "use crate::{cgroup::Read, sinks::Sink};\n"),
        (
            "telemetry.rs",
            "use crate::model::Event;\nuse crate::daemon::Status;\n",
        ),
    ]);
    assert_eq!(
        problems(dir.path()),
        [
            "agent/src/probe/mod.rs:1: module `probe` (rank 3) imports `sinks` (rank 5)",
            "agent/src/telemetry.rs:2: module `telemetry` (rank 1) imports `daemon` (rank 7)",
            "import cycle: probe -> sinks -> probe (probe -> sinks at agent/src/probe/mod.rs:1; \
             sinks -> probe at agent/src/sinks/mod.rs:4); all tied together: \
             cgroup, config, daemon, outbox, probe, sinks, telemetry",
        ]
    );

    // A cycle made only of allowed pairs has no violation, and still shows.
    let dir = clean_with(&[
        ("watchdog.rs", "use crate::cgroup::Usage;\n"),
        ("cgroup/files.rs", "fn f() -> crate::watchdog::Verdict {}\n"),
    ]);
    let rules = Rules {
        layers: LAYERS,
        allowed: &[
            ("watchdog", "cgroup", "test"),
            ("cgroup", "watchdog", "test"),
        ],
    };
    assert_eq!(
        check(dir.path(), &rules).unwrap().problems,
        [
            "import cycle: cgroup -> watchdog -> cgroup (cgroup -> watchdog at \
          agent/src/cgroup/files.rs:1; watchdog -> cgroup at agent/src/watchdog.rs:1)"
        ]
    );
}

#[test]
fn imports_in_comments_and_strings_are_not_reported() {
    let text = r####"//! use crate::api;
/// Calls crate::daemon::run().
use crate::model::Event; // crate::cmd
/* use crate::api;
   /* nested: crate::api */ still crate::api */
const A: &str = "crate::api \" crate::api";
const B: &str = r#"crate::api "quoted" crate::cmd"#;
const C: &[u8] = br##"crate::api"#"##;
const D: &[u8] = b"crate::api\\";
const E: char = '"';
const F: char = '\'';
const G: char = '{';
fn h<'a>(x: &'a str) -> &'a str {
    'outer: loop { break 'outer; }
    x
}
"####;
    let dir = clean_with(&[("watchdog.rs", text)]);
    assert_eq!(problems(dir.path()), Vec::<String>::new());

    // And the stripping did not swallow what comes after each literal.
    let caught = format!("{text}fn z() {{ crate::api::x() }}\n");
    let dir = clean_with(&[("watchdog.rs", &caught)]);
    assert_eq!(
        violations(dir.path()),
        ["agent/src/watchdog.rs:17: module `watchdog` (rank 2) imports `api` (rank 8)"]
    );
}

#[test]
fn strip_keeps_lines_and_code() {
    let text = "a // c\nb /* x\ny */ c \"s\\\"t\" 'q' '\\n' 'l r\"x\"y r#z";
    let stripped = strip(text);
    assert_eq!(stripped.len(), text.len());
    assert_eq!(stripped.lines().count(), text.lines().count());
    let words: Vec<&str> = stripped.split_whitespace().collect();
    assert_eq!(words, ["a", "b", "c", "'l", "y", "r#z"]);
}

#[test]
fn violation_planted_into_a_copy_of_a_clean_tree_is_caught() {
    let clean = tree(CLEAN);
    let copy = tempfile::tempdir().unwrap();
    copy_dir(clean.path(), copy.path());
    assert!(problems(copy.path()).is_empty());

    let file = copy.path().join("agent/src/outbox.rs");
    let mut text = fs::read_to_string(&file).unwrap();
    text.push_str("pub fn deliver() { crate::sinks::deliver() }\n");
    fs::write(&file, text).unwrap();

    assert_eq!(
        problems(copy.path()),
        [
            "agent/src/outbox.rs:3: module `outbox` (rank 3) imports `sinks` (rank 5)",
            "import cycle: outbox -> sinks -> outbox (outbox -> sinks at agent/src/outbox.rs:3; \
             sinks -> outbox at agent/src/sinks/mod.rs:3)",
        ]
    );
    assert!(
        problems(clean.path()).is_empty(),
        "the original is untouched"
    );
}

#[test]
fn the_table_is_well_formed() {
    for (i, (name, _)) in LAYERS.iter().enumerate() {
        assert!(
            !LAYERS[i + 1..].iter().any(|(other, _)| other == name),
            "{name} twice"
        );
    }
    assert!(LAYERS.windows(2).all(|w| w[0].1 <= w[1].1), "lowest first");
    for (from, to, why) in RULES.allowed {
        assert!(
            LAYERS.iter().any(|(n, _)| n == from),
            "{from} not in the table"
        );
        assert!(LAYERS.iter().any(|(n, _)| n == to), "{to} not in the table");
        assert!(!why.trim().is_empty(), "{from} -> {to} needs a reason");
    }
}

#[test]
fn the_real_agent_tree_scans() {
    // Not asserted clean (the tree is being restructured): it must parse and
    // show imports.
    let report = check(&crate::shell::workspace_root(), &RULES).unwrap();
    assert!(report.files > 10, "{report:?}");
    assert!(report.imports > 10, "{report:?}");
}

/// The clean tree with two sinks (`webhook`, `slurm`) and a registry that
/// names them, plus a sink-independent piece (`sinks/config.rs`).
const WITH_SINKS: &[(&str, &str)] = &[
    (
        "sinks/mod.rs",
        "pub mod config;\npub mod slurm;\npub mod webhook;\n\
         use self::{slurm::SlurmSink, webhook::WebhookSink};\n\
         pub fn start() { crate::sinks::webhook::start() }\n",
    ),
    ("sinks/config.rs", "pub struct Secret;\n"),
    (
        "sinks/webhook/mod.rs",
        "mod body;\nuse super::config::Secret;\nuse crate::sinks::webhook::body::Body;\n",
    ),
    (
        "sinks/webhook/body.rs",
        "use super::super::webhook::WebhookSink;\n",
    ),
    ("sinks/slurm/mod.rs", "pub struct SlurmSink;\n"),
    (
        "sinks/slurm/tests.rs",
        "use crate::sinks::webhook::WebhookSink;\n",
    ),
    (
        "config/tests.rs",
        "use crate::sinks::{config::Secret, slurm::SlurmConfig};\n",
    ),
    (
        "daemon/mod.rs",
        "mod monitor;\nuse crate::{config, sinks::{self, Lent, config::Secret}};\n\
         fn f() { sinks::start() }\n",
    ),
];

#[test]
fn sinks_named_by_the_registry_their_own_folder_and_tests_pass() {
    let dir = clean_with(WITH_SINKS);
    assert_eq!(problems(dir.path()), Vec::<String>::new());
}

#[test]
fn a_sink_named_outside_the_registry_is_caught() {
    let dir = clean_with(WITH_SINKS);
    write(
        dir.path(),
        &[
            (
                "daemon/pipeline.rs",
                "use crate::sinks::{Lent, dask};\nuse crate::sinks::slurm::SlurmSink;\n",
            ),
            (
                "config.rs",
                "use crate::sinks;\nfn f() -> sinks::webhook::WebhookConfig { todo!() }\n",
            ),
            ("record.rs", "use crate::sinks::{\n    slurm::{self},\n};\n"),
            // A sink naming another sink is a sideways leak too.
            ("sinks/slurm/drain.rs", "use super::super::webhook::Body;\n"),
        ],
    );
    let found: Vec<String> = violations(dir.path())
        .into_iter()
        .filter(|p| p.contains("sink outside the registry"))
        .collect();
    let places: Vec<&str> = found
        .iter()
        .map(|p| p.split(": names").next().unwrap())
        .collect();
    assert_eq!(
        places,
        [
            "agent/src/config.rs:2",
            "agent/src/daemon/pipeline.rs:2",
            "agent/src/record.rs:2",
            "agent/src/sinks/slurm/drain.rs:1",
        ],
        "{found:#?}"
    );
    assert!(found[0].contains("the `webhook` sink"), "{}", found[0]);
    assert!(found[1].contains("the `slurm` sink"), "{}", found[1]);
    // `dask` is not a folder with a mod.rs here: not a sink, not reported.
    assert!(!found.iter().any(|p| p.contains("`dask`")), "{found:#?}");
}

#[test]
fn the_real_agent_tree_names_no_sink_outside_the_registry() {
    let report = check(&crate::shell::workspace_root(), &RULES).unwrap();
    let leaks: Vec<&String> = report
        .problems
        .iter()
        .filter(|p| p.contains("sink outside the registry"))
        .collect();
    assert!(leaks.is_empty(), "{leaks:#?}");
}
