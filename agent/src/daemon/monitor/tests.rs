//! The monitor with fake memory figures: soft caps, rule tasks, restarts,
//! rejections.
//!
//! Longer than 600 lines: every path through the monitor with fake figures
//! and a paused clock; they share one fixture (a monitor on a fake
//! hierarchy).

mod fixture;

pub(crate) use fixture::{Watched, ino, monitor_of, w1};

use crate::model::spec::{ANONYMOUS, MemorySource, TaskRequest};

/// A task of the only worker, anonymous, with no soft cap of its own.
fn task(id: impl Into<String>, source: Option<MemorySource>) -> TaskRequest {
    TaskRequest {
        task_id: id.into(),
        worker: None,
        source,
        soft_cap: None,
        owner: ANONYMOUS.into(),
    }
}

mod crossing;

mod basics {
    use std::fs;

    use super::super::*;
    use crate::{
        cgroup::CgroupVersion, daemon::sampler::fake::FakeReader, model::event::EventKind,
        outbox::Outbox, telemetry::Metrics,
    };

    const MIB: u64 = 1 << 20;

    fn monitor(root: &Path, reader: FakeReader, rules: Vec<Rule>) -> (Monitor, Outbox) {
        monitor_reading(root, Arc::new(reader), rules)
    }

    fn monitor_reading(
        root: &Path,
        reader: Arc<FakeReader>,
        rules: Vec<Rule>,
    ) -> (Monitor, Outbox) {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics.clone());
        let worker = super::w1(MemorySource::Cgroup(root.into()), None);
        let m = super::monitor_of(
            worker,
            rules,
            (root, CgroupVersion::V1),
            reader,
            outbox.clone(),
            metrics,
        );
        (m, outbox)
    }

    fn kinds(outbox: &Outbox) -> Vec<EventKind> {
        outbox.read(0, 100).iter().map(|e| e.body.kind).collect()
    }

    /// One more task reads its worker and itself, not every running task:
    /// the others count with their figures of the last tick. Were they
    /// counted as nothing, the residual (600 MiB) would be over the
    /// worker's cap (200 MiB) and the task rejected.
    #[tokio::test]
    async fn a_registration_reads_its_worker_and_itself_only() {
        let root = tempfile::tempdir().unwrap();
        let reader = Arc::new(FakeReader::default());
        reader
            .caps
            .lock()
            .unwrap()
            .insert(root.path().into(), 200 * MIB);
        let worker = |tasks: u64| {
            reader.set(
                MemorySource::Cgroup(root.path().into()),
                (100 + 10 * tasks) * MIB,
            )
        };
        let (m, _outbox) = monitor_reading(root.path(), reader.clone(), Vec::new());
        let task = |id: String, pid: u32| super::task(id, Some(MemorySource::Pid(pid)));
        for i in 0..50 {
            worker(u64::from(i) + 1);
            reader.set(MemorySource::Pid(1000 + i), 10 * MIB);
            m.register(task(format!("t{i}"), 1000 + i)).unwrap();
        }
        m.tick();
        reader.reads.lock().unwrap().clear();
        worker(51);
        reader.set(MemorySource::Pid(2000), 10 * MIB);
        let registration = m.register(task("new".into(), 2000)).unwrap();
        assert_eq!(
            *reader.reads.lock().unwrap(),
            [
                MemorySource::Cgroup(root.path().into()),
                MemorySource::Pid(2000)
            ],
            "the worker and the new task are read, nothing else"
        );
        assert_eq!(registration.admission, Admission::Accepted);
    }

    /// An idle agent's rounds read the workers; the tasks of a calm
    /// worker wait for the full round, one in FULL_ROUND.
    #[tokio::test]
    async fn idle_rounds_read_the_workers_and_every_tenth_the_tasks() {
        let root = tempfile::tempdir().unwrap();
        let reader = Arc::new(FakeReader::default());
        reader
            .caps
            .lock()
            .unwrap()
            .insert(root.path().into(), 200 * MIB);
        let worker = MemorySource::Cgroup(root.path().into());
        reader.set(worker.clone(), 100 * MIB);
        let (m, _outbox) = monitor_reading(root.path(), reader.clone(), Vec::new());
        for pid in 1..=3 {
            reader.set(MemorySource::Pid(pid), MIB);
            m.register(super::task(format!("t{pid}"), Some(MemorySource::Pid(pid))))
                .unwrap();
        }
        let reads = || std::mem::take(&mut *reader.reads.lock().unwrap()).len();
        reads();
        let per_round: Vec<usize> = (0..=FULL_ROUND)
            .map(|_| {
                m.tick();
                reads()
            })
            .collect();
        let mut expected = vec![1; FULL_ROUND as usize + 1];
        expected[0] = 4;
        expected[FULL_ROUND as usize] = 4;
        assert_eq!(per_round, expected, "sources read per round");
    }

    #[tokio::test]
    async fn soft_caps_default_to_the_cgroups_own() {
        let root = tempfile::tempdir().unwrap();
        let task_cg = root.path().join("t1");
        fs::create_dir(&task_cg).unwrap();
        let reader = FakeReader::default();
        reader
            .caps
            .lock()
            .unwrap()
            .insert(root.path().into(), 200 * MIB);
        reader
            .caps
            .lock()
            .unwrap()
            .insert(task_cg.clone(), 64 * MIB);
        let (m, outbox) = monitor(root.path(), reader, Vec::new());
        assert_eq!(
            m.workers()[0].soft_cap_bytes,
            Some(200 * MIB),
            "worker cap from its cgroup"
        );
        m.register(super::task("t1", Some(MemorySource::Cgroup(task_cg))))
            .unwrap();
        assert_eq!(
            m.tasks()[0].soft_cap_bytes,
            Some(64 * MIB),
            "task cap from its cgroup"
        );
        assert_eq!(outbox.read(0, 1)[0].body.soft_cap_bytes, Some(64 * MIB));
    }

    #[tokio::test]
    async fn cgroups_matching_a_rule_become_tasks_and_end_when_removed() {
        let root = tempfile::tempdir().unwrap();
        let rule = Rule {
            worker: "w1".into(),
            pattern: glob::Pattern::new(&format!("{}/job_*", root.path().display())).unwrap(),
            soft_cap: Some(32 * MIB),
        };
        let reader = FakeReader::default();
        reader.set(MemorySource::Cgroup(root.path().into()), 10 * MIB);
        let (m, outbox) = monitor(root.path(), reader, vec![rule]);
        fs::create_dir(root.path().join("job_1")).unwrap();
        fs::create_dir(root.path().join("other")).unwrap();
        m.tick();
        let tasks = m.tasks();
        assert_eq!(tasks.len(), 1, "{tasks:?}");
        assert_eq!(tasks[0].task_id, "job_1");
        assert_eq!(tasks[0].soft_cap_bytes, Some(32 * MIB));
        assert_eq!(tasks[0].owner, "agent", "only an admin ends a rule's task");
        m.tick();
        assert_eq!(kinds(&outbox), [EventKind::TaskStarted], "seen once");

        fs::remove_dir(root.path().join("job_1")).unwrap();
        m.tick();
        assert!(m.tasks().is_empty());
        let events = outbox.read(0, 100);
        assert_eq!(
            kinds(&outbox),
            [EventKind::TaskStarted, EventKind::TaskFinished]
        );
        assert_eq!(events[1].body.reason.as_deref(), Some("cgroup removed"));
    }
}

