//! A soft-cap crossing the kernel reported is never lost: when the task
//! frees its memory, or ends, before any read of it, the crossing is said
//! from the kernel's own figure; a read while the kernel still holds the
//! crossing judges it (page cache the sampler does not count is no
//! crossing).

use std::{path::Path, sync::Arc, time::Duration};

use super::{Watched, ino, monitor_of, w1};
use crate::{
    cgroup::CgroupVersion,
    daemon::{monitor::Monitor, sampler::fake::FakeReader},
    model::{
        event::{EventBody, EventKind},
        spec::{ANONYMOUS, MemorySource, TaskOutcome, TaskRequest},
    },
    outbox::Outbox,
    probe::Line,
    telemetry::Metrics,
};

const MIB: u64 = 1 << 20;
const CAP: u64 = 64 * MIB;

/// A monitor with the kernel's watch attached and task `t` registered in
/// its own cgroup with a 64 MiB soft cap, read at 10 MiB.
struct Fixture {
    m: Monitor,
    reader: Arc<FakeReader>,
    map: Arc<Watched>,
    cgroup: std::path::PathBuf,
}

fn start(root: &Path) -> Fixture {
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::new("h", 100, metrics.clone());
    let reader = Arc::new(FakeReader::default());
    reader.set(MemorySource::Pid(1), 100 * MIB);
    let worker = w1(MemorySource::Pid(1), None);
    let m = monitor_of(
        worker,
        Vec::new(),
        (root, CgroupVersion::V1),
        reader.clone(),
        outbox,
        metrics,
    );
    let map = Arc::new(Watched::default());
    m.attach_kernel_watch(map.clone());
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
    Fixture {
        m,
        reader,
        map,
        cgroup,
    }
}

impl Fixture {
    /// The growth program's `line` of the task's cgroup at `usage`.
    fn line(&self, line: Line, usage: u64) {
        self.m.growth_line(&crate::probe::GrowthLine {
            time: chrono::Utc::now(),
            memcg_id: ino(&self.cgroup),
            line,
            usage_bytes: usage,
            cap_bytes: Some(CAP),
        });
    }

    /// The sampler reads the task at `bytes` from now on.
    fn reads(&self, bytes: u64) {
        self.reader
            .set(MemorySource::Cgroup(self.cgroup.clone()), bytes);
    }

    fn crossings(&self) -> Vec<EventBody> {
        self.kinds_of(&[EventKind::SoftCapExceeded])
    }

    fn kinds_of(&self, kinds: &[EventKind]) -> Vec<EventBody> {
        let events = self.m.recorder.outbox().read(0, 100);
        events
            .into_iter()
            .map(|e| e.body)
            .filter(|b| kinds.contains(&b.kind))
            .collect()
    }
}

/// Over the cap and back below in the kernel with no read between (the
/// sampling loop was late): the next round reads 12 MiB, and says the
/// crossing at the kernel's 66 MiB, once.
#[tokio::test(start_paused = true)]
async fn a_crossing_gone_before_a_read_is_said_at_the_kernels_figure() {
    let root = tempfile::tempdir().unwrap();
    let f = start(root.path());
    f.line(Line::AboveCap, 66 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    f.line(Line::BelowCap, 12 * MIB);
    f.reads(12 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    f.m.tick();
    let said = f.crossings();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].task_id.as_deref(), Some("t"));
    assert_eq!(said[0].rss_bytes, Some(66 * MIB));
    assert_eq!(said[0].soft_cap_bytes, Some(CAP));
    let reason = said[0].reason.as_deref().unwrap();
    assert!(reason.contains("the kernel's count"), "{reason}");
    tokio::time::advance(Duration::from_secs(1)).await;
    f.m.tick();
    assert_eq!(f.crossings().len(), 1, "said once");
}

