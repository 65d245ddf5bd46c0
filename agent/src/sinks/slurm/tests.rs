//! Longer than 600 lines: the Slurm sink against a fake `scontrol` (a
//! script): drain, resume, requeue, signal, state kept across restarts; one
//! fixture for all.

use std::{os::unix::fs::PermissionsExt as _, sync::Arc, time::Duration};

use chrono::Utc;

use super::{
    cgroup_proof::{
        DEFAULT_CGROUP_ROOTS,
        tests::{FakeDirs, default_roots},
    },
    *,
};
use crate::{
    model::{event::EventBody, health::Health, process::SeenProcess},
    outbox::Outbox,
    sinks::{ActionGate, guard::Guard},
    telemetry::Metrics,
};

fn held(sink: &SlurmSink) -> Vec<Event> {
    sink.recorder
        .outbox()
        .read(0, 100)
        .into_iter()
        .filter(|e| e.body.kind == EventKind::GuardBlocked)
        .collect()
}

/// A fake `scontrol` that logs its arguments and keeps node drains as files.
/// The pid the fake `scontrol pidinfo` places in job 42.
const PID_IN_JOB_42: i32 = 4242;

const FAKE: &str = r#"#!/bin/sh
dir=$(dirname "$0")
case "$1" in pidinfo) ;; *) echo "$*" >> "$dir/calls";; esac
case "$1 $2" in
"show node")
    # `show node -o`: every node, its partition from the file `partition-<node>` (main by default).
    if [ "$3" = "-o" ]; then nodes="n1 n2 n3"; else nodes=$3; fi
    for n in $nodes; do
        p=main; [ -f "$dir/partition-$n" ] && p=$(cat "$dir/partition-$n")
        if [ -f "$dir/maint-$n" ]; then echo "NodeName=$n State=IDLE+DRAIN Partitions=$p Reason=maintenance [root@x]"
        elif [ -f "$dir/drained-$n" ]; then echo "NodeName=$n State=IDLE+DRAIN Partitions=$p Reason=$(cat "$dir/drained-$n")"
        else echo "NodeName=$n State=IDLE Partitions=$p"; fi
    done; exit 0;;
"show job")
    if [ -f "$dir/requeued-$3" ]; then echo "JobId=$3 JobState=PENDING BatchHost=n1"
    else echo "JobId=$3 JobState=RUNNING BatchHost=n1 NodeList=n1"; fi; exit 0;;
"requeue "*) touch "$dir/requeued-$2"; exit 0;;
"pidinfo 4242") echo "Slurm JobId=42 ends at Unknown"; exit 0;;
"pidinfo "*) echo "slurm_pid2jobid: Process not managed by Slurm" >&2; exit 1;;
esac
# A node the controller has not heard from since it restarted.
case "$*" in *State=RESUME*)
    if [ -f "$dir/resume-refused" ]; then
        echo "slurm_update error: Invalid node state specified" >&2; exit 1
    fi;;
esac
node=""
for a in "$@"; do
    case "$a" in
    NodeName=*) node=${a#NodeName=};;
    State=DRAIN) drain=1;;
    State=RESUME) rm -f "$dir/drained-$node";;
    Reason=*) [ -n "$drain" ] && echo "${a#Reason=}" > "$dir/drained-$node";;
    esac
done
# Another host drains `race-<node>`'s node in the same moment as this drain.
if [ -n "$drain" ] && [ -f "$dir/race" ]; then
    other=$(cat "$dir/race"); rm -f "$dir/race"
    echo "memwatch: worker of $other unhealthy" > "$dir/drained-$other"
fi
"#;

/// Slurm's own cgroups of jobs 17 and 42 (root-owned, under the default
/// roots), as a fake lstat sees them.
fn slurm_made_cgroups() -> CgroupRoots {
    default_roots(
        FakeDirs::default()
            .root_owned("/sys/fs/cgroup/memory/slurm/uid_0/job_17")
            .root_owned("/sys/fs/cgroup/memory/slurm/uid_0/job_42"),
    )
}