mod restart {
    use std::{fs, time::Duration};

    use super::super::*;
    use crate::{
        cgroup::CgroupVersion, daemon::sampler::fake::FakeReader, outbox::Limits, outbox::Outbox,
        telemetry::Metrics,
    };

    const MIB: u64 = 1 << 20;

    /// A monitor on the state directory `state`, as a (re)started agent
    /// makes it: worker w1 (the cgroup `root`, soft cap 100 MiB).
    fn start(state: &Path, root: &Path, reader: Arc<FakeReader>) -> Monitor {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox =
            Outbox::open(state, String::from("h"), Limits::default(), metrics.clone()).unwrap();
        let worker = super::w1(MemorySource::Cgroup(root.into()), Some(100 * MIB));
        let m = super::monitor_of(
            worker,
            Vec::new(),
            (root, CgroupVersion::V1),
            reader,
            outbox,
            metrics,
        );
        m.restore();
        m
    }

    #[tokio::test]
    async fn running_tasks_survive_a_restart_and_their_memory_is_not_residual() {
        let state = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let (busy, gone, ended) = (
            root.path().join("busy"),
            root.path().join("gone"),
            root.path().join("ended"),
        );
        for dir in [&busy, &gone, &ended] {
            fs::create_dir(dir).unwrap();
        }
        let reader = Arc::new(FakeReader::default());
        // The worker holds 150 MiB, all of it the running task's.
        reader.set(MemorySource::Cgroup(root.path().into()), 150 * MIB);
        reader.set(MemorySource::Cgroup(busy.clone()), 150 * MIB);
        let m = start(state.path(), root.path(), reader.clone());
        for (id, dir) in [("busy", &busy), ("gone", &gone), ("ended", &ended)] {
            m.register(super::task(id, Some(MemorySource::Cgroup(dir.clone()))))
                .unwrap();
        }
        m.finish("ended", TaskOutcome::Ended { exit_code: Some(0) })
            .unwrap();
        drop(m);

        // Restarted: "gone"'s cgroup vanished meanwhile.
        fs::remove_dir(&gone).unwrap();
        let m = start(state.path(), root.path(), reader);
        let ids: Vec<String> = m.tasks().into_iter().map(|t| t.task_id).collect();
        assert_eq!(ids, ["busy"]);
        // A new task starts: the 150 MiB are busy's, not residual.
        let answer = m.register(super::task("next", None)).unwrap();
        assert_eq!(answer.admission, Admission::Accepted);
        assert_eq!(m.workers()[0].status, Health::Healthy);
    }

