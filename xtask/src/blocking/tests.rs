use std::fs;

use super::{ALLOWED, check, hits};

const SAMPLE: &str = r#"
use std::fs;
// fs::read in a comment is not code
fn plain() { let _ = fs::read("/etc/hostname"); std::thread::sleep(D); }
async fn handler(conn: Db) -> u8 {
    let s = "fs::read(\"in a string\")";
    let _ = fs::read_to_string("/proc/self/status");
    let _ = tokio::fs::read("/x").await;
    let ok = tokio::task::spawn_blocking(move || {
        std::fs::metadata("/tmp").is_ok() && conn.execute("x", []).is_ok()
    }).await;
    conn.execute("INSERT", []);
    1
}
trait T { async fn declared(&self); }
fn spawner() {
    tokio::spawn(async move {
        std::thread::sleep(D);
        let _ = std::process::Command::new("true").status();
    });
}
"#;

#[test]
fn finds_blocking_calls_in_async_bodies_only() {
    let found: Vec<(usize, &str)> = hits("x.rs", SAMPLE)
        .iter()
        .map(|h| (h.line, h.api))
        .collect();
    assert_eq!(
        found,
        [
            (7, "std::fs"),
            (12, "rusqlite::Connection"),
            (18, "std::thread::sleep"),
            (19, "std::process::Command"),
        ]
    );
}

#[test]
fn a_file_that_imports_tokio_fs_as_fs_is_not_flagged_for_it() {
    let text = "use tokio::fs;\nasync fn f() { fs::read(\"/x\").await; }\n";
    assert!(hits("x.rs", text).is_empty());
}

#[test]
fn the_check_fails_on_a_tree_with_a_blocking_call_and_passes_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("agent/src/api");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("h.rs"), SAMPLE).unwrap();
    let (files, problems) = check(dir.path(), &[]).unwrap();
    assert_eq!(files, 1);
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(
        problems[0].starts_with("agent/src/api/h.rs:7: `fs::`"),
        "{problems:?}"
    );
    let allowed = [
        ("api/h.rs", "std::fs", "r"),
        ("api/h.rs", "rusqlite::Connection", "r"),
        ("api/h.rs", "std::thread::sleep", "r"),
        ("api/h.rs", "std::process::Command", "r"),
    ];
    assert!(check(dir.path(), &allowed).unwrap().1.is_empty());
}

#[test]
fn every_allowed_entry_gives_a_reason() {
    for (file, api, reason) in ALLOWED {
        assert!(reason.len() > 20, "{file} {api}: a reason, please");
    }
}
