//! memwatch with a real one-host Slurm cluster (slurmctld + slurmd n1, n2):
//! a job OOM-killed on n1 is requeued and completes on n2 at once, and a
//! task only named after a running job, or a user's own `job_<N>` cgroup,
//! requeues nothing; a node whose
//! worker is unhealthy is drained with memwatch's reason and resumed after
//! recovery; a job's step is signalled (and its node drained) seconds
//! before its predicted OOM kill. Root only; never skipped in CI.
//!
//! Longer than 600 lines: the tests share the cluster fixture and the
//! agent set-ups at the top (`sink_config`, `requeueing_agent`, …) and run
//! one cluster at a time (`SERIAL`); split by subject (requeue, drain,
//! signal), each part would be a binary of its own. Left for a harness
//! binary that holds them all.

use std::{
    fs,
    os::unix::{
        fs::{MetadataExt as _, PermissionsExt as _},
        process::ExitStatusExt as _,
    },
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use memwatch::{Event, EventKind};
use memwatch_test_support::{
    memhog::{RATE_ENV, SIGNAL_FILE_ENV, printed},
    wait::wait_until_every,
};
use memwatch_tests::{
    agent::Agent,
    cgroup::TestCgroup,
    kernel_tests_enabled, memhog_in,
    process::{Guarded, combined_output, run_bounded},
    slurm::{SlurmCluster, slurm_available},
    workspace_bin,
};

const MIB: u64 = 1 << 20;

/// Clusters run one at a time: two cores, shared.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn setup(test: &str) -> bool {
    kernel_tests_enabled(test) && slurm_available(test)
}

fn sink_config(cluster: &SlurmCluster, extra: &str) -> String {
    format!(
        "[[slurm]]\nscontrol = \"{}\"\nretry_initial = \"200ms\"\nretry_max = \"2s\"\n{extra}",
        cluster.scontrol_wrapper().display()
    )
}

/// An agent whose Slurm sink requeues onto another node. Its host is n1
/// (both slurmd run on this machine: `nodes` says which one answers
/// `scontrol pidinfo`, as the one slurmd of a host would).
async fn requeueing_agent(cluster: &SlurmCluster) -> Agent {
    requeueing_agent_with(cluster, "", "nodes = { host = \"n1\" }\n").await
}

/// [`requeueing_agent`] with `config` (workers, rules) before its sink
/// and `sink` (its `nodes`, and more keys) in it.
async fn requeueing_agent_with(cluster: &SlurmCluster, config: &str, sink: &str) -> Agent {
    Agent::start_with_config(&format!(
        "{config}{}",
        sink_config(cluster, &format!("requeue = \"other_node\"\n{sink}"))
    ))
    .await
}

/// How often a wait looks: each look runs a Slurm command.
const SLURM_POLL: Duration = Duration::from_millis(50);
/// Time for one command of a test (`id`, `useradd`, a `mkdir` as a user).
const COMMAND_WAIT: Duration = Duration::from_secs(20);