    fn count(m: &Monitor, kind: EventKind) -> usize {
        m.recorder
            .outbox()
            .read(0, 1000)
            .iter()
            .filter(|e| e.body.kind == kind)
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn an_unhealthy_worker_stays_unhealthy_across_a_restart_and_recovers_once() {
        let state = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let reader = Arc::new(FakeReader::default());
        // 150 MiB and no running task: residual over the 100 MiB cap.
        reader.set(MemorySource::Cgroup(root.path().into()), 150 * MIB);
        let m = start(state.path(), root.path(), reader.clone());
        let task = |id: &str| super::task(id, None);
        m.register(task("first")).unwrap();
        assert_eq!(m.workers()[0].status, Health::Unhealthy);
        assert_eq!(count(&m, EventKind::WorkerUnhealthy), 1);
        drop(m);

        // Restarted: still unhealthy, and not said a second time, however
        // long the memory stays over the cap.
        let m = start(state.path(), root.path(), reader.clone());
        assert_eq!(m.workers()[0].status, Health::Unhealthy);
        assert!(
            m.workers()[0]
                .reasons
                .iter()
                .any(|r| r.contains("residual")),
            "{:?}",
            m.workers()[0].reasons
        );
        for _ in 0..3 {
            m.tick();
            tokio::time::advance(Duration::from_secs(61)).await;
        }
        m.tick();
        assert_eq!(count(&m, EventKind::WorkerUnhealthy), 1);
        assert_eq!(count(&m, EventKind::SoftCapExceeded), 0);

        // The memory goes: recovered after recover_after, said once.
        reader.set(MemorySource::Cgroup(root.path().into()), 10 * MIB);
        m.tick();
        tokio::time::advance(Duration::from_secs(31)).await;
        m.tick();
        assert_eq!(m.workers()[0].status, Health::Healthy);
        assert_eq!(count(&m, EventKind::WorkerRecovered), 1);
        drop(m);

        // Restarted again: healthy, nothing kept.
        let m = start(state.path(), root.path(), reader);
        assert_eq!(m.workers()[0].status, Health::Healthy);
        assert_eq!(count(&m, EventKind::WorkerRecovered), 1);
    }

    /// Owners are kept across a restart, and a task kept by the build
    /// before owners (its row has none) still comes back: owned by
    /// `anonymous`, so exactly those who could end it then may end it now.
    #[tokio::test]
    async fn kept_tasks_of_an_older_build_come_back_and_owners_survive_a_restart() {
        let state = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let (old, new) = (root.path().join("old"), root.path().join("new"));
        fs::create_dir(&old).unwrap();
        fs::create_dir(&new).unwrap();
        let reader = Arc::new(FakeReader::default());
        let m = start(state.path(), root.path(), reader.clone());
        m.register(TaskRequest {
            owner: "uid:1000".into(),
            ..super::task("new", Some(MemorySource::Cgroup(new.clone())))
        })
        .unwrap();
        drop(m);

        // The row as the build before owners wrote it: no `owner`.
        let mut legacy = serde_json::to_value(TaskRequest {
            task_id: "old".into(),
            worker: None,
            source: Some(MemorySource::Cgroup(old.clone())),
            soft_cap: Some(MIB),
            owner: String::new(),
        })
        .unwrap();
        legacy.as_object_mut().unwrap().remove("owner");
        let row = serde_json::json!({ "v": 1, "task": legacy }).to_string();
        let db = rusqlite::Connection::open(state.path().join("outbox.sqlite")).unwrap();
        db.execute(
            "INSERT INTO tasks (task_id, json) VALUES ('old', ?1)",
            [row],
        )
        .unwrap();
        drop(db);

        let m = start(state.path(), root.path(), reader);
        let mut owners: Vec<(String, String)> = m
            .tasks()
            .into_iter()
            .map(|t| (t.task_id, t.owner))
            .collect();
        owners.sort();
        assert_eq!(
            owners,
            [
                ("new".to_string(), "uid:1000".to_string()),
                ("old".into(), "anonymous".into())
            ]
        );
        let ended = TaskOutcome::Ended { exit_code: None };
        assert!(matches!(
            m.finish_by("old", ended.clone(), Some("uid:1000")),
            Err(WatchdogError::NotOwner { .. })
        ));
        assert!(matches!(
            m.finish_by("new", ended.clone(), Some("anonymous")),
            Err(WatchdogError::NotOwner { .. })
        ));
        m.finish_by("old", ended.clone(), Some("anonymous"))
            .unwrap();
        m.finish_by("new", ended, None).unwrap();
        assert!(m.tasks().is_empty());
    }
}

mod rejections {
    use super::super::*;
    use crate::{
        cgroup::CgroupVersion, daemon::sampler::fake::FakeReader, outbox::Outbox,
        telemetry::Metrics,
    };

