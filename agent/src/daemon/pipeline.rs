//! Probe events → outbox events: resolves the kernel's ids into names a
//! scheduler understands and numbers the result in the outbox.

use std::{path::Path, sync::Arc};

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::{
    daemon::{monitor::Monitor, reconcile::LiveKills},
    model::event::{EventBody, EventKind, OomDetails},
    probe::{OomCount, OomVictim, ProbeEvent},
    record::Recorder,
    telemetry::liveness::{Beat, IDLE_BEAT},
};

/// Bound of the queue between the ring-buffer reader and the pipeline.
pub(crate) const PROBE_QUEUE: usize = 4096;
/// Most `oom_kill` events made from one polled counter jump (a storm
/// between two readings is summed up in the last one's reason).
const MAX_KILLS_PER_READING: u64 = 100;
/// Longest an OOM victim of an unknown cgroup waits for that cgroup's
/// mkdir record (see [`Pipeline::await_cgroup_record`]).
pub(crate) const CGROUP_RECORD_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

pub(crate) struct Pipeline {
    pub monitor: Arc<Monitor>,
    pub recorder: Recorder,
    /// Where live kills are noted, for the OOM counters' check.
    pub live_kills: LiveKills,
}

impl Pipeline {
    /// Runs until every sender is gone.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<ProbeEvent>, beat: Beat) {
        loop {
            beat.beat();
            tokio::select! {
                event = rx.recv() => match event {
                    Some(ProbeEvent::OomVictim(victim)) => self.oom_victim(victim, &mut rx).await,
                    Some(event) => self.handle(event),
                    None => return,
                },
                _ = tokio::time::sleep(IDLE_BEAT) => {}
            }
        }
    }

    /// An OOM victim, once its cgroup's mkdir record had its chance.
    async fn oom_victim(&mut self, victim: OomVictim, rx: &mut mpsc::Receiver<ProbeEvent>) {
        let mut later = Vec::new();
        if let Some(id) = victim.memcg_id
            && self.monitor.resolve_cgroup(id).is_none()
        {
            self.await_cgroup_record(id, rx, &mut later).await;
        }
        self.handle(ProbeEvent::OomVictim(victim));
        for event in later {
            self.handle(event);
        }
    }

    /// The reader sends the OOM ring's records before the cgroup ring's (a
    /// kill never waits behind churn), so the mkdir record of a cgroup made
    /// just before its kill may still be queued, or not yet read, when the
    /// kill comes: the cgroup is then unknown, and if it was removed at
    /// once, no walk finds it either. The kill waits for that record, at
    /// most [`CGROUP_RECORD_WAIT`] and [`PROBE_QUEUE`] records: mkdir
    /// records are learned as they come, everything else (rmdir records
    /// included, so a rule task ends as OOM-killed, not removed) is kept in
    /// `later`, in order, for after the kill. Waiting here rather than
    /// reading the cgroup ring first keeps the kill ahead of any backlog
    /// when its cgroup is known, which is nearly always; only a kill that
    /// would otherwise go out without its cgroup is held.
    async fn await_cgroup_record(
        &mut self,
        id: u64,
        rx: &mut mpsc::Receiver<ProbeEvent>,
        later: &mut Vec<ProbeEvent>,
    ) {
        let deadline = tokio::time::Instant::now() + CGROUP_RECORD_WAIT;
        while later.len() < PROBE_QUEUE {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(ProbeEvent::Cgroup(change))) if !change.removed => {
                    self.monitor.cgroup_changed(&change);
                    if change.id == id {
                        return;
                    }
                }
                Ok(Some(event)) => later.push(event),
                Ok(None) | Err(_) => return,
            }
        }
    }

    pub(crate) fn handle(&mut self, event: ProbeEvent) {
        match event {
            ProbeEvent::Cgroup(change) => self.monitor.cgroup_changed(&change),
            ProbeEvent::Growth(line) => self.monitor.growth_line(&line),
            ProbeEvent::OomCounted(count) => self.oom_counted(&count),
            ProbeEvent::OomVictim(victim) => {
                let mut body = self.oom_kill(&victim);
                let cgroup = body.cgroup.as_deref().map(Path::new);
                self.live_kills.note(cgroup);
                let (task_id, worker, task_ended) = self.monitor.attribute_oom(cgroup, victim.pid);
                body.task_id = task_id;
                body.worker = worker;
                let event =
                    self.recorder
                        .record_read(body, Some(victim.time), Some(victim.read_at));
                let read_wall = chrono::Utc::now()
                    - chrono::Duration::from_std(victim.read_at.elapsed()).unwrap_or_default();
                self.recorder.metrics().timeline.kernel_to_read(
                    EventKind::OomKill,
                    victim.time,
                    read_wall,
                );
                // The task's end comes after the kill that ended it.
                self.monitor.store(task_ended, tokio::time::Instant::now());
                info!(
                    seq = event.seq,
                    pid = victim.pid,
                    // Debug: quoted and escaped, the workload names them.
                    comm = ?victim.comm,
                    cgroup = ?event.body.cgroup.as_deref().unwrap_or("?"),
                    task_id = ?event.body.task_id.as_deref().unwrap_or("-"),
                    rss_bytes = victim.rss_bytes(),
                    "OOM kill"
                );
            }
        }
    }

    /// Kills the poll source counted: one `oom_kill` each (up to a bound),
    /// with the cgroup, its limit, task and worker, and no victim.
    fn oom_counted(&mut self, count: &OomCount) {
        let kills = count.after - count.before;
        for n in 0..kills.min(MAX_KILLS_PER_READING) {
            let mut body = EventBody::new(EventKind::OomKill);
            let (constraint, limit) =
                crate::cgroup::limits::oom_limit(&count.cgroup, &self.monitor.cgroup_root());
            body.constraint = Some(constraint);
            body.limit_cgroup = limit.map(|p| p.display().to_string());
            body.cgroup = Some(count.cgroup.display().to_string());
            self.live_kills.note(Some(&count.cgroup));
            let (task_id, worker, task_ended) = self.monitor.attribute_oom(Some(&count.cgroup), 0);
            body.task_id = task_id;
            body.worker = worker;
            body.reason = Some(format!(
                "seen by polling: the cgroup's oom_kill counter went {} -> {}{}; victim unknown (source poll)",
                count.before,
                count.after,
                if kills > MAX_KILLS_PER_READING && n + 1 == MAX_KILLS_PER_READING {
                    format!(
                        ", {} more kills not reported one by one",
                        kills - MAX_KILLS_PER_READING
                    )
                } else {
                    String::new()
                }
            ));
            let event = self.recorder.record(body, Some(count.time));
            self.monitor.store(task_ended, tokio::time::Instant::now());
            info!(seq = event.seq, cgroup = ?count.cgroup, "OOM kill (polled)");
        }
    }

    fn oom_kill(&mut self, v: &OomVictim) -> EventBody {
        let mut body = EventBody::new(EventKind::OomKill);
        body.pid = Some(v.pid);
        body.tid = (v.tid != v.pid).then_some(v.tid);
        body.comm = Some(v.comm.clone());
        body.rss_bytes = Some(v.rss_bytes());
        match v.memcg_id.map(|id| (id, self.monitor.resolve_cgroup(id))) {
            Some((_, Some(path))) => {
                let (constraint, limit) =
                    crate::cgroup::limits::oom_limit(&path, &self.monitor.cgroup_root());
                body.constraint = Some(constraint);
                body.limit_cgroup = limit.map(|p| p.display().to_string());
                // A kill in a followed cgroup, or below one, that was predicted.
                if let Some((lead, error)) = path
                    .ancestors()
                    .find_map(|c| self.monitor.predicted_kill(c))
                {
                    body.predicted_lead_seconds = Some((lead * 10.0).round() / 10.0);
                    body.eta_error_seconds = Some((error * 10.0).round() / 10.0);
                }
                body.cgroup = Some(path.display().to_string());
            }
            Some((id, None)) => {
                warn!(
                    memcg_id = id,
                    pid = v.pid,
                    "OOM victim's memory cgroup already gone"
                );
                body.reason = Some(format!(
                    "memory cgroup {id} was removed before it could be resolved"
                ));
            }
            None => body.reason = Some("the kernel record had no readable memory cgroup".into()),
        }
        body.oom = Some(OomDetails {
            anon_rss_bytes: v.anon_rss_bytes,
            file_rss_bytes: v.file_rss_bytes,
            shmem_rss_bytes: v.shmem_rss_bytes,
            total_vm_bytes: v.total_vm_bytes,
            trigger_pid: v.trigger_pid,
            memcg_id: v.memcg_id.unwrap_or(0),
        });
        body
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::MetadataExt as _};

    use chrono::Utc;

    use super::*;
    use crate::{
        cgroup::{CgroupVersion, MemoryHierarchy},
        outbox::Outbox,
        telemetry::Metrics,
    };

    fn victim(memcg_id: Option<u64>) -> OomVictim {
        OomVictim {
            time: Utc::now(),
            pid: 100,
            tid: 101,
            comm: "memhog".into(),
            memcg_id,
            anon_rss_bytes: 64 << 20,
            file_rss_bytes: 1 << 20,
            shmem_rss_bytes: 0,
            total_vm_bytes: 256 << 20,
            trigger_pid: 100,
            read_at: std::time::Instant::now(),
        }
    }

    fn pipeline(root: &std::path::Path) -> Pipeline {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let recorder = Recorder::new(Outbox::new("h", 10, metrics.clone()), metrics);
        let worker = crate::model::spec::WorkerSpec {
            name: "w1".into(),
            source: crate::model::spec::MemorySource::Cgroup(root.into()),
            soft_cap: None,
            unhealthy_after: std::time::Duration::from_secs(60),
            recover_after: std::time::Duration::from_secs(30),
            pressure: None,
        };
        let monitor = Monitor::new(
            vec![worker],
            Default::default(),
            Vec::new(),
            MemoryHierarchy {
                root: root.into(),
                version: CgroupVersion::V1,
            },
            Arc::new(crate::daemon::sampler::fake::FakeReader::default()),
            recorder.clone(),
        );
        Pipeline {
            monitor: Arc::new(monitor),
            recorder,
            live_kills: LiveKills::default(),
        }
    }

    #[tokio::test]
    async fn oom_victim_becomes_an_oom_kill_event_with_its_cgroup_path() {
        let root = tempfile::tempdir().unwrap();
        let cg = root.path().join("job-7");
        fs::create_dir(&cg).unwrap();
        let id = fs::metadata(&cg).unwrap().ino();
        let (tx, rx) = mpsc::channel(4);
        let p = pipeline(root.path());
        let (outbox, metrics) = (p.recorder.outbox().clone(), p.recorder.metrics().clone());
        tx.send(ProbeEvent::OomVictim(victim(Some(id))))
            .await
            .unwrap();
        drop(tx);
        p.run(
            rx,
            crate::telemetry::liveness::Liveness::default().register("pipeline", IDLE_BEAT),
        )
        .await;

        let events = outbox.read(0, 10);
        assert_eq!(events.len(), 1);
        let e = &events[0].body;
        assert_eq!(e.kind, EventKind::OomKill);
        assert_eq!((e.pid, e.tid), (Some(100), Some(101)));
        assert_eq!(e.comm.as_deref(), Some("memhog"));
        assert_eq!(e.cgroup.as_deref(), Some(cg.to_str().unwrap()));
        assert_eq!(e.rss_bytes, Some(65 << 20));
        assert_eq!(e.reason, None);
        assert_eq!(
            e.worker.as_deref(),
            Some("w1"),
            "victim inside the worker's cgroup"
        );
        // No limit anywhere up the (fake) hierarchy: a global kill.
        assert_eq!(
            e.constraint,
            Some(crate::model::event::OomConstraint::Global)
        );
        assert_eq!(metrics.oom_kills.with_label_values(&["global"]).get(), 1);
    }

    #[tokio::test]
    async fn oom_kill_of_a_task_names_it_and_ends_it_after_the_kill() {
        use crate::model::spec::{MemorySource, TaskRequest};
        let root = tempfile::tempdir().unwrap();
        let cg = root.path().join("job-9");
        fs::create_dir(&cg).unwrap();
        let mut p = pipeline(root.path());
        p.monitor
            .register(TaskRequest {
                task_id: "job-9".into(),
                worker: None,
                source: Some(MemorySource::Cgroup(cg.clone())),
                soft_cap: None,
                owner: crate::model::spec::ANONYMOUS.into(),
            })
            .unwrap();
        let id = fs::metadata(&cg).unwrap().ino();
        p.handle(ProbeEvent::OomVictim(victim(Some(id))));
        let events = p.recorder.outbox().read(0, 10);
        let kinds: Vec<_> = events.iter().map(|e| e.body.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::TaskStarted,
                EventKind::OomKill,
                EventKind::TaskFinished
            ]
        );
        assert_eq!(events[1].body.task_id.as_deref(), Some("job-9"));
        assert_eq!(events[1].body.worker.as_deref(), Some("w1"));
        assert_eq!(events[2].body.reason.as_deref(), Some("OOM-killed"));
        assert!(p.monitor.tasks().is_empty());
        assert_eq!(
            p.recorder
                .metrics()
                .task_oom_kills
                .with_label_values(&["w1"])
                .get(),
            1
        );
    }

    fn made(id: u64, path: &str, removed: bool) -> ProbeEvent {
        ProbeEvent::Cgroup(crate::probe::CgroupChange {
            id,
            path: path.into(),
            level: 1,
            removed,
        })
    }

    /// The reader's order under load: the kill first, its cgroup's mkdir
    /// record later, read when the directory is already gone.
    #[tokio::test(start_paused = true)]
    async fn a_kill_read_before_its_removed_cgroups_mkdir_record_still_names_it() {
        let root = tempfile::tempdir().unwrap();
        let cg = root.path().join("shortlived");
        fs::create_dir(&cg).unwrap();
        let id = fs::metadata(&cg).unwrap().ino();
        fs::remove_dir(&cg).unwrap();
        let p = pipeline(root.path());
        let outbox = p.recorder.outbox().clone();
        let (tx, rx) = mpsc::channel(8);
        let start = tokio::time::Instant::now();
        let sender = tokio::spawn(async move {
            tx.send(ProbeEvent::OomVictim(victim(Some(id))))
                .await
                .unwrap();
            tokio::time::sleep(CGROUP_RECORD_WAIT / 5).await;
            tx.send(made(id, "/shortlived", false)).await.unwrap();
            tx.send(made(id, "/shortlived", true)).await.unwrap();
            tokio::time::sleep(CGROUP_RECORD_WAIT * 10).await;
        });
        let beat = crate::telemetry::liveness::Liveness::default().register("pipeline", IDLE_BEAT);
        let run = tokio::spawn(p.run(rx, beat));
        tokio::time::sleep(CGROUP_RECORD_WAIT / 2).await;
        // Recorded as soon as the record came, well before the bound.
        let events = outbox.read(0, 10);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].body.cgroup.as_deref(), cg.to_str(), "{events:?}");
        assert_eq!(events[0].body.reason, None);
        sender.await.unwrap();
        run.await.unwrap();
        assert!(start.elapsed() >= CGROUP_RECORD_WAIT * 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_of_an_unknown_cgroup_waits_for_its_record_only_so_long() {
        let root = tempfile::tempdir().unwrap();
        let p = pipeline(root.path());
        let outbox = p.recorder.outbox().clone();
        let (tx, rx) = mpsc::channel(8);
        tx.send(ProbeEvent::OomVictim(victim(Some(u64::MAX))))
            .await
            .unwrap();
        // Another kill meanwhile is kept for after the first, in order.
        tx.send(ProbeEvent::OomVictim(victim(None))).await.unwrap();
        let beat = crate::telemetry::liveness::Liveness::default().register("pipeline", IDLE_BEAT);
        let run = tokio::spawn(p.run(rx, beat));
        tokio::time::sleep(CGROUP_RECORD_WAIT * 4 / 5).await;
        assert!(
            outbox.read(0, 10).is_empty(),
            "held while its record may come"
        );
        tokio::time::sleep(CGROUP_RECORD_WAIT * 2 / 5).await;
        let events = outbox.read(0, 10);
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0].body.cgroup, None);
        assert!(
            events[0]
                .body
                .reason
                .as_deref()
                .unwrap()
                .contains("removed")
        );
        assert_eq!(events[1].body.oom.as_ref().unwrap().memcg_id, 0);
        drop(tx);
        run.await.unwrap();
    }

    #[test]
    fn unresolvable_cgroup_says_why() {
        let root = tempfile::tempdir().unwrap();
        let mut p = pipeline(root.path());
        p.handle(ProbeEvent::OomVictim(victim(Some(u64::MAX))));
        p.handle(ProbeEvent::OomVictim(victim(None)));
        let events = p.recorder.outbox().read(0, 10);
        assert_eq!(events[0].body.cgroup, None);
        assert!(
            events[0]
                .body
                .reason
                .as_deref()
                .unwrap()
                .contains("removed")
        );
        assert!(
            events[1]
                .body
                .reason
                .as_deref()
                .unwrap()
                .contains("no readable memory cgroup")
        );
    }
}
