//! `memwatch top` driven in tmux at 80×24 (send-keys, capture-pane)
//! against a live agent whose task leaks toward its hard cap: the task's
//! row says `imminent` with an ETA and its own limit, the keys pause, filter and quit; piped,
//! it prints plain lines. Root only (the agent and the task's cgroup);
//! never skipped in CI.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use memwatch_test_support::memhog::RATE_ENV;
use memwatch_tests::{
    agent::Agent,
    cgroup::TestCgroup,
    kernel_tests_enabled,
    process::{apt_install, run_bounded},
    workspace_bin,
};

/// A tmux session, killed when dropped.
struct Tmux {
    name: String,
}

impl Tmux {
    fn start(command: &str) -> Self {
        let name = format!("memwatch-top-{}", std::process::id());
        let out = run_bounded(
            "tmux new-session",
            Command::new("tmux").args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                "80",
                "-y",
                "24",
                command,
            ]),
            Duration::from_secs(10),
        );
        assert!(out.status.success(), "tmux new-session: {out:?}");
        Self { name }
    }

    fn pane(&self) -> String {
        let out = run_bounded(
            "tmux capture-pane",
            Command::new("tmux").args(["capture-pane", "-p", "-t", &self.name]),
            Duration::from_secs(10),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        run_bounded(
            "tmux send-keys",
            Command::new("tmux").args(["send-keys", "-t", &self.name, keys]),
            Duration::from_secs(10),
        );
    }

    fn alive(&self) -> bool {
        Command::new("tmux")
            .args(["has-session", "-t", &self.name])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The pane once `ready` holds of it, within `within`.
    fn wait_for(&self, within: Duration, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let pane = self.pane();
            if ready(&pane) {
                return pane;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {within:?}; the pane:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

#[tokio::test]
async fn top_in_tmux_shows_the_leaking_task_first_with_its_eta_and_obeys_its_keys() {
    if !kernel_tests_enabled(
        "top_in_tmux_shows_the_leaking_task_first_with_its_eta_and_obeys_its_keys",
    ) {
        return;
    }
    apt_install(&["tmux"], || {
        Command::new("tmux").arg("-V").output().is_ok()
    });
    let worker = TestCgroup::create("top");
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"1s\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n",
        worker.path_str()
    ))
    .await;
    let memwatch = workspace_bin("memwatch");
    let socket = agent.socket().to_path_buf();
    let task = format!("top-leak-{}", std::process::id() % 10_000);
    // 400 MiB at 10 MiB/s into a 256 MiB hard cap: killed after ~26 s.
    let mut leak = Command::new(&memwatch)
        .arg("exec")
        .arg("--socket")
        .arg(&socket)
        .args(["--hard-cap", "256MiB", "--task-id", &task, "--"])
        .arg(workspace_bin("memhog"))
        .args(["400", "60"])
        .env(RATE_ENV, "10")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memwatch exec");

    let top = Tmux::start(&format!(
        "{} top --socket {}",
        memwatch.display(),
        socket.display()
    ));
    // Generous: the leak reaches its cap in ~26 s on a quiet machine.
    let pane = top.wait_for(
        Duration::from_secs(90),
        "imminent row with an ETA",
        |pane| {
            pane.lines().any(|l| {
                l.starts_with("imminent")
                    && l.contains(&task[..15.min(task.len())])
                    && l.trim_end().ends_with('s')
            })
        },
    );
    eprintln!("memwatch top, 80x24, a task leaking 10 MiB/s into 256 MiB:\n{pane}");
    let lines: Vec<&str> = pane.lines().collect();
    assert!(lines[0].starts_with("memwatch top - "), "{pane}");
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{pane}");
    let header = lines
        .iter()
        .position(|l| l.starts_with("STATE"))
        .expect("table header");
    assert!(
        lines[header + 1].starts_with("imminent"),
        "the predicted kill comes first:\n{pane}"
    );
    // Its nearest limit is its own hard cap; the worker's cgroup has none,
    // so the worker's is the host's memory.
    assert!(
        lines[header + 1].contains(" 256M own "),
        "the task's own 256 MiB limit in LIMIT/OF:\n{pane}"
    );
    let worker_row = lines
        .iter()
        .find(|l| l.get(10..25).is_some_and(|n| n.trim() == "w1"))
        .expect("the worker's row");
    assert!(worker_row.contains(" host "), "{pane}");
    assert!(pane.contains("keys: q quit"), "{pane}");

    top.keys("p");
    top.wait_for(Duration::from_secs(10), "PAUSED", |p| {
        p.lines().next().is_some_and(|l| l.contains("PAUSED"))
    });
    top.keys("f");
    top.wait_for(Duration::from_secs(10), "worker filter", |p| {
        p.lines().next().is_some_and(|l| l.contains("worker w1"))
    });
    top.keys("q");
    let deadline = Instant::now() + Duration::from_secs(10);
    while top.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!top.alive(), "q did not end memwatch top");

    // Piped: plain lines, one screen per refresh.
    let out = run_bounded(
        "memwatch top --iterations 2",
        Command::new(&memwatch)
            .args([
                "top",
                "--iterations",
                "2",
                "--interval-ms",
                "200",
                "--socket",
            ])
            .arg(&socket),
        Duration::from_secs(30),
    );
    let plain = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(plain.matches("memwatch top - ").count(), 2, "{plain}");
    assert!(
        !plain.contains('\u{1b}'),
        "no escape sequences when piped: {plain:?}"
    );

    // exec ends with its child (killed at its cap, ~26 s in) and removes
    // the task's cgroup: wait for it, bounded, so the worker's cgroup can go.
    let deadline = Instant::now() + Duration::from_secs(120);
    while leak.try_wait().expect("wait for exec").is_none() {
        if Instant::now() > deadline {
            let _ = leak.kill();
            panic!("memwatch exec did not end within 120 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