    const MIB: u64 = 1 << 20;

    #[tokio::test(start_paused = true)]
    async fn a_loop_of_rejected_registrations_records_one_event_per_interval() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 1000, metrics.clone());
        let reader = FakeReader::default();
        // 300 MiB of residual memory over a 100 MiB cap: every task is rejected.
        reader.set(MemorySource::Cgroup("/cg/w1".into()), 300 * MIB);
        let m = super::monitor_of(
            super::w1(MemorySource::Cgroup("/cg/w1".into()), Some(100 * MIB)),
            Vec::new(),
            (Path::new("/cg"), CgroupVersion::V1),
            Arc::new(reader),
            outbox.clone(),
            metrics.clone(),
        );
        let task = |n: usize| super::task(format!("t{n}"), None);
        let rejected = |outbox: &Outbox| {
            outbox
                .read(0, 1000)
                .iter()
                .filter(|e| e.body.kind == EventKind::TaskRejected)
                .count()
        };
        for n in 0..50 {
            let answer = m.register(task(n)).unwrap();
            assert!(matches!(answer.admission, Admission::Rejected { .. }));
        }
        assert_eq!(rejected(&outbox), 1, "one event for fifty answers");
        assert_eq!(
            metrics
                .events_dropped
                .with_label_values(&["rate_limited"])
                .get(),
            49
        );
        tokio::time::advance(REJECTION_INTERVAL).await;
        m.register(task(50)).unwrap();
        assert_eq!(rejected(&outbox), 2, "one more after the interval");
    }
}

/// The pressure rule and the kernel's memory events, from fixture files'
/// text through the fake reader, on a paused clock.
mod pressure {
    use std::time::Duration;

    use super::super::*;
    use crate::{
        cgroup::CgroupVersion,
        daemon::sampler::fake::FakeReader,
        model::spec::PressureRule,
        outbox::{Limits, Outbox},
        telemetry::Metrics,
    };

    const MIB: u64 = 1 << 20;

    /// Worker w1 (cgroup `/cg/w1`, soft cap 100 MiB, 10 MiB used: never
    /// over it), with `pressure_limit = 0.2`, `pressure_after = "60s"`,
    /// `recover_after = "30s"`; its outbox in `state` when given.
    fn start(state: Option<&Path>, reader: Arc<FakeReader>) -> (Monitor, Metrics) {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = match state {
            Some(dir) => {
                Outbox::open(dir, String::from("h"), Limits::default(), metrics.clone()).unwrap()
            }
            None => Outbox::new("h", 1000, metrics.clone()),
        };
        reader.set(MemorySource::Cgroup("/cg/w1".into()), 10 * MIB);
        let worker = WorkerSpec {
            pressure: Some(PressureRule {
                limit_bp: 2000,
                after: Duration::from_secs(60),
            }),
            ..super::w1(MemorySource::Cgroup("/cg/w1".into()), Some(100 * MIB))
        };
        let m = super::monitor_of(
            worker,
            Vec::new(),
            (Path::new("/cg"), CgroupVersion::V2),
            reader,
            outbox,
            metrics.clone(),
        );
        m.restore();
        (m, metrics)
    }