fn state_of(cluster: &SlurmCluster, node: &str) -> String {
    cluster
        .node_states()
        .into_iter()
        .find(|(n, _)| n == node)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

#[tokio::test]
async fn slurm_oom_killed_job_is_requeued_and_completes_on_the_other_node() {
    const TEST: &str = "slurm_oom_killed_job_is_requeued_and_completes_on_the_other_node";
    if !setup(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster = SlurmCluster::start();

    // Without memwatch: a job killed on n1 stays failed; Slurm does not rerun it.
    let killed = cluster.dir.path().join("killed.sh");
    fs::write(&killed, "#!/bin/sh\nkill -KILL $$\n").unwrap();
    let baseline = cluster.sbatch(&killed);
    wait_until_every(
        "the baseline job ends",
        Duration::from_secs(30),
        SLURM_POLL,
        || cluster.job(baseline)["JobState"] == "FAILED",
    );
    std::thread::sleep(Duration::from_secs(3));
    let job = cluster.job(baseline);
    assert_eq!(
        (job["JobState"].as_str(), job["Restarts"].as_str()),
        ("FAILED", "0")
    );
    println!(
        "without memwatch: a job killed on {} stays FAILED, not rerun",
        job["NodeList"]
    );

    let agent = requeueing_agent(&cluster).await;
    // n1 is the small node: the job's task gets 64 MiB there and needs 100.
    let script = cluster.dir.path().join("job.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"node $SLURMD_NODENAME job $SLURM_JOB_ID\"\n\
             if [ \"$SLURMD_NODENAME\" = n1 ]; then cap=64M; else cap=512M; fi\n\
             exec {} exec --socket {} --hard-cap $cap -- {} 100 1\n",
            workspace_bin("memwatch").display(),
            agent.socket().display(),
            workspace_bin("memhog").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let id = cluster.sbatch(&script);
    let prefix = format!("slurm-{id}-");
    let kill = agent
        .wait_for_event(Duration::from_secs(60), "oom_kill of the job's task", |e| {
            e.body.kind == EventKind::OomKill
                && e.body
                    .task_id
                    .as_deref()
                    .is_some_and(|t| t.starts_with(&prefix))
        })
        .await;
    let seen = Instant::now();
    // The requeue's proof: Slurm placed exec (the socket's peer) in the job.
    let log = agent.log_text();
    assert!(
        log.contains(&format!("job={id}")) && log.contains("belongs to this job"),
        "Slurm asked which job exec's process is in: {log}"
    );
    let took = wait_until_every(
        "the requeued job completes",
        Duration::from_secs(60),
        SLURM_POLL,
        || cluster.job(id)["JobState"] == "COMPLETED",
    );
    let job = cluster.job(id);
    assert_eq!(job["NodeList"], "n2", "{job:?}");
    assert_eq!(job["ExcNodeList"], "n1", "{job:?}");
    assert_eq!(job["Restarts"], "1", "{job:?}");
    let output = fs::read_to_string(cluster.dir.path().join(format!("job-{id}.out"))).unwrap();
    assert!(output.contains("node n2"), "{output}");
    let since_kill = (chrono::Utc::now() - kill.time)
        .to_std()
        .unwrap_or_default();
    println!(
        "with memwatch: job {id} OOM-killed on n1 (pid {:?}, at {}), requeued and COMPLETED on n2 {took:?} after the oom_kill event was read ({since_kill:?} after the kill); Slurm alone: stays FAILED, and a plain requeue waits ~140 s (MACHINE-NOTES)",
        kill.body.pid,
        kill.time.format("%H:%M:%S%.3f")
    );
    assert!(seen.elapsed() >= took);
    // Why it took that long: the sink's retries, as the agent logged them.
    for line in agent
        .log_text()
        .lines()
        .filter(|l| l.contains("will retry") || l.contains("refused") || l.contains("requeued"))
    {
        println!("agent: {line}");
    }
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics.contains("memwatch_scheduler_actions_total{action=\"requeue\",sink=\"slurm-1\"} 1"),
        "{metrics}"
    );
}

/// A process outside a running job claims it: `memwatch exec` with a
/// spoofed `SLURM_JOB_ID` (so its task is named `slurm-<J>-…`), over the
/// local socket, OOM-killed. Slurm never placed that process in job J
/// (`scontrol pidinfo` says so), so J is not requeued: it keeps running,
/// never restarted, and the skip is said in an `action_skipped` event.
#[tokio::test]
async fn slurm_a_task_only_named_after_a_running_job_requeues_nothing() {
    const TEST: &str = "slurm_a_task_only_named_after_a_running_job_requeues_nothing";
    if !setup(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster = SlurmCluster::start();
    let agent = requeueing_agent(&cluster).await;
    let script = cluster.dir.path().join("sleeper.sh");
    fs::write(
        &script,
        "#!/bin/sh
#SBATCH --requeue
sleep 120
",
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let job = cluster.sbatch(&script);
    wait_until_every("the job runs", Duration::from_secs(30), SLURM_POLL, || {
        cluster.job(job)["JobState"] == "RUNNING"
    });

    let out = std::process::Command::new(workspace_bin("memwatch"))
        .args(["exec", "--socket"])
        .arg(agent.socket())
        .args(["--hard-cap", "64M", "--"])
        .arg(workspace_bin("memhog"))
        .args(["100", "1"])
        .env("SLURM_JOB_ID", job.to_string())
        .env_remove("MEMWATCH_TOKEN")
        .env_remove("MEMWATCH_AGENT")
        .output()
        .expect("run memwatch exec");
    assert_ne!(out.status.code(), Some(0), "the hog was OOM-killed");
    let prefix = format!("slurm-{job}-");
    agent
        .wait_for_event(Duration::from_secs(30), "oom_kill of the named task", |e| {
            e.body.kind == EventKind::OomKill
                && e.body
                    .task_id
                    .as_deref()
                    .is_some_and(|t| t.starts_with(&prefix))
        })
        .await;
    let skipped = agent
        .wait_for_event(Duration::from_secs(30), "the requeue skipped", |e| {
            e.body.kind == EventKind::ActionSkipped
                && e.body
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(&format!("job {job} not requeued")))
        })
        .await;
    let reason = skipped.body.reason.unwrap_or_default();
    assert!(reason.contains("Slurm never said"), "{reason}");
    // Time for a wrong requeue to have shown, had one been made.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = cluster.job(job);
    assert_eq!(
        (now["JobState"].as_str(), now["Restarts"].as_str()),
        ("RUNNING", "0"),
        "{now:?}\n{}",
        agent.log_text()
    );
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        !metrics.contains("action=\"requeue\""),
        "no requeue counted: {metrics}"
    );
    println!(
        "a spoofed slurm-{job} task OOM-killed: job {job} still RUNNING, 0 restarts; {reason}"
    );
    cluster.run("scancel", &[&job.to_string()]);
}

/// The unprivileged local user the user-made cgroup tests run as: made
/// (a system user, no home, no shell) when missing. Its uid and gid.
fn attacker() -> (u32, u32) {
    const USER: &str = "memwatch-attacker";
    let id = |flag: &str| -> Option<u32> {
        let out = run_bounded("id", Command::new("id").args([flag, USER]), COMMAND_WAIT);
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if id("-u").is_none() {
        let out = run_bounded(
            "useradd",
            Command::new("useradd").args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ]),
            COMMAND_WAIT,
        );
        // Another run may have made it in the meantime: only its absence counts.
        assert!(
            id("-u").is_some(),
            "useradd {USER}: {}",
            combined_output(&out)
        );
    }
    let (uid, gid) = (id("-u"), id("-g"));
    let (Some(uid), Some(gid)) = (uid, gid) else {
        panic!("no uid or gid for {USER}");
    };
    assert_ne!(uid, 0, "{USER} is root");
    (uid, gid)
}

/// A local user with cgroups of their own: theirs to make cgroups in and
/// move their processes between (v2 asks both of the common ancestor).
struct User {
    uid: u32,
    gid: u32,
    /// memhog, copied where the user may run it.
    memhog: PathBuf,
    _bin: tempfile::TempDir,
}

impl User {
    fn new() -> User {
        let (uid, gid) = attacker();
        let bin = tempfile::tempdir().unwrap();
        fs::set_permissions(bin.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let memhog = bin.path().join("memhog");
        fs::copy(workspace_bin("memhog"), &memhog).unwrap();
        User {
            uid,
            gid,
            memhog,
            _bin: bin,
        }
    }

    /// Hands `cgroup` (the directory and its `cgroup.procs`) to the user.
    fn delegate(&self, cgroup: &TestCgroup) {
        for path in [
            cgroup.path().to_path_buf(),
            cgroup.path().join("cgroup.procs"),
        ] {
            std::os::unix::fs::chown(&path, Some(self.uid), Some(self.gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        }
    }

    /// `setpriv … -- sh -c 'line'` as the user: no root, no groups.
    fn shell(&self, line: &str) -> String {
        format!(
            "setpriv --reuid={} --regid={} --clear-groups -- sh -c '{line}'",
            self.uid, self.gid
        )
    }

    /// Makes the cgroup `dir` as the user (removed on drop).
    fn mkdir(&self, dir: &std::path::Path) -> MadeCgroup {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(self.shell(&format!("mkdir {}", dir.display())));
        let made = run_bounded("mkdir as the user", &mut cmd, COMMAND_WAIT);
        assert!(made.status.success(), "{}", combined_output(&made));
        assert_eq!(fs::metadata(dir).unwrap().uid(), self.uid, "the user's own");
        MadeCgroup(dir.to_path_buf())
    }

    /// The user's memhog of 100 MiB in `dir`, started from `login` (root
    /// puts the shell there, the user moves it on): it is killed (SIGKILL).
    fn hog_killed(&self, login: &TestCgroup, dir: &std::path::Path) {
        let inner = format!(
            "echo $$ > {}/cgroup.procs && exec {} 100 1",
            dir.display(),
            self.memhog.display()
        );
        let mut hog = Command::new("sh");
        hog.arg("-c").arg(login.exec_line(&self.shell(&inner)));
        let out = run_bounded("the user's hog", &mut hog, Duration::from_secs(60));
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "the hog was OOM-killed: {}",
            combined_output(&out)
        );
    }
}

/// A cgroup someone else made, removed (its processes killed) on drop.
struct MadeCgroup(PathBuf);

impl Drop for MadeCgroup {
    fn drop(&mut self) {
        let _ = memwatch::kill_and_remove(&self.0);
    }
}

/// Submits a job that sleeps 120 s and waits until it runs; its id.
fn running_sleeper(cluster: &SlurmCluster) -> u64 {
    let script = cluster.dir.path().join("sleeper.sh");
    fs::write(&script, "#!/bin/sh\nsleep 120\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let job = cluster.sbatch(&script);
    wait_until_every("the job runs", Duration::from_secs(30), SLURM_POLL, || {
        cluster.job(job)["JobState"] == "RUNNING"
    });
    job
}

/// The rule's task of the cgroup `dir`, named `<parent>/<dir>`, once the
/// agent has it (so that the kill there is the task's).
async fn rule_task(agent: &Agent, dir: &std::path::Path) -> String {
    let name = |p: &std::path::Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let task = format!("{}/{}", name(dir.parent().unwrap()), name(dir));
    agent
        .wait_for_event(Duration::from_secs(10), "the rule's task_started", |e| {
            e.body.kind == EventKind::TaskStarted && e.body.task_id.as_deref() == Some(&*task)
        })
        .await;
    task
}

/// The `oom_kill` of `cgroup` (the rule's `task`) and the Slurm sink's
/// `action_skipped` for `job` naming it: the skip's reason.
async fn skipped_for(agent: &Agent, cgroup: &str, task: &str, job: u64) -> (Event, String) {
    let kill = agent
        .wait_for_event(Duration::from_secs(30), "oom_kill in job_<J>", |e| {
            e.body.kind == EventKind::OomKill && e.body.cgroup.as_deref() == Some(cgroup)
        })
        .await;
    assert_eq!(kill.body.task_id.as_deref(), Some(task), "{kill:?}");
    let skipped = agent
        .wait_for_event(Duration::from_secs(30), "the requeue skipped", |e| {
            e.body.kind == EventKind::ActionSkipped
                && e.body.reason.as_deref().is_some_and(|r| {
                    r.starts_with(&format!("job {job} not requeued")) && r.contains(cgroup)
                })
        })
        .await;
    (kill, skipped.body.reason.unwrap_or_default())
}

/// `job` still runs, never restarted, some seconds on (time for a wrong
/// requeue to have shown, had one been made).
async fn still_running(cluster: &SlurmCluster, agent: &Agent, job: u64) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = cluster.job(job);
    assert_eq!(
        (now["JobState"].as_str(), now["Restarts"].as_str()),
        ("RUNNING", "0"),
        "{now:?}\n{}",
        agent.log_text()
    );
}

/// A local user (a real uid, no privilege) with a delegated memory cgroup
/// of its own, outside Slurm's (chowned to it; 64 MiB, set by root), makes
/// `job_<J>` in it, named after a running job J, and runs a memory hog
/// there, OOM-killed by that limit. The agent watches the cgroup (a
/// `[[rule]]` on `job_*`, as slurm.md sets one up for Slurm's) and sees the
/// kill in `…/job_<J>`: J is not requeued (it keeps running, 0 restarts,
/// no requeue counted) and the `action_skipped` event says why (not
/// Slurm's own cgroup, naming `cgroup_roots`). The legitimate requeue
/// (Slurm's proof of exec's process) is
/// `slurm_oom_killed_job_is_requeued_and_completes_on_the_other_node`.
#[tokio::test]
async fn slurm_a_users_own_job_cgroup_named_after_a_running_job_requeues_nothing() {
    const TEST: &str = "slurm_a_users_own_job_cgroup_named_after_a_running_job_requeues_nothing";
    if !setup(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let user = User::new();
    let cluster = SlurmCluster::start();
    let delegated = TestCgroup::create("slurm-delegated");
    delegated.limit(64 * MIB);
    let login = delegated.child("login");
    user.delegate(&delegated);
    user.delegate(&login);
    let agent = requeueing_agent_with(
        &cluster,
        &format!(
            "[[worker]]\nname = \"users\"\ncgroup = \"{0}\"\n\
             [[rule]]\nworker = \"users\"\ncgroup = \"{0}/job_*\"\n",
            delegated.path_str()
        ),
        "nodes = { users = \"n1\" }\n",
    )
    .await;
    let job = running_sleeper(&cluster);

    let job_dir = delegated.path().join(format!("job_{job}"));
    let _made = user.mkdir(&job_dir);
    let task = rule_task(&agent, &job_dir).await;
    user.hog_killed(&login, &job_dir);
    let cgroup = job_dir.display().to_string();
    let (kill, reason) = skipped_for(&agent, &cgroup, &task, job).await;
    assert!(
        reason.contains(&format!(
            "not Slurm's own cgroup: its cgroup {cgroup} is not where Slurm keeps job {job} \
             (cgroup_roots: /sys/fs/cgroup/memory/slurm, /sys/fs/cgroup/system.slice/slurmstepd.scope)"
        )),
        "{reason}"
    );
    still_running(&cluster, &agent, job).await;
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        !metrics.contains("action=\"requeue\""),
        "no requeue counted: {metrics}"
    );
    assert!(
        metrics.contains("memwatch_scheduler_actions_total{action=\"skipped\",sink=\"slurm-1\"}"),
        "{metrics}"
    );
    println!(
        "uid {}'s own cgroup {cgroup} OOM-killed (pid {:?}): job {job} still RUNNING, 0 restarts; {reason}",
        user.uid, kill.body.pid
    );
    cluster.run("scancel", &[&job.to_string()]);
}

#[tokio::test]
async fn slurm_unhealthy_node_is_drained_with_its_reason_and_resumed_after_recovery() {
    const TEST: &str = "slurm_unhealthy_node_is_drained_with_its_reason_and_resumed_after_recovery";
    if !setup(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster = SlurmCluster::start();
    let worker = TestCgroup::create("slurm-n1");
    let hog = |cg: &TestCgroup| {
        Guarded(
            memhog_in(cg.path(), 200, 120)
                .spawn()
                .expect("spawn memhog"),
        )
    };

    // Without memwatch: Slurm keeps n1 open for work whatever its memory.
    let leftover = hog(&worker);
    wait_until_every(
        "memhog holds its memory",
        Duration::from_secs(20),
        SLURM_POLL,
        || worker.usage() > 150 * MIB,
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(state_of(&cluster, "n1"), "idle");
    println!("without memwatch: n1 stays idle (open for jobs) with 200 MiB of leftover memory");
    drop(leftover);

    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"200ms\"\n\
         [[worker]]\nname = \"n1w\"\ncgroup = \"{}\"\nsoft_cap = \"100MiB\"\nunhealthy_after = \"2s\"\nrecover_after = \"2s\"\n{}",
        worker.path_str(),
        sink_config(&cluster, "nodes = { n1w = \"n1\" }\n")
    ))
    .await;
    let leftover = hog(&worker);
    wait_until_every(
        "memhog crosses the cap",
        Duration::from_secs(20),
        SLURM_POLL,
        || worker.usage() > 100 * MIB,
    );
    let drained = wait_until_every("n1 is drained", Duration::from_secs(30), SLURM_POLL, || {
        state_of(&cluster, "n1").starts_with("drain")
    });
    let reasons = cluster.drain_reasons();
    assert!(
        reasons.contains("n1|memwatch: worker n1w unhealthy"),
        "sinfo -R:\n{reasons}"
    );
    assert_eq!(state_of(&cluster, "n2"), "idle");
    // Pull model: a health check polling the agent gets the same verdict.
    let (code, health) = agent.get("/health?worker=n1w").await;
    assert_eq!(code, 503, "{health}");
    assert!(health.contains("unmanaged memory"), "{health}");
    println!(
        "with memwatch: n1 drained {drained:?} after crossing its cap (unhealthy_after = 2s); sinfo -R: {}",
        reasons.trim()
    );

    drop(leftover);
    let resumed = wait_until_every("n1 is resumed", Duration::from_secs(30), SLURM_POLL, || {
        state_of(&cluster, "n1") == "idle"
    });
    println!("n1 resumed {resumed:?} after the memory was freed (recover_after = 2s)");
    assert!(cluster.drain_reasons().trim().is_empty());
    let (code, health) = agent.get("/health?worker=n1w").await;
    assert_eq!(code, 200, "{health}");
    let events = agent.events(0).await;
    let kinds: Vec<EventKind> = events.iter().map(|e| e.body.kind).collect();
    assert!(
        kinds.contains(&EventKind::WorkerUnhealthy) && kinds.contains(&EventKind::WorkerRecovered)
    );
    let (_, metrics) = agent.get("/metrics").await;
    for action in ["drain", "resume"] {
        assert!(
            metrics.contains(&format!(
                "memwatch_scheduler_actions_total{{action=\"{action}\",sink=\"slurm-1\"}} 1"
            )),
            "{metrics}"
        );
    }
}

/// Two hosts (two agents, own state directories, node names and ports; one
/// worker each, on n1 and n2 of one partition) whose workers turn unhealthy
/// in the same moment: the cluster guard (one node of two must stay open)
/// leaves exactly one node drained (the first to drain; n1, the lowest name,
/// when both drained in the same moment), the other host's agent says why
/// its node stays open, and the partition is below its floor for no longer
/// than one re-check (2 s) and a poll.
#[tokio::test]
async fn slurm_two_hosts_never_drain_the_whole_partition() {
    const TEST: &str = "slurm_two_hosts_never_drain_the_whole_partition";
    if !setup(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster = SlurmCluster::start();
    let workers = [
        TestCgroup::create("slurm-two-n1"),
        TestCgroup::create("slurm-two-n2"),
    ];
    let mut agents = Vec::new();
    for (node, worker) in ["n1", "n2"].iter().zip(&workers) {
        agents.push(
            Agent::start_with_config(&format!(
                "sample_interval = \"100ms\"\nheartbeat_interval = \"2s\"\n\
                 [[worker]]\nname = \"{node}w\"\ncgroup = \"{}\"\nsoft_cap = \"100MiB\"\n\
                 unhealthy_after = \"2s\"\nrecover_after = \"2s\"\n{}",
                worker.path_str(),
                sink_config(&cluster, &format!("nodes = {{ {node}w = \"{node}\" }}\n"))
            ))
            .await,
        );
    }
    // Both leak at once.
    let _hogs: Vec<Guarded> = workers
        .iter()
        .map(|w| Guarded(memhog_in(w.path(), 200, 60).spawn().expect("spawn memhog")))
        .collect();
    // Watch the partition for 15 s: how long were both nodes drained?
    let start = Instant::now();
    let mut both_since: Option<Instant> = None;
    let mut longest_both = Duration::ZERO;
    let mut first_drain: Option<Duration> = None;
    while start.elapsed() < Duration::from_secs(15) {
        let drained: Vec<String> = cluster
            .node_states()
            .into_iter()
            .filter(|(_, s)| s.starts_with("drain"))
            .map(|(n, _)| n)
            .collect();
        if !drained.is_empty() && first_drain.is_none() {
            first_drain = Some(start.elapsed());
        }
        match (drained.len(), both_since) {
            (2, None) => both_since = Some(Instant::now()),
            (2, Some(since)) => longest_both = longest_both.max(since.elapsed()),
            (_, Some(_)) => both_since = None,
            _ => {}
        }
        std::thread::sleep(SLURM_POLL);
    }
    let states = cluster.node_states();
    let log = |i: usize| agents[i].log_text();
    assert!(
        first_drain.is_some(),
        "no node drained: {states:?}\n{}",
        log(0)
    );
    let drained: Vec<&str> = states
        .iter()
        .filter(|(_, s)| s.starts_with("drain"))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        drained.len(),
        1,
        "exactly one node drained: {states:?}\n{}\n{}",
        log(0),
        log(1)
    );
    let open = usize::from(drained == ["n1"]);
    assert!(
        longest_both <= Duration::from_secs(4),
        "both nodes drained for {longest_both:?}"
    );
    // The agent of the node left open said why.
    let held = agents[open]
        .wait_for_event(Duration::from_secs(10), "guard_blocked", |e| {
            e.body.kind == EventKind::GuardBlocked
        })
        .await;
    println!(
        "two hosts, both workers unhealthy at once: {} drained {:?} after the leak started; both \
         nodes drained for at most {longest_both:?}; the other agent: {}",
        drained[0],
        first_drain.unwrap_or_default(),
        held.body.reason.unwrap_or_default()
    );
}

/// Slurm's controller down while a worker turns unhealthy and recovers:
/// the drain memwatch could not make while it was down is not made when it
/// comes back (the worker is healthy by then): nothing is drained, and the
/// agent says why (`action_skipped`). The outage lasts as long as the
/// episode needs here (~10 s), not a minute: the sink retries the same
/// batch with backoff (capped at 2 s in this test) whatever the length.
#[tokio::test]
async fn slurm_down_while_a_worker_is_unhealthy_then_recovers_drains_nothing() {
    const TEST: &str = "slurm_down_while_a_worker_is_unhealthy_then_recovers_drains_nothing";
    if !setup(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let mut cluster = SlurmCluster::start();
    let worker = TestCgroup::create("slurm-down-n1");
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"200ms\"\n\
         [[worker]]\nname = \"n1w\"\ncgroup = \"{}\"\nsoft_cap = \"100MiB\"\nunhealthy_after = \"2s\"\nrecover_after = \"2s\"\n{}",
        worker.path_str(),
        sink_config(&cluster, "nodes = { n1w = \"n1\" }\n")
    ))
    .await;
    let down = Instant::now();
    cluster.stop_controller();
    assert!(
        cluster.node_states().is_empty(),
        "the controller still answers after it was stopped"
    );

    let hog = Guarded(
        memhog_in(worker.path(), 200, 120)
            .spawn()
            .expect("spawn memhog"),
    );
    agent
        .wait_for_event(Duration::from_secs(30), "worker_unhealthy", |e| {
            e.body.kind == EventKind::WorkerUnhealthy
        })
        .await;
    drop(hog);
    agent
        .wait_for_event(Duration::from_secs(30), "worker_recovered", |e| {
            e.body.kind == EventKind::WorkerRecovered
        })
        .await;
    let outage = down.elapsed();
    cluster.start_controller();

    // The sink's retries reach Slurm again (2 s apart at most): watch n1.
    let back = Instant::now();
    let skipped = loop {
        // Every page: the outage's events (samples above the cap, retries
        // said) may be more than one page of /v1/events.
        let events = agent.all_events().await;
        if let Some(e) = events
            .into_iter()
            .find(|e| e.body.kind == EventKind::ActionSkipped)
        {
            break e;
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "no action_skipped within 30 s of Slurm coming back; agent log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(6) {
        let state = state_of(&cluster, "n1");
        assert!(
            !state.starts_with("drain"),
            "n1 drained after the outage: {state}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cluster.drain_reasons().trim().is_empty());
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        !metrics.contains("memwatch_scheduler_actions_total{action=\"drain\""),
        "{metrics}"
    );
    println!(
        "Slurm down {outage:?} while n1w turned unhealthy and recovered: nothing drained when it came back; {}",
        skipped.body.reason.unwrap_or_default()
    );
}

/// A job's step leaks ~10 MiB/s under a 256 MiB hard cap on n1 (`memwatch
/// exec` inside `srun`): on the agent's `oom_imminent` the Slurm sink sends
/// SIGUSR1 to the job's steps (`scancel --signal`) and drains n1 naming the
/// predicted kill; the step's handler runs seconds before the real OOM
/// kill (both times from the step's CLOCK_MONOTONIC); the kill ends the
/// episode (n1 resumed) and the job, killed anyway, is requeued and
/// completes on n2 as before.
#[tokio::test]
async fn slurm_a_jobs_step_is_signalled_seconds_before_its_predicted_kill() {
    const TEST: &str = "slurm_a_jobs_step_is_signalled_seconds_before_its_predicted_kill";
    if !setup(TEST) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let cluster = SlurmCluster::start();
    let scancel = cluster.dir.path().join("scancel");
    fs::write(
        &scancel,
        format!(
            "#!/bin/sh\nSLURM_CONF={} exec scancel \"$@\"\n",
            cluster.conf().display()
        ),
    )
    .unwrap();
    fs::set_permissions(&scancel, fs::Permissions::from_mode(0o755)).unwrap();
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"1s\"\n{}",
        sink_config(
            &cluster,
            &format!(
                "requeue = \"other_node\"\nnodes = {{ host = \"n1\" }}\n\
                 imminent_signal = \"USR1\"\ndrain_imminent = true\nscancel = \"{}\"\n",
                scancel.display()
            ),
        )
    ))
    .await;
    let signals = cluster.dir.path().join("signals");
    // On n1: 400 MiB at 10 MiB/s under 256 MiB, killed after ~26 s; the
    // requeued run on n2 only says where it ran.
    let script = cluster.dir.path().join("leak.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"node $SLURMD_NODENAME job $SLURM_JOB_ID\"\n\
             [ \"$SLURMD_NODENAME\" = n1 ] || exit 0\n\
             export {rate}=10 {file}={signals}\n\
             exec srun --ntasks=1 {memwatch} exec --socket {socket} --hard-cap 256MiB -- {memhog} 400 60\n",
            rate = RATE_ENV,
            file = SIGNAL_FILE_ENV,
            signals = signals.display(),
            memwatch = workspace_bin("memwatch").display(),
            socket = agent.socket().display(),
            memhog = workspace_bin("memhog").display(),
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let id = cluster.sbatch(&script);

    // The drain names the predicted kill while it is still ahead.
    // Generous: a loaded machine only slows the leak, which widens the window.
    wait_until_every(
        "n1 drained for the predicted kill",
        Duration::from_secs(180),
        SLURM_POLL,
        || cluster.drain_reasons().contains("OOM kill is predicted"),
    );
    let reasons = cluster.drain_reasons();
    assert!(
        reasons.contains("n1|memwatch: worker host: its OOM kill is predicted in"),
        "{reasons}"
    );
    let prefix = format!("slurm-{id}-");
    let kill = agent
        .wait_for_event(
            Duration::from_secs(180),
            "oom_kill of the job's step",
            |e| {
                e.body.kind == EventKind::OomKill
                    && e.body
                        .task_id
                        .as_deref()
                        .is_some_and(|t| t.starts_with(&prefix))
            },
        )
        .await;

    // Both times are the step's CLOCK_MONOTONIC: the handler's stamp and
    // the last MiB it touched (no later than the kill, so the lead measured
    // is at most the real one).
    let lines = fs::read_to_string(&signals).unwrap_or_default();
    let handled = printed(&lines, "signal").unwrap_or_else(|| {
        panic!(
            "the step's SIGUSR1 handler never ran ({lines:?}); agent log:\n{}",
            agent.log_text()
        )
    });
    let last_touched = lines
        .lines()
        .filter_map(|l| l.strip_prefix("touched "))
        .filter_map(|n| n.trim().parse::<i64>().ok())
        .max()
        .expect("memhog touched memory");
    let lead = (last_touched - handled) as f64 / 1e9;
    println!(
        "job {id}: the step's SIGUSR1 handler ran {lead:.1} s before its last MiB touched (OOM kill of pid {:?} at {})",
        kill.body.pid,
        kill.time.format("%H:%M:%S%.3f")
    );
    assert!(
        lead >= 3.0,
        "the handler ran only {lead:.1} s before the kill"
    );

    // The kill ended the episode: n1 resumed; the job requeued onto n2.
    wait_until_every(
        "n1 resumed after the kill",
        Duration::from_secs(60),
        SLURM_POLL,
        || !state_of(&cluster, "n1").contains("drain"),
    );
    wait_until_every(
        "the requeued job completes",
        Duration::from_secs(60),
        SLURM_POLL,
        || cluster.job(id)["JobState"] == "COMPLETED",
    );
    let job = cluster.job(id);
    assert_eq!(job["NodeList"], "n2", "{job:?}");
    assert_eq!(job["Restarts"], "1", "{job:?}");
    let (_, metrics) = agent.get("/metrics").await;
    for (action, n) in [("signal", 1), ("drain", 1), ("resume", 1), ("requeue", 1)] {
        assert!(
            metrics.contains(&format!(
                "memwatch_scheduler_actions_total{{action=\"{action}\",sink=\"slurm-1\"}} {n}"
            )),
            "{action} {n}: {metrics}"
        );
    }
}