struct Fixture {
    dir: tempfile::TempDir,
    seq: u64,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("scontrol");
        fs::write(&script, FAKE).unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        // n2 is drained by an operator.
        fs::write(dir.path().join("maint-n2"), "").unwrap();
        Fixture { dir, seq: 0 }
    }

    fn touch(&self, file: &str, text: &str) {
        fs::write(self.dir.path().join(file), text).unwrap();
    }

    /// The sink with a guard that keeps one node of the partition.
    fn sink(&self) -> SlurmSink {
        self.sink_with(Guard {
            min_remaining: 1,
            min_remaining_fraction: 0.0,
        })
    }

    fn sink_with(&self, guard: Guard) -> SlurmSink {
        self.sink_seeing(guard, Arc::new(|_| Some(Health::Unhealthy)))
    }

    /// `health`: each worker's health now, as the watchdog says it.
    fn sink_seeing(&self, guard: Guard, health: WorkerHealth) -> SlurmSink {
        let config = self.config(guard);
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let recorder = Recorder::new(Outbox::new("h", 100, metrics.clone()), metrics);
        let mut sink = SlurmSink::open(
            config,
            "host-node".into(),
            self.dir.path(),
            recorder,
            health,
        )
        .unwrap();
        sink.actions.set_settle(Duration::from_millis(1));
        sink.cgroup_roots = slurm_made_cgroups();
        sink
    }

    /// Job proofs asked of the fake `scontrol`, which places pid
    /// [`PID_IN_JOB_42`] in job 42 (its `pidinfo` calls are not logged).
    fn proofs(&self) -> JobProofs {
        JobProofs::for_sink(&self.config(Guard::default()), "host-node")
            .unwrap()
            .with_proc_root(super::jobs::fake_proc(self.dir.path(), PID_IN_JOB_42))
    }

    fn config(&self, guard: Guard) -> SlurmConfig {
        SlurmConfig {
            name: "slurm-1".into(),
            scontrol: self.dir.path().join("scontrol"),
            nodes: [("w1", "n1"), ("w2", "n2"), ("w3", "n3")]
                .into_iter()
                .map(|(w, n)| (w.to_string(), n.to_string()))
                .collect(),
            drain: true,
            requeue: RequeuePolicy::OtherNode,
            max_requeues: 1,
            cgroup_roots: DEFAULT_CGROUP_ROOTS.map(PathBuf::from).to_vec(),
            imminent: ImminentConfig::default(),
            guard,
            delivery: Delivery {
                timeout: Duration::from_secs(5),
                ..Delivery::default()
            },
        }
    }

    fn heartbeat(&mut self, unhealthy: &[&str]) -> Event {
        let workers: Vec<serde_json::Value> = ["w1", "w2", "w3"]
            .iter()
            .map(|w| {
                let status = if unhealthy.contains(w) {
                    "unhealthy"
                } else {
                    "healthy"
                };
                serde_json::json!({"name": w, "status": status})
            })
            .collect();
        self.event(EventKind::Heartbeat, "-", |b| {
            b.worker = None;
            b.state = Some(serde_json::json!({ "workers": workers }));
        })
    }

    fn event(&mut self, kind: EventKind, worker: &str, f: impl FnOnce(&mut EventBody)) -> Event {
        self.seq += 1;
        let mut body = EventBody::new(kind);
        body.worker = Some(worker.into());
        body.reason = Some("unmanaged memory".into());
        f(&mut body);
        Event {
            id: format!("e{}", self.seq),
            seq: self.seq,
            time: Utc::now(),
            host: "h".into(),
            epoch: None,
            body,
        }
    }

    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[tokio::test]
async fn drains_and_resumes_only_nodes_it_drained_across_restarts() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    let batch = [
        fx.event(EventKind::WorkerUnhealthy, "w1", |_| {}),
        // n2 was drained by an operator: left alone, never resumed.
        fx.event(EventKind::WorkerUnhealthy, "w2", |_| {}),
    ];
    sink.send(&batch).await.unwrap();
    // The same batch again (a lost acknowledgement) does nothing more.
    sink.send(&batch).await.unwrap();
    let calls = fx.calls();
    assert_eq!(
        calls,
        [
            "show node -o",
            "update NodeName=n1 State=DRAIN Reason=memwatch: worker w1 unhealthy: unmanaged memory",
            "show node -o",
            "show node -o",
        ]
    );
    drop(sink);

    // A restarted agent still knows it drained n1.
    let mut sink = fx.sink();
    let batch = [
        fx.event(EventKind::WorkerRecovered, "w2", |_| {}),
        fx.event(EventKind::WorkerRecovered, "w1", |_| {}),
    ];
    sink.send(&batch).await.unwrap();
    assert_eq!(
        fx.calls()[4..],
        ["show node n1 -o", "update NodeName=n1 State=RESUME"]
    );
    assert!(!fx.dir.path().join("drained-n1").exists());
}

