//! An upgrade loses and renumbers nothing: the agent built from commit
//! 454dafa (the build before epochs, seq reservations and the byte budget)
//! runs on a state directory and ships to a webhook receiver, part of its
//! events delivered and part held back by a refusing receiver; then this
//! build runs on the same state directory and receiver. Every event the
//! old build stored reaches the receiver with its id and seq, the new
//! build's events come after, and no seq names two events.
//!
//! The old build is compiled from a git worktree of this repository
//! (target/upgrade/, kept between runs). CI always runs it; elsewhere it
//! runs with MEMWATCH_TEST_UPGRADE=1 (the build takes minutes).

use std::{
    collections::BTreeMap,
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use memwatch_test_support::{
    env::in_ci,
    wait::wait_until_async,
    webhook::{Answer, Receiver},
};
use memwatch_tests::{agent::Agent, workspace_bin};
use serde_json::{Value, json};

/// The build before this changes to the state directory.
const OLD_COMMIT: &str = "454dafa";

/// This tree's `[profile.dev]` for dependencies (Cargo.toml), given to the
/// old commit's build, whose Cargo.toml has none; and no debug info for its
/// own crates, which nothing here debugs.
const SHARED_PROFILE: [&str; 3] = [
    "profile.dev.debug=false",
    "profile.dev.package.\"*\".opt-level=1",
    "profile.dev.package.\"*\".debug=false",
];

fn enabled() -> bool {
    if in_ci() || std::env::var("MEMWATCH_TEST_UPGRADE").is_ok_and(|v| v == "1") {
        return true;
    }
    eprintln!("upgrade test skipped: it builds commit {OLD_COMMIT}; set MEMWATCH_TEST_UPGRADE=1");
    false
}

/// The workspace root (this test's binary lives in target/<profile>/deps).
fn workspace() -> PathBuf {
    let bin = workspace_bin("memwatch");
    bin.ancestors()
        .nth(3)
        .expect("target/<profile>/memwatch")
        .to_path_buf()
}

fn run(command: &mut Command) {
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(status.success(), "{command:?}: {status}");
}

/// `memwatch` as built from [`OLD_COMMIT`].
fn old_build() -> PathBuf {
    let root = workspace();
    let dir = root.join("target/upgrade");
    let src = dir.join("src");
    if !src.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&dir).expect("target/upgrade");
        let known = |root: &PathBuf| {
            Command::new("git")
                .arg("-C")
                .arg(root)
                .args(["cat-file", "-e", &format!("{OLD_COMMIT}^{{commit}}")])
                .status()
                .is_ok_and(|s| s.success())
        };
        if !known(&root) {
            // A shallow clone: fetch the history the old build needs.
            let _ = Command::new("git")
                .arg("-C")
                .arg(&root)
                .args(["fetch", "--unshallow"])
                .status();
        }
        assert!(
            known(&root),
            "commit {OLD_COMMIT} is not in this clone's history (and `git fetch --unshallow` \
             did not bring it): the upgrade test builds it"
        );
        run(Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(["worktree", "add", "--force", "--detach"])
            .arg(&src)
            .arg(OLD_COMMIT));
    }
    // The old commit's profile is overridden with this tree's for the
    // dependencies (optimized a little, no debug info) and none for its own
    // crates, and its intermediate artifacts go to this tree's build
    // directory: the dependencies both builds compile alike (the build
    // scripts and proc-macros above all) are compiled once. Its binary
    // stays in a target directory of its own.
    run(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["build", "--locked", "-p", "memwatch", "--bin", "memwatch"])
            .args(SHARED_PROFILE.iter().flat_map(|c| ["--config", c]))
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .env("CARGO_BUILD_BUILD_DIR", root.join("target")),
    );
    dir.join("target/debug/memwatch")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The old agent's process, killed on drop.
struct Old(Child);

