//! What the monitor's tests share: worker `w1`, a monitor of it on a fake
//! hierarchy, and the kernel's WATCHED map.

use std::{path::Path, sync::Arc, time::Duration};

use crate::daemon::monitor::{Monitor, Rule};
use crate::{
    cgroup::{CgroupVersion, MemoryHierarchy},
    daemon::sampler::fake::FakeReader,
    model::spec::{MemorySource, Settings, WorkerSpec},
    outbox::Outbox,
    record::Recorder,
    telemetry::Metrics,
};

/// Worker `w1` reading `source`, with `soft_cap`: unhealthy after 60 s
/// above it, recovered after 30 s, no pressure rule.
pub(crate) fn w1(source: MemorySource, soft_cap: Option<u64>) -> WorkerSpec {
    WorkerSpec {
        name: "w1".into(),
        source,
        soft_cap,
        unhealthy_after: Duration::from_secs(60),
        recover_after: Duration::from_secs(30),
        pressure: None,
    }
}

/// A monitor of `worker` alone with the default settings, on the memory
/// hierarchy `version` mounted at `root`, recording to `outbox`.
pub(crate) fn monitor_of(
    worker: WorkerSpec,
    rules: Vec<Rule>,
    (root, version): (&Path, CgroupVersion),
    reader: Arc<FakeReader>,
    outbox: Outbox,
    metrics: Metrics,
) -> Monitor {
    let hierarchy = MemoryHierarchy {
        root: root.into(),
        version,
    };
    let recorder = Recorder::new(outbox, metrics);
    Monitor::new(
        vec![worker],
        Settings::default(),
        rules,
        hierarchy,
        reader,
        recorder,
    )
}

/// The kernel's WATCHED map, by cgroup id.
#[derive(Default)]
pub(crate) struct Watched(
    pub std::sync::Mutex<std::collections::HashMap<u64, crate::probe::Watch>>,
);

impl crate::probe::KernelWatch for Watched {
    fn set(&self, id: u64, watch: Option<crate::probe::Watch>) {
        let mut map = self.0.lock().unwrap();
        match watch {
            Some(w) => map.insert(id, w),
            None => map.remove(&id),
        };
    }
}

/// A cgroup directory's id, as the kernel names it.
pub(crate) fn ino(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).unwrap().ino()
}