    fn psi(reader: &FakeReader, some_avg10: &str) {
        reader.set_pressure(
            Path::new("/cg/w1"),
            &format!(
                "some avg10={some_avg10} avg60=10.00 avg300=2.00 total=4000000\n\
                 full avg10=1.00 avg60=0.50 avg300=0.10 total=1000000\n"
            ),
        );
    }

    fn events(m: &Monitor, kind: EventKind) -> Vec<EventBody> {
        m.recorder
            .outbox()
            .read(0, 1000)
            .into_iter()
            .filter(|e| e.body.kind == kind)
            .map(|e| e.body)
            .collect()
    }

    fn status(m: &Monitor) -> (Health, String) {
        let w = m.workers().remove(0);
        (w.status, w.reasons.join("; "))
    }

    #[tokio::test(start_paused = true)]
    async fn pressure_above_the_limit_degrades_then_makes_unhealthy_then_recovers() {
        let reader = Arc::new(FakeReader::default());
        let (m, metrics) = start(None, reader.clone());
        psi(&reader, "30.00");
        m.tick();
        let (health, reason) = status(&m);
        assert_eq!(health, Health::Degraded, "{reason}");
        assert!(
            reason.contains(
                "memory pressure (PSI some avg10 30.00%) above the limit 20.00% for 0s of 60s"
            ),
            "{reason}"
        );
        let ratio = metrics
            .memory_pressure
            .with_label_values(&["worker", "w1", "some", "10s"])
            .get();
        assert!((ratio - 0.3).abs() < 1e-12, "{ratio}");
        tokio::time::advance(Duration::from_secs(30)).await;
        m.tick();
        assert!(status(&m).1.contains("30s of 60s"), "{}", status(&m).1);
        assert!(events(&m, EventKind::WorkerUnhealthy).is_empty());

        tokio::time::advance(Duration::from_secs(31)).await;
        m.tick();
        let (health, reason) = status(&m);
        assert_eq!(health, Health::Unhealthy, "{reason}");
        let unhealthy = events(&m, EventKind::WorkerUnhealthy);
        assert_eq!(unhealthy.len(), 1);
        assert_eq!(unhealthy[0].worker.as_deref(), Some("w1"));
        let said = unhealthy[0].reason.as_deref().unwrap();
        assert!(
            said.starts_with(
                "memory pressure: some tasks stalled on memory 30.00% of the last 10 s"
            ) && said.contains("above the limit 20.00%, for 61s"),
            "{said}"
        );
        assert_eq!(
            metrics
                .worker_transitions
                .with_label_values(&["w1", "unhealthy"])
                .get(),
            1
        );
        // New tasks are refused, as for the soft-cap checks.
        let answer = m.register(super::task("t", None)).unwrap();
        assert!(matches!(answer.admission, Admission::Rejected { .. }));

        // Memory is far below the soft cap: that does not recover it.
        // Below the limit but within the hysteresis (19.5 % > 19 %): neither.
        psi(&reader, "19.50");
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(20)).await;
            m.tick();
        }
        assert_eq!(status(&m).0, Health::Unhealthy);

        // Clearly below for recover_after: recovered, said once.
        psi(&reader, "5.00");
        m.tick();
        tokio::time::advance(Duration::from_secs(15)).await;
        m.tick();
        assert!(status(&m).1.contains("recovering"), "{}", status(&m).1);
        tokio::time::advance(Duration::from_secs(16)).await;
        m.tick();
        m.tick();
        assert_eq!(status(&m), (Health::Healthy, String::new()));
        let recovered = events(&m, EventKind::WorkerRecovered);
        assert_eq!(recovered.len(), 1);
        assert!(
            recovered[0]
                .reason
                .as_deref()
                .unwrap()
                .contains("memory pressure (PSI some avg10 5.00%) below the limit 20.00% for 31s"),
            "{:?}",
            recovered[0].reason
        );
        assert_eq!(events(&m, EventKind::WorkerUnhealthy).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dip_restarts_the_countdown_and_no_psi_skips_the_rule() {
        let reader = Arc::new(FakeReader::default());
        let (m, _) = start(None, reader.clone());
        // No memory.pressure (cgroup v1, or no PSI): the rule does nothing.
        for _ in 0..5 {
            m.tick();
            tokio::time::advance(Duration::from_secs(30)).await;
        }
        assert_eq!(status(&m).0, Health::Healthy);
        psi(&reader, "25.00");
        m.tick();
        tokio::time::advance(Duration::from_secs(50)).await;
        m.tick();
        psi(&reader, "1.00");
        m.tick();
        assert_eq!(
            status(&m).0,
            Health::Healthy,
            "clearly below: the clock stops"
        );
        psi(&reader, "25.00");
        m.tick();
        tokio::time::advance(Duration::from_secs(50)).await;
        m.tick();
        assert_eq!(status(&m).0, Health::Degraded, "50 s of 60 s again");
        assert!(events(&m, EventKind::WorkerUnhealthy).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pressure_verdict_survives_a_restart_and_recovers_once() {
        let state = tempfile::tempdir().unwrap();
        let reader = Arc::new(FakeReader::default());
        let (m, _) = start(Some(state.path()), reader.clone());
        psi(&reader, "50.00");
        m.tick();
        tokio::time::advance(Duration::from_secs(60)).await;
        m.tick();
        assert_eq!(status(&m).0, Health::Unhealthy);
        drop(m);

        let (m, _) = start(Some(state.path()), reader.clone());
        let (health, reason) = status(&m);
        assert_eq!(health, Health::Unhealthy);
        assert!(reason.contains("memory pressure: "), "{reason}");
        // Still above, for long: not said again (neither a soft-cap crossing).
        for _ in 0..3 {
            m.tick();
            tokio::time::advance(Duration::from_secs(61)).await;
        }
        assert_eq!(events(&m, EventKind::WorkerUnhealthy).len(), 1);
        assert!(events(&m, EventKind::SoftCapExceeded).is_empty());
        psi(&reader, "0.00");
        m.tick();
        tokio::time::advance(Duration::from_secs(30)).await;
        m.tick();
        assert_eq!(status(&m).0, Health::Healthy);
        assert_eq!(events(&m, EventKind::WorkerRecovered).len(), 1);
        drop(m);
        let (m, _) = start(Some(state.path()), reader);
        assert_eq!(status(&m).0, Health::Healthy);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_events_become_counters_and_throttling_one_event() {
        let reader = Arc::new(FakeReader::default());
        *reader.host_pressure.lock().unwrap() =
            crate::cgroup::pressure::parse("some avg10=0.00 avg60=0.00 avg300=0.01 total=878361\n")
                .pressure;
        let (m, metrics) = start(None, reader.clone());
        let cg = Path::new("/cg/w1");
        let high =
            |n: u64| format!("low 0\nhigh {n}\nmax 1\noom 0\noom_kill 0\noom_group_kill 0\n");
        for n in [10, 10, 14, 20, 31] {
            reader.set_events(cg, &high(n));
            m.tick();
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        let counter = |event| {
            metrics
                .memory_events
                .with_label_values(&["w1", event])
                .get()
        };
        assert_eq!(
            (counter("high"), counter("max"), counter("oom")),
            (31, 1, 0)
        );
        let throttled = events(&m, EventKind::MemoryHighThrottled);
        assert_eq!(throttled.len(), 1, "{throttled:?}");
        assert_eq!(throttled[0].worker.as_deref(), Some("w1"));
        assert_eq!(throttled[0].count, Some(4));
        assert_eq!(throttled[0].cgroup.as_deref(), Some("/cg/w1"));
        // Still for a minute, then throttled again: a second event.
        for _ in 0..7 {
            m.tick();
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        reader.set_events(cg, &high(40));
        m.tick();
        assert_eq!(events(&m, EventKind::MemoryHighThrottled).len(), 2);
        assert_eq!(counter("high"), 40);
        // The host's PSI is published too; no `full` line, no `full` series.
        let stall = metrics
            .memory_pressure_stall
            .with_label_values(&["host", "", "some"])
            .get();
        assert!((stall - 0.878361).abs() < 1e-9, "{stall}");
    }
}