#[tokio::test]
async fn an_oom_killed_job_is_requeued_elsewhere_at_once_up_to_the_limit() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    let proofs = fx.proofs();
    proofs
        .check(
            "slurm-42-977-1700000000000",
            Some("w1"),
            Some(SeenProcess::now(PID_IN_JOB_42)),
        )
        .await;
    sink.proofs = Some(proofs);
    let kill = |fx: &mut Fixture| {
        fx.event(EventKind::OomKill, "w1", |b| {
            b.task_id = Some("slurm-42-977-1700000000000".into());
        })
    };
    let first = kill(&mut fx);
    let second = kill(&mut fx);
    sink.send(&[first]).await.unwrap();
    sink.send(&[second]).await.unwrap();
    assert_eq!(
        fx.calls(),
        [
            "show job 42 -o",
            "requeue 42",
            "show job 42 -o",
            "update JobId=42 ExcNodeList=n1",
            "update JobId=42 StartTime=now",
        ],
        "requeued once (max_requeues = 1)"
    );
}

#[tokio::test]
async fn job_ids_come_from_cgroups_or_slurms_word_and_a_task_id_is_only_a_name() {
    let mut fx = Fixture::new();
    let roots = slurm_made_cgroups();
    let e = fx.event(EventKind::OomKill, "w", |b| {
        b.cgroup = Some("/sys/fs/cgroup/memory/slurm/uid_0/job_17/step_batch".into());
    });
    assert_eq!(job_id(&e, None, &roots), Some((17, None)));
    let e = fx.event(EventKind::OomKill, "w", |b| {
        b.task_id = Some("slurm-9-1-2".into())
    });
    let (job, why) = job_id(&e, None, &roots).unwrap();
    assert_eq!(job, 9);
    assert!(
        why.is_some_and(|w| w.contains("Slurm never said")),
        "named, not proven"
    );
    let proofs = fx.proofs();
    proofs
        .check(
            "slurm-9-1-2",
            Some("w1"),
            Some(SeenProcess::now(PID_IN_JOB_42)),
        )
        .await;
    assert_eq!(
        job_id(&e, Some(&proofs), &roots),
        Some((42, None)),
        "the job Slurm placed the process in, whatever the name says"
    );
    let e = fx.event(EventKind::OomKill, "w", |b| {
        b.task_id = Some("exec-9-1".into())
    });
    assert_eq!(job_id(&e, Some(&proofs), &roots), None);
    // A `job_17` a user made outside Slurm's roots: only a name.
    let e = fx.event(EventKind::OomKill, "w", |b| {
        b.cgroup = Some("/sys/fs/cgroup/memory/user/job_17".into());
    });
    let (job, why) = job_id(&e, None, &roots).unwrap();
    assert_eq!(job, 17);
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("not Slurm's own cgroup")),
        "{why:?}"
    );
}

