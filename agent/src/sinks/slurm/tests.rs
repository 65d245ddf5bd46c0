use std::{os::unix::fs::PermissionsExt as _, time::Duration};

use chrono::Utc;

use super::*;
use crate::model::event::EventBody;

/// A fake `scontrol` that logs its arguments and keeps node drains as files.
const FAKE: &str = r#"#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
case "$1 $2" in
"show node")
    if [ "$3" = n2 ]; then echo "NodeName=n2 State=IDLE+DRAIN Reason=maintenance [root@x]"
    elif [ -f "$dir/drained-$3" ]; then echo "NodeName=$3 State=IDLE+DRAIN Reason=$(cat "$dir/drained-$3")"
    else echo "NodeName=$3 State=IDLE"; fi; exit 0;;
"show job")
    if [ -f "$dir/requeued-$3" ]; then echo "JobId=$3 JobState=PENDING BatchHost=n1"
    else echo "JobId=$3 JobState=RUNNING BatchHost=n1 NodeList=n1"; fi; exit 0;;
"requeue "*) touch "$dir/requeued-$2"; exit 0;;
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
"#;

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
        Fixture { dir, seq: 0 }
    }

    fn sink(&self) -> SlurmSink {
        let config = SlurmConfig {
            name: "slurm-1".into(),
            scontrol: self.dir.path().join("scontrol"),
            nodes: [("w1", "n1"), ("w2", "n2")]
                .into_iter()
                .map(|(w, n)| (w.to_string(), n.to_string()))
                .collect(),
            drain: true,
            requeue: RequeuePolicy::OtherNode,
            max_requeues: 1,
            delivery: Delivery {
                timeout: Duration::from_secs(5),
                ..Delivery::default()
            },
        };
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        SlurmSink::open(config, "host-node".into(), self.dir.path(), metrics).unwrap()
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
            "show node n1 -o",
            "update NodeName=n1 State=DRAIN Reason=memwatch: worker w1 unhealthy: unmanaged memory",
            "show node n2 -o",
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
        fx.calls()[3..],
        ["show node n1 -o", "update NodeName=n1 State=RESUME"]
    );
    assert!(!fx.dir.path().join("drained-n1").exists());
}

#[tokio::test]
async fn an_oom_killed_job_is_requeued_elsewhere_at_once_up_to_the_limit() {
    let mut fx = Fixture::new();
    let mut sink = fx.sink();
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

#[test]
fn job_ids_come_from_cgroups_or_exec_task_ids() {
    let mut fx = Fixture::new();
    let e = fx.event(EventKind::OomKill, "w", |b| {
        b.cgroup = Some("/sys/fs/cgroup/memory/slurm/uid_0/job_17/step_batch".into());
    });
    assert_eq!(job_id(&e), Some(17));
    let e = fx.event(EventKind::OomKill, "w", |b| {
        b.task_id = Some("slurm-9-1-2".into())
    });
    assert_eq!(job_id(&e), Some(9));
    let e = fx.event(EventKind::OomKill, "w", |b| {
        b.task_id = Some("exec-9-1".into())
    });
    assert_eq!(job_id(&e), None);
}
