//! Helpers for memwatch's integration tests: privilege gating, a real agent
//! process on a loopback port, and memory cgroups that clean up after
//! themselves. Those typed on memwatch's own types live here; the rest
//! (bounded waits, the webhook receiver, the agent process) in the
//! `memwatch-test-support` crate, which xtask shares.

pub mod agent;
pub mod cgroup;
pub mod dask;
pub mod ext4;
pub mod nats;
pub mod ops;
pub mod otlp;
pub mod process;
pub mod slurm;
pub mod tmpfs;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use memwatch::Event;
use memwatch_test_support::{memhog, process::cgroup_exec_line, webhook::Receiver};

/// Whether tests that need root and BPF can run here.
///
/// In CI (`CI=true`) they must: not being root there is a failure, not a
/// skip. Elsewhere they skip with the reason printed.
/// How much slower than hardware this machine runs the agent: 1, unless
/// `MEMWATCH_TEST_TIME_SCALE` says otherwise (set by `cargo xtask vm-test`
/// for VMs under software emulation only).
pub fn time_scale() -> f64 {
    std::env::var("MEMWATCH_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s >= 1.0)
        .unwrap_or(1.0)
}

pub fn kernel_tests_enabled(test: &str) -> bool {
    process::root_or_skip(test, "for BPF and cgroups; run `cargo xtask test` as root")
}

/// A binary built by this workspace (`memwatch`, `memhog`), next to the test
/// executable's directory: target/<profile>/<name>.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p memwatch --bins`, or `cargo xtask test`)",
        bin.display()
    );
    bin
}

/// Runs `memwatch exec --socket <socket> --soft-cap <cap> --task-id <task> --
/// memhog <mib> 1` with `MEMHOG_MARK_MIB=<mark>`, asserts it succeeded, and
/// returns the wall-clock time (Unix nanoseconds) memhog printed when it had
/// touched `mark` MiB.
pub fn exec_memhog_with_mark(socket: &Path, cap: &str, task: &str, mib: u32, mark: u32) -> i64 {
    exec_memhog_with_mark_and_pace(socket, cap, task, mib, mark).0
}

/// [`exec_memhog_with_mark`], and memhog's own pace before the mark
/// (nanoseconds per MiB touched): how long the workload itself takes to
/// go on from the mark to the cap on this machine (or emulator).
pub fn exec_memhog_with_mark_and_pace(
    socket: &Path,
    cap: &str,
    task: &str,
    mib: u32,
    mark: u32,
) -> (i64, i64) {
    exec_memhog_after(socket, cap, task, None, mib, mark)
}

/// [`exec_memhog_with_mark_and_pace`], the task running `sh -c
/// '<prelude>; exec memhog …'` when there is a prelude: what it leaves in
/// the task's cgroup (page cache, say) is there when memhog starts.
pub fn exec_memhog_after(
    socket: &Path,
    cap: &str,
    task: &str,
    prelude: Option<&str>,
    mib: u32,
    mark: u32,
) -> (i64, i64) {
    let memhog = workspace_bin("memhog");
    let mut command = std::process::Command::new(workspace_bin("memwatch"));
    command.args(["exec", "--socket"]).arg(socket).args([
        "--soft-cap",
        cap,
        "--task-id",
        task,
        "--",
    ]);
    match prelude {
        None => command.arg(memhog).args([mib.to_string(), "1".into()]),
        Some(prelude) => command.args([
            "sh".to_string(),
            "-c".into(),
            format!("{prelude}; exec {} {mib} 1", memhog.display()),
        ]),
    };
    let out = command
        .env(memhog::MARK_ENV, mark.to_string())
        .output()
        .expect("memwatch exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| -> i64 {
        memhog::printed(&stdout, key).unwrap_or_else(|| panic!("memhog printed no {key}: {stdout}"))
    };
    (field("mark"), field("pace"))
}

/// `sh -c` that moves itself into the cgroup at `cgroup` and execs `memhog
/// <mib> <hold_secs>` (stdout discarded): spawn it (the child's pid is
/// memhog's) or run it.
pub fn memhog_in(cgroup: &Path, mib: u64, hold_secs: u64) -> Command {
    let memhog = format!("{} {mib} {hold_secs}", workspace_bin("memhog").display());
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(cgroup_exec_line(cgroup, &memhog))
        .stdout(Stdio::null());
    command
}

/// The events a [`Receiver`] accepted, as memwatch events; panics on one
/// that is not.
pub fn received_events(receiver: &Receiver) -> Vec<Event> {
    receiver
        .events()
        .into_iter()
        .map(|(_, e)| {
            serde_json::from_value(e.clone())
                .unwrap_or_else(|err| panic!("the webhook got a non-event: {err}: {e}"))
        })
        .collect()
}

/// Milliseconds from memhog's `mark` (Unix ns) to `event`'s time stamp.
pub fn ms_after_mark(event: &Event, mark_ns: i64) -> f64 {
    let stamp = event
        .time
        .timestamp_nanos_opt()
        .expect("event time in range");
    (stamp - mark_ns) as f64 / 1e6
}

/// Asserts that `events` (as the agent lists them) have strictly
/// increasing seqs and no repeated id.
pub fn assert_seq_increasing_and_ids_unique(events: &[Event]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seq not increasing: {seqs:?}"
    );
    let ids: BTreeSet<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), events.len(), "an event id repeats");
}

/// Kills in `cgroup` as the agent reported them: how many were seen live,
/// and how many the counters recovered (each recovered event says how many
/// kills it stands for: "recovered: N OOM kill…").
pub fn kills_reported(events: &[memwatch::Event], cgroup: &str) -> (u64, u64) {
    let mut live = 0;
    let mut recovered = 0;
    for e in events.iter().filter(|e| {
        e.body.kind == memwatch::EventKind::OomKill && e.body.cgroup.as_deref() == Some(cgroup)
    }) {
        if e.body.recovered == Some(true) {
            let reason = e.body.reason.as_deref().unwrap_or("");
            let n = reason
                .strip_prefix("recovered: ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("a recovered kill says how many: {reason}"));
            recovered += n;
        } else {
            live += 1;
        }
    }
    (live, recovered)
}