/// A user-made `job_42` cgroup (outside Slurm's roots, or under one but
/// owned by the user) OOM-killed: nothing is asked of Slurm, and the skip
/// says why.
#[tokio::test]
async fn a_kill_in_a_user_made_job_cgroup_requeues_nothing() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    let dirs = FakeDirs::default()
        .root_owned("/sys/fs/cgroup/memory/slurm/uid_1000/job_42")
        .root_owned("/sys/fs/cgroup/memory/user/job_42");
    dirs.set(
        Path::new("/sys/fs/cgroup/memory/slurm/uid_1000/job_42"),
        1000,
        true,
    );
    sink.cgroup_roots = default_roots(dirs);
    let outside = fx.event(EventKind::OomKill, "w1", |b| {
        b.cgroup = Some("/sys/fs/cgroup/memory/user/job_42".into());
    });
    let user_owned = fx.event(EventKind::OomKill, "w1", |b| {
        b.cgroup = Some("/sys/fs/cgroup/memory/slurm/uid_1000/job_42/step_0".into());
    });
    sink.send(&[outside, user_owned]).await.unwrap();
    assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    let reasons: Vec<String> = of_kind(&sink, EventKind::ActionSkipped)
        .into_iter()
        .filter_map(|e| e.body.reason)
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[0].starts_with("job 42 not requeued: not Slurm's own cgroup")
            && reasons[0].contains("not where Slurm keeps job 42"),
        "{reasons:?}"
    );
    assert!(reasons[1].contains("owned by uid 1000"), "{reasons:?}");
    let actions = &sink.recorder.metrics().scheduler_actions;
    assert_eq!(actions.with_label_values(&["slurm-1", "requeue"]).get(), 0);
    assert_eq!(actions.with_label_values(&["slurm-1", "skipped"]).get(), 2);
}

/// A kill in a cgroup that is not a job's, of a task whose id says
/// `slurm-42-…` but whose process Slurm never placed in job 42 (registered
/// over HTTP, or by a process outside the job): nothing is asked of
/// Slurm, and the skip is said.
#[tokio::test]
async fn a_kill_of_a_task_only_named_after_a_job_requeues_nothing() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    sink.proofs = Some(fx.proofs());
    let named = fx.event(EventKind::OomKill, "w1", |b| {
        b.task_id = Some("slurm-42-977-1700000000000".into());
        b.cgroup = Some("/sys/fs/cgroup/memory/memwatch/w1/exec-1".into());
    });
    sink.send(&[named]).await.unwrap();
    assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    let skipped = of_kind(&sink, EventKind::ActionSkipped);
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0]
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("Slurm never said"),
        "{skipped:?}"
    );
}

#[tokio::test]
async fn the_guard_keeps_a_node_open_and_drains_once_the_partition_can_spare_it() {
    let mut fx = Fixture::new();
    // Half of the partition must stay open: with n2 drained by an operator,
    // n1 and n3 are what is left of three.
    let mut sink = fx.sink_with(Guard::default());
    let unhealthy = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[unhealthy]).await.unwrap();
    assert_eq!(fx.calls(), ["show node -o"], "not drained");
    let blocked = held(&sink);
    assert_eq!(blocked.len(), 1);
    let reason = blocked[0].body.reason.clone().unwrap();
    assert!(reason.contains("would leave 1 of 3"), "{reason}");
    assert_eq!(blocked[0].body.scheduler_worker.as_deref(), Some("n1"));

    // Still blocked at the next heartbeat: looked again, said once.
    let beat = fx.heartbeat(&["w1"]);
    sink.send(&[beat]).await.unwrap();
    assert_eq!(fx.calls(), ["show node -o", "show node -o"]);
    assert_eq!(held(&sink).len(), 1);

    // The operator resumed n2: the next heartbeat drains n1.
    fs::remove_file(fx.dir.path().join("maint-n2")).unwrap();
    let beat = fx.heartbeat(&["w1"]);
    sink.send(&[beat]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());

    // A worker no longer unhealthy is let go without a drain.
    let mut sink = fx.sink_with(Guard::default());
    fx.touch("maint-n2", "");
    let w3 = fx.event(EventKind::WorkerUnhealthy, "w3", |_| {});
    sink.send(&[w3]).await.unwrap();
    let beat = fx.heartbeat(&[]);
    sink.send(&[beat]).await.unwrap();
    assert!(!sink.actions.has_pending());
}

