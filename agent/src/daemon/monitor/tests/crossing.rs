//! A soft-cap crossing the kernel reported is never lost: when the task
//! frees its memory, or ends, before any read of it, the crossing is said
//! from the kernel's own figure; a read while the kernel still holds the
//! crossing judges it (page cache the sampler does not count is no
//! crossing).

use std::{path::Path, sync::Arc, time::Duration};

use super::super::*;
use crate::{
    cgroup::CgroupVersion,
    daemon::sampler::fake::FakeReader,
    model::{
        event::EventKind,
        spec::{ANONYMOUS, TaskOutcome, TaskRequest},
    },
    outbox::Outbox,
    probe::{KernelWatch, Line, Watch},
    telemetry::Metrics,
};

const MIB: u64 = 1 << 20;
const CAP: u64 = 64 * MIB;

struct NoMap;

impl KernelWatch for NoMap {
    fn set(&self, _: u64, _: Option<Watch>) {}
}

/// A monitor with the kernel's watch attached and task `t` registered in
/// its own cgroup with a 64 MiB soft cap, read at 10 MiB.
fn start(root: &Path) -> (Monitor, Arc<FakeReader>, std::path::PathBuf) {
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::new("h", 100, metrics.clone());
    let reader = Arc::new(FakeReader::default());
    let worker = WorkerSpec {
        name: "w1".into(),
        source: MemorySource::Pid(1),
        soft_cap: None,
        unhealthy_after: Duration::from_secs(60),
        recover_after: Duration::from_secs(30),
        pressure: None,
    };
    reader.set(MemorySource::Pid(1), 100 * MIB);
    let m = Monitor::new(
        vec![worker],
        Settings::default(),
        Vec::new(),
        MemoryHierarchy {
            root: root.into(),
            version: CgroupVersion::V1,
        },
        reader.clone(),
        Recorder::new(outbox, metrics),
    );
    m.attach_kernel_watch(Arc::new(NoMap));
    let cgroup = root.join("t");
    std::fs::create_dir(&cgroup).unwrap();
    reader.set(MemorySource::Cgroup(cgroup.clone()), 10 * MIB);
    m.register(TaskRequest {
        task_id: "t".into(),
        worker: None,
        source: Some(MemorySource::Cgroup(cgroup.clone())),
        soft_cap: Some(CAP),
        owner: ANONYMOUS.into(),
    })
    .unwrap();
    m.tick();
    (m, reader, cgroup)
}

fn line(m: &Monitor, cgroup: &Path, line: Line, usage: u64) {
    use std::os::unix::fs::MetadataExt as _;
    m.growth_line(&crate::probe::GrowthLine {
        time: chrono::Utc::now(),
        memcg_id: std::fs::metadata(cgroup).unwrap().ino(),
        line,
        usage_bytes: usage,
        cap_bytes: Some(CAP),
    });
}

fn crossings(m: &Monitor) -> Vec<EventBody> {
    m.recorder
        .outbox()
        .read(0, 100)
        .into_iter()
        .filter(|e| e.body.kind == EventKind::SoftCapExceeded)
        .map(|e| e.body)
        .collect()
}

/// Over the cap and back below in the kernel with no read between (the
/// sampling loop was late): the next round reads 12 MiB, and says the
/// crossing at the kernel's 66 MiB, once.
#[tokio::test(start_paused = true)]
async fn a_crossing_gone_before_a_read_is_said_at_the_kernels_figure() {
    let root = tempfile::tempdir().unwrap();
    let (m, reader, cgroup) = start(root.path());
    line(&m, &cgroup, Line::AboveCap, 66 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    line(&m, &cgroup, Line::BelowCap, 12 * MIB);
    reader.set(MemorySource::Cgroup(cgroup.clone()), 12 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    m.tick();
    let said = crossings(&m);
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].task_id.as_deref(), Some("t"));
    assert_eq!(said[0].rss_bytes, Some(66 * MIB));
    assert_eq!(said[0].soft_cap_bytes, Some(CAP));
    let reason = said[0].reason.as_deref().unwrap();
    assert!(reason.contains("the kernel's count"), "{reason}");
    tokio::time::advance(Duration::from_secs(1)).await;
    m.tick();
    assert_eq!(crossings(&m).len(), 1, "said once");
}

/// Over the cap in the kernel, and the task ends before a read: the
/// crossing comes before its `task_finished`.
#[tokio::test(start_paused = true)]
async fn a_task_ending_before_a_read_of_its_crossing_says_it_first() {
    let root = tempfile::tempdir().unwrap();
    let (m, _reader, cgroup) = start(root.path());
    line(&m, &cgroup, Line::AboveCap, 70 * MIB);
    m.finish("t", TaskOutcome::Ended { exit_code: Some(0) })
        .unwrap();
    let kinds: Vec<EventKind> = m
        .recorder
        .outbox()
        .read(0, 100)
        .into_iter()
        .map(|e| e.body.kind)
        .filter(|k| matches!(k, EventKind::SoftCapExceeded | EventKind::TaskFinished))
        .collect();
    assert_eq!(kinds, [EventKind::SoftCapExceeded, EventKind::TaskFinished]);
    assert_eq!(crossings(&m)[0].rss_bytes, Some(70 * MIB));
}

/// A read while the kernel holds the crossing judges it: over the cap, it
/// is said from the read (as ever); under it (the kernel counted page
/// cache the sampler leaves out), it is not said at all, neither when the
/// kernel closes it nor when the task ends.
#[tokio::test(start_paused = true)]
async fn a_read_during_the_crossing_judges_it() {
    let root = tempfile::tempdir().unwrap();
    let (m, reader, cgroup) = start(root.path());
    line(&m, &cgroup, Line::AboveCap, 66 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    reader.set(MemorySource::Cgroup(cgroup.clone()), 40 * MIB);
    m.tick();
    line(&m, &cgroup, Line::BelowCap, 30 * MIB);
    tokio::time::advance(Duration::from_secs(1)).await;
    m.tick();
    assert!(crossings(&m).is_empty(), "judged below by the read");
    m.finish("t", TaskOutcome::Ended { exit_code: Some(0) })
        .unwrap();
    assert!(crossings(&m).is_empty());

    let root = tempfile::tempdir().unwrap();
    let (m, reader, cgroup) = start(root.path());
    line(&m, &cgroup, Line::AboveCap, 66 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    reader.set(MemorySource::Cgroup(cgroup.clone()), 66 * MIB);
    m.tick();
    line(&m, &cgroup, Line::BelowCap, 30 * MIB);
    tokio::time::advance(Duration::from_secs(1)).await;
    m.tick();
    let said = crossings(&m);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(!said[0].reason.as_deref().unwrap().contains("kernel"));
}