/// Over the cap in the kernel, and the task ends before a read: the
/// crossing comes before its `task_finished`.
#[tokio::test(start_paused = true)]
async fn a_task_ending_before_a_read_of_its_crossing_says_it_first() {
    let root = tempfile::tempdir().unwrap();
    let f = start(root.path());
    f.line(Line::AboveCap, 70 * MIB);
    f.m.finish("t", TaskOutcome::Ended { exit_code: Some(0) })
        .unwrap();
    let kinds: Vec<EventKind> = f
        .kinds_of(&[EventKind::SoftCapExceeded, EventKind::TaskFinished])
        .iter()
        .map(|b| b.kind)
        .collect();
    assert_eq!(kinds, [EventKind::SoftCapExceeded, EventKind::TaskFinished]);
    assert_eq!(f.crossings()[0].rss_bytes, Some(70 * MIB));
}

/// Over the cap in the kernel at 66 MiB, read at `read` while the kernel
/// still holds it, then back below: the crossings said by then.
async fn crossed_and_read_at(read: u64) -> (Fixture, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let f = start(root.path());
    f.line(Line::AboveCap, 66 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    f.reads(read);
    f.m.tick();
    f.line(Line::BelowCap, 30 * MIB);
    tokio::time::advance(Duration::from_secs(1)).await;
    f.m.tick();
    (f, root)
}

/// A read while the kernel holds the crossing judges it: over the cap, it
/// is said from the read (as ever); under it (the kernel counted page
/// cache the sampler leaves out), it is not said at all, neither when the
/// kernel closes it nor when the task ends.
#[tokio::test(start_paused = true)]
async fn a_read_during_the_crossing_judges_it() {
    let (f, _root) = crossed_and_read_at(40 * MIB).await;
    assert!(f.crossings().is_empty(), "judged below by the read");
    f.m.finish("t", TaskOutcome::Ended { exit_code: Some(0) })
        .unwrap();
    assert!(f.crossings().is_empty());

    let (f, _root) = crossed_and_read_at(66 * MIB).await;
    let said = f.crossings();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(!said[0].reason.as_deref().unwrap().contains("kernel"));
}

/// A task the OOM killer ended gives its cap back to the kernel, as one
/// that ended by itself does: nothing of it stays in the WATCHED map.
#[tokio::test(start_paused = true)]
async fn an_oom_killed_task_gives_its_cap_back_to_the_kernel() {
    let root = tempfile::tempdir().unwrap();
    let f = start(root.path());
    let id = ino(&f.cgroup);
    let held = f.map.0.lock().unwrap().get(&id).and_then(|w| w.cap_bytes);
    assert_eq!(held, Some(CAP));
    let (task, _, _) = f.m.attribute_oom(Some(&f.cgroup), 4242);
    assert_eq!(task.as_deref(), Some("t"));
    let held = f.map.0.lock().unwrap().get(&id).and_then(|w| w.cap_bytes);
    assert_eq!(held, None, "the cap is taken back");
}

/// The kernel saw 66 MiB (page cache included), the read 62: no crossing,
/// and the kernel's line goes to 68 MiB, so the working set's later climb
/// past the cap is the kernel's news again (before this, the kernel said
/// nothing more until the usage fell back below, and the crossing waited
/// for the sampler's tick): at 69 the read says 65, once.
#[tokio::test(start_paused = true)]
async fn a_crossing_that_was_page_cache_leaves_the_kernel_watching_above_it() {
    let root = tempfile::tempdir().unwrap();
    let f = start(root.path());
    let id = ino(&f.cgroup);
    let held = |f: &Fixture| f.map.0.lock().unwrap().get(&id).copied().unwrap();
    let pushed = held(&f).generation;
    f.line(Line::AboveCap, 66 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    f.reads(62 * MIB);
    f.m.tick();
    assert!(f.crossings().is_empty(), "page cache");
    assert_eq!(held(&f).cap_bytes, Some(68 * MIB));
    assert!(held(&f).generation > pushed, "the kernel re-reads it");

    tokio::time::advance(Duration::from_millis(200)).await;
    f.line(Line::AboveCap, 69 * MIB);
    tokio::time::advance(Duration::from_millis(5)).await;
    f.reads(65 * MIB);
    f.m.tick();
    let said = f.crossings();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].rss_bytes, Some(65 * MIB));
    f.m.finish("t", TaskOutcome::Ended { exit_code: Some(0) })
        .unwrap();
    assert_eq!(f.crossings().len(), 1, "said once");
}