#[tokio::test]
async fn concurrent_drains_that_cross_the_floor_keep_only_the_lowest_named_node() {
    let mut fx = Fixture::new();
    // n1 and n3 alone in their partition; one must stay open.
    fs::remove_file(fx.dir.path().join("maint-n2")).unwrap();
    fx.touch("partition-n2", "other");
    let mut sink = fx.sink();
    // This agent drains n3 while another host's agent drains n1.
    fx.touch("race", "n1");
    let unhealthy = fx.event(EventKind::WorkerUnhealthy, "w3", |_| {});
    sink.send(&[unhealthy]).await.unwrap();
    assert!(
        fx.dir.path().join("drained-n1").exists(),
        "n1 keeps its drain"
    );
    assert!(
        !fx.dir.path().join("drained-n3").exists(),
        "n3 resumed: {:?}",
        fx.calls()
    );
    assert_eq!(
        fx.calls().last().map(String::as_str),
        Some("update NodeName=n3 State=RESUME")
    );
    let blocked = held(&sink);
    assert_eq!(blocked.len(), 1);
    assert!(
        blocked[0]
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("n1 keeps its drain"),
        "{blocked:?}"
    );
    assert!(sink.actions.is_pending("w3"), "tried again later");

    // The other way round, the lowest name is ours: kept.
    let mut fx = Fixture::new();
    fs::remove_file(fx.dir.path().join("maint-n2")).unwrap();
    fx.touch("partition-n2", "other");
    let mut sink = fx.sink();
    fx.touch("race", "n3");
    let unhealthy = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[unhealthy]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());
    assert!(held(&sink).is_empty());
}

fn of_kind(sink: &SlurmSink, kind: EventKind) -> Vec<Event> {
    sink.recorder
        .outbox()
        .read(0, 100)
        .into_iter()
        .filter(|e| e.body.kind == kind)
        .collect()
}

#[tokio::test]
async fn a_stale_unhealthy_event_drains_nothing() {
    let mut fx = Fixture::new();
    // Replayed after an outage: the worker recovered in the meantime.
    let mut sink = fx.sink_seeing(Guard::default(), Arc::new(|_| Some(Health::Healthy)));
    let stale = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[stale]).await.unwrap();
    assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    let skipped = of_kind(&sink, EventKind::ActionSkipped);
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0]
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("w1 is healthy now"),
        "{skipped:?}"
    );
}

#[tokio::test]
async fn a_kill_recovered_after_the_fact_requeues_nothing() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    let recovered = fx.event(EventKind::OomKill, "w1", |b| {
        b.task_id = Some("slurm-42-977-1700000000000".into());
        b.recovered = Some(true);
    });
    sink.send(&[recovered]).await.unwrap();
    assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    assert_eq!(of_kind(&sink, EventKind::ActionSkipped).len(), 1);
}

/// A lost `worker_recovered`: the next heartbeat saying the worker is
/// healthy resumes the node memwatch drained for it.
#[tokio::test]
async fn a_heartbeat_resumes_a_node_whose_recovery_event_was_lost() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    let unhealthy = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[unhealthy]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());
    // Still unhealthy: the drain stays.
    let beat = fx.heartbeat(&["w1"]);
    sink.send(&[beat]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());
    // Healthy, and no worker_recovered ever came: resumed.
    let beat = fx.heartbeat(&[]);
    sink.send(&[beat]).await.unwrap();
    assert!(
        !fx.dir.path().join("drained-n1").exists(),
        "resumed: {:?}",
        fx.calls()
    );
    assert!(sink.state.drained.is_empty());
    // Again: nothing more to do.
    let calls = fx.calls().len();
    let beat = fx.heartbeat(&[]);
    sink.send(&[beat]).await.unwrap();
    assert_eq!(fx.calls().len(), calls);
}

#[tokio::test]
async fn a_node_an_operator_resumed_is_drainable_again() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    let first = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[first]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());
    // The operator resumed n1 by hand; the worker is still unhealthy.
    fs::remove_file(fx.dir.path().join("drained-n1")).unwrap();
    let again = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[again]).await.unwrap();
    assert!(
        fx.dir.path().join("drained-n1").exists(),
        "drained again: {:?}",
        fx.calls()
    );
}

#[tokio::test]
async fn an_outbox_made_anew_is_not_skipped_as_done() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    fx.seq = 100;
    let late = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[late]).await.unwrap();
    assert_eq!(sink.state.last_seq, 101);
    // The outbox restarted from 0 (its database set aside); a state file
    // of a build before epochs knows no epoch: the seq going back says it.
    sink.align(3, "epoch-b");
    fs::remove_file(fx.dir.path().join("drained-n1")).unwrap();
    sink.state.drained.clear();
    fx.seq = 3;
    let new = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[new]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists(), "seq 4 acted on");
}