impl Drop for Old {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn events_of(base: &str) -> Vec<Value> {
    let client = http().await;
    let mut all: Vec<Value> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e["seq"].as_u64().unwrap());
        let page: Vec<Value> = client
            .get(format!("{base}/v1/events?after={after}&limit=1000"))
            .send()
            .await
            .expect("GET /v1/events")
            .json()
            .await
            .expect("events JSON");
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// Every event the receiver got, by id: the seqs it came with (one per
/// delivery).
fn received(receiver: &Receiver) -> BTreeMap<String, Vec<u64>> {
    let mut by_id: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (_, e) in receiver.events() {
        by_id
            .entry(e["id"].as_str().unwrap().to_string())
            .or_default()
            .push(e["seq"].as_u64().unwrap());
    }
    by_id
}

async fn has_all(receiver: &Receiver, events: &[Value]) -> bool {
    let got = received(receiver);
    events
        .iter()
        .all(|e| got.contains_key(e["id"].as_str().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_the_previous_build_loses_and_renumbers_nothing() {
    if !enabled() {
        return;
    }
    let old = tokio::task::spawn_blocking(old_build).await.unwrap();
    let receiver = Receiver::start();
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let log = std::fs::File::create(state.path().join("old.log")).unwrap();
    let process = Command::new(&old)
        .args(["run", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--node-name", "test-node", "--source", "poll"])
        .arg("--state-dir")
        .arg(state.path())
        .args(["--webhook", &receiver.url()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the old build starts");
    let mut old_agent = Old(process);
    let client = http().await;
    wait_until_async("the old build is ready", Duration::from_secs(60), async || {
        matches!(client.get(format!("{base}/ready")).send().await, Ok(r) if r.status() == 200)
    })
    .await;
    let task = async |id: &str| {
        let r = client
            .post(format!("{base}/v1/tasks"))
            .json(&json!({ "task_id": id }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "POST {id}: {}", r.status());
    };
    let end = async |id: &str| {
        let r = client
            .delete(format!("{base}/v1/tasks/{id}?exit_code=0"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "DELETE {id}: {}", r.status());
    };

    // Delivered by the old build.
    task("a1").await;
    task("a2").await;
    end("a1").await;
    let delivered = events_of(&base).await;
    wait_until_async(
        "the old build delivers",
        Duration::from_secs(30),
        async || has_all(&receiver, &delivered).await,
    )
    .await;
    // Held back: the receiver refuses, the old build keeps them.
    receiver.answer(Answer::Status(503));
    task("b1").await;
    task("b2").await;
    end("b1").await;
    end("a2").await;
    let old_events = events_of(&base).await;
    assert!(old_events.len() > delivered.len() + 3, "{old_events:?}");
    // SIGTERM, as an upgrade stops it.
    // SAFETY: kill(2) on our child's pid.
    unsafe { libc::kill(old_agent.0.id() as i32, libc::SIGTERM) };
    let _ = tokio::task::spawn_blocking(move || {
        let _ = old_agent.0.wait();
        old_agent
    })
    .await;

    // This build, same state directory and receiver, accepting again.
    receiver.answer(Answer::Accept);
    let new = Agent::start_in(
        state.path(),
        &["--source", "poll", "--webhook", &receiver.url()],
    )
    .await;
    let (code, _) = new
        .post("/v1/tasks", Some(json!({ "task_id": "c1" })))
        .await;
    assert_eq!(code, 201);
    wait_until_async(
        "every old event delivered",
        Duration::from_secs(60),
        async || has_all(&receiver, &old_events).await,
    )
    .await;
    let new_events = events_of(&new.base_url).await;

    // Kept: the new build lists every old event, same id and seq.
    let listed: BTreeMap<&str, u64> = new_events
        .iter()
        .map(|e| (e["id"].as_str().unwrap(), e["seq"].as_u64().unwrap()))
        .collect();
    let old_max = old_events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .max()
        .unwrap();
    for e in &old_events {
        let id = e["id"].as_str().unwrap();
        let seq = e["seq"].as_u64().unwrap();
        assert_eq!(listed.get(id), Some(&seq), "{id} listed as it was: {e}");
    }
    // Delivered: every old event with its seq, each delivery the same.
    let got = received(&receiver);
    for e in &old_events {
        let id = e["id"].as_str().unwrap();
        let seq = e["seq"].as_u64().unwrap();
        let seqs = &got[id];
        assert!(
            seqs.iter().all(|s| *s == seq),
            "{id}: seq {seq}, delivered as {seqs:?}"
        );
    }
    // New ones come after, and no seq names two events.
    let old_ids: std::collections::BTreeSet<&str> = old_events
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    for e in new_events
        .iter()
        .filter(|e| !old_ids.contains(e["id"].as_str().unwrap()))
    {
        assert!(
            e["seq"].as_u64().unwrap() > old_max,
            "after the old ones: {e}"
        );
    }
    let mut by_seq: BTreeMap<u64, &str> = BTreeMap::new();
    for (id, seqs) in &got {
        for seq in seqs {
            let other = by_seq.insert(*seq, id.as_str());
            assert!(
                other.is_none_or(|o| o == id),
                "seq {seq} names {id} and {other:?}"
            );
        }
    }
    let duplicates: usize = got.values().map(|s| s.len() - 1).sum();
    println!(
        "upgrade from {OLD_COMMIT}: {} old events ({} delivered by the old build, {} held back) \
         delivered with their seqs (1..={old_max}); {} events of the new build after them; \
         {duplicates} deliveries repeated (at least once)",
        old_events.len(),
        delivered.len(),
        old_events.len() - delivered.len(),
        new_events.len() - old_events.len(),
    );
}
