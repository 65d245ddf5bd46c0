//! The monitor with fake memory figures: soft caps, rule tasks, restarts,
//! rejections.

mod basics {
    use std::{fs, time::Duration};

    use super::super::*;
    use crate::{
        cgroup::CgroupVersion, daemon::sampler::fake::FakeReader, model::event::EventKind,
        outbox::Outbox, telemetry::Metrics,
    };

    const MIB: u64 = 1 << 20;

    fn monitor(root: &Path, reader: FakeReader, rules: Vec<Rule>) -> (Monitor, Outbox) {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics.clone());
        let worker = WorkerSpec {
            name: "w1".into(),
            source: MemorySource::Cgroup(root.into()),
            soft_cap: None,
            unhealthy_after: Duration::from_secs(60),
            recover_after: Duration::from_secs(30),
            pressure: None,
        };
        let hierarchy = MemoryHierarchy {
            root: root.into(),
            version: CgroupVersion::V1,
        };
        let m = Monitor::new(
            vec![worker],
            Settings::default(),
            rules,
            hierarchy,
            Arc::new(reader),
            Recorder::new(outbox.clone(), metrics),
        );
        (m, outbox)
    }

    fn kinds(outbox: &Outbox) -> Vec<EventKind> {
        outbox.read(0, 100).iter().map(|e| e.body.kind).collect()
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
        m.register(TaskRequest {
            task_id: "t1".into(),
            worker: None,
            source: Some(MemorySource::Cgroup(task_cg)),
            soft_cap: None,
            owner: crate::model::spec::ANONYMOUS.into(),
        })
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
        let worker = WorkerSpec {
            name: "w1".into(),
            source: MemorySource::Cgroup(root.into()),
            soft_cap: Some(100 * MIB),
            unhealthy_after: Duration::from_secs(60),
            recover_after: Duration::from_secs(30),
            pressure: None,
        };
        let m = Monitor::new(
            vec![worker],
            Settings::default(),
            Vec::new(),
            MemoryHierarchy {
                root: root.into(),
                version: CgroupVersion::V1,
            },
            reader,
            Recorder::new(outbox, metrics),
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
            m.register(TaskRequest {
                task_id: id.into(),
                worker: None,
                source: Some(MemorySource::Cgroup(dir.clone())),
                soft_cap: None,
                owner: crate::model::spec::ANONYMOUS.into(),
            })
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
        let answer = m
            .register(TaskRequest {
                task_id: "next".into(),
                worker: None,
                source: None,
                soft_cap: None,
                owner: crate::model::spec::ANONYMOUS.into(),
            })
            .unwrap();
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
        let task = |id: &str| TaskRequest {
            task_id: id.into(),
            worker: None,
            source: None,
            soft_cap: None,
            owner: crate::model::spec::ANONYMOUS.into(),
        };
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
            task_id: "new".into(),
            worker: None,
            source: Some(MemorySource::Cgroup(new.clone())),
            soft_cap: None,
            owner: "uid:1000".into(),
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
    use std::time::Duration;

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
        let m = Monitor::new(
            vec![WorkerSpec {
                name: "w1".into(),
                source: MemorySource::Cgroup("/cg/w1".into()),
                soft_cap: Some(100 * MIB),
                unhealthy_after: Duration::from_secs(60),
                recover_after: Duration::from_secs(30),
                pressure: None,
            }],
            Settings::default(),
            Vec::new(),
            MemoryHierarchy {
                root: "/cg".into(),
                version: CgroupVersion::V1,
            },
            Arc::new(reader),
            Recorder::new(outbox.clone(), metrics.clone()),
        );
        let task = |n: usize| TaskRequest {
            task_id: format!("t{n}"),
            worker: None,
            source: None,
            soft_cap: None,
            owner: crate::model::spec::ANONYMOUS.into(),
        };
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