#[tokio::test]
async fn a_state_file_that_does_not_parse_is_set_aside_not_fatal() {
    let mut fx = Fixture::new();
    fs::write(
        fx.dir.path().join("slurm-slurm-1.json"),
        "{\"drained\": tru",
    )
    .unwrap();
    let mut sink = fx.sink();
    let said = of_kind(&sink, EventKind::EventQuarantined);
    assert_eq!(said.len(), 1);
    let aside: Vec<_> = fs::read_dir(fx.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "kept for inspection");
    // And it works: drains, and saves a good file again.
    let unhealthy = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[unhealthy]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());
    let saved = fs::read(fx.dir.path().join("slurm-slurm-1.json")).unwrap();
    serde_json::from_slice::<serde_json::Value>(&saved).unwrap();
}

#[tokio::test]
async fn a_state_of_another_outbox_epoch_is_realigned() {
    let mut fx = Fixture::new();
    {
        let mut sink = fx.sink();
        sink.align(0, "epoch-a");
        fx.seq = 100;
        let late = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
        sink.send(&[late]).await.unwrap();
    }
    let saved: serde_json::Value =
        serde_json::from_slice(&fs::read(fx.dir.path().join("slurm-slurm-1.json")).unwrap())
            .unwrap();
    assert_eq!(
        (saved["last_seq"].as_u64(), saved["epoch"].as_str()),
        (Some(101), Some("epoch-a")),
        "the seq is kept with its epoch"
    );

    // Same epoch: seq 101 stays done, whatever the outbox's last seq.
    let mut same = fx.sink();
    same.align(500, "epoch-a");
    assert_eq!(same.state.last_seq, 101);

    // Another epoch that numbers *above* 101 already (the seq heuristic
    // alone would skip its events up to 101 as done): realigned.
    let mut sink = fx.sink();
    sink.align(200, "epoch-b");
    assert_eq!(sink.state.last_seq, 0, "seq 101 of epoch-a means nothing");
    fs::remove_file(fx.dir.path().join("drained-n1")).unwrap();
    sink.state.drained.clear();
    fx.seq = 4;
    let new = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[new]).await.unwrap();
    assert!(
        fx.dir.path().join("drained-n1").exists(),
        "seq 5 of epoch-b acted on"
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&fs::read(fx.dir.path().join("slurm-slurm-1.json")).unwrap())
            .unwrap();
    assert_eq!(
        (saved["last_seq"].as_u64(), saved["epoch"].as_str()),
        (Some(5), Some("epoch-b"))
    );
}

/// After a start that set the outbox database aside, drains wait one
/// window (paused clock): skipped with one `action_skipped`, then done at
/// the first heartbeat past it that still says unhealthy.
#[tokio::test]
async fn drains_and_requeues_wait_out_the_gate_after_a_state_loss() {
    tokio::time::pause();
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    sink.gate = ActionGate::closed_for(
        Duration::from_secs(30),
        "the outbox database was corrupt and set aside as /s/outbox.sqlite.corrupt-1".into(),
    );
    sink.actions.set_gate(sink.gate.clone());
    let unhealthy = fx.event(EventKind::WorkerUnhealthy, "w1", |_| {});
    sink.send(&[unhealthy]).await.unwrap();
    let kill = fx.event(EventKind::OomKill, "w1", |b| {
        b.cgroup = Some("/sys/fs/cgroup/memory/slurm/uid_0/job_42/step_0".into());
    });
    sink.send(&[kill]).await.unwrap();
    tokio::time::advance(Duration::from_secs(29)).await;
    let beat = fx.heartbeat(&["w1"]);
    sink.send(&[beat]).await.unwrap();
    assert!(
        fx.calls().is_empty(),
        "nothing asked of Slurm: {:?}",
        fx.calls()
    );
    let skipped = of_kind(&sink, EventKind::ActionSkipped);
    assert_eq!(
        skipped.len(),
        2,
        "one drain, one requeue, said once: {skipped:?}"
    );
    let reasons: Vec<&str> = skipped
        .iter()
        .map(|e| e.body.reason.as_deref().unwrap())
        .collect();
    assert!(
        reasons[0].starts_with("node n1 not drained yet: no scheduler action within 30s")
            && reasons[0].contains("outbox.sqlite.corrupt-1"),
        "{reasons:?}"
    );
    assert!(reasons[1].starts_with("job 42 not requeued"), "{reasons:?}");

    tokio::time::advance(Duration::from_secs(1)).await;
    // The fake scontrol is a real process: real time from here on.
    tokio::time::resume();
    let beat = fx.heartbeat(&["w1"]);
    sink.send(&[beat]).await.unwrap();
    assert!(
        fx.dir.path().join("drained-n1").exists(),
        "drained once the window passed: {:?}",
        fx.calls()
    );
    assert_eq!(of_kind(&sink, EventKind::ActionSkipped).len(), 2);
}

/// The pressure rule's verdicts are `worker_unhealthy` / `worker_recovered`
/// like the soft cap's: the node is drained with the reason, and resumed.
#[tokio::test]
async fn a_pressure_verdict_drains_and_its_recovery_resumes() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    let reason = "memory pressure: some tasks stalled on memory 31.20% of the last 10 s \
                  (PSI some avg10), above the limit 20.00%, for 60s";
    let batch = [fx.event(EventKind::WorkerUnhealthy, "w1", |b| {
        b.reason = Some(reason.into())
    })];
    sink.send(&batch).await.unwrap();
    let calls = fx.calls();
    assert!(
        calls[1].starts_with(
            "update NodeName=n1 State=DRAIN Reason=memwatch: worker w1 unhealthy: memory pressure: "
        ),
        "{calls:?}"
    );
    let batch = [fx.event(EventKind::WorkerRecovered, "w1", |b| {
        b.reason =
            Some("memory pressure (PSI some avg10 3.10%) below the limit 20.00% for 30s".into())
    })];
    sink.send(&batch).await.unwrap();
    assert_eq!(
        fx.calls()[calls.len()..],
        ["show node n1 -o", "update NodeName=n1 State=RESUME"]
    );
}

/// Right after the controller restarted, a node it has not heard from yet
/// cannot be resumed: the resume is tried again (a transient failure, the
/// batch retried), not given up with the node left drained.
#[tokio::test]
async fn a_resume_the_controller_cannot_take_yet_is_tried_again() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
    sink.send(&[fx.event(EventKind::WorkerUnhealthy, "w1", |_| {})])
        .await
        .unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());
    fx.touch("resume-refused", "");
    let recovered = [fx.event(EventKind::WorkerRecovered, "w1", |_| {})];
    let error = sink.send(&recovered).await.unwrap_err();
    assert!(error.to_string().contains("not registered"), "{error}");
    assert!(fx.dir.path().join("drained-n1").exists(), "still drained");
    fs::remove_file(fx.dir.path().join("resume-refused")).unwrap();
    sink.send(&recovered).await.unwrap();
    assert!(!fx.dir.path().join("drained-n1").exists(), "resumed");
}

/// A drain that waited on the controller longer than the episode lasted
/// (the worker recovered while it was in flight) is undone at once, and
/// said (`action_skipped`).
#[tokio::test]
async fn a_drain_the_worker_outlived_is_undone_at_once() {
    let fx = Fixture::new();
    // Unhealthy for the checks before the drain, healthy after it.
    let looks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&looks);
    let mut sink = fx.sink_seeing(
        Guard {
            min_remaining: 1,
            min_remaining_fraction: 0.0,
        },
        Arc::new(move |_| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(if n < 2 {
                Health::Unhealthy
            } else {
                Health::Healthy
            })
        }),
    );
    let mut fx = fx;
    sink.send(&[fx.event(EventKind::WorkerUnhealthy, "w1", |_| {})])
        .await
        .unwrap();
    let calls = fx.calls();
    assert!(
        calls.iter().any(|c| c.contains("n1 State=DRAIN"))
            && calls
                .last()
                .is_some_and(|c| c == "update NodeName=n1 State=RESUME"),
        "{calls:?}"
    );
    assert!(!fx.dir.path().join("drained-n1").exists());
    let skipped: Vec<_> = sink
        .recorder
        .outbox()
        .read(0, 100)
        .into_iter()
        .filter(|e| e.body.kind == EventKind::ActionSkipped)
        .collect();
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0]
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("in flight"),
        "{skipped:?}"
    );
}

mod imminent;
