//! Every transition of the watchdog, on a paused clock.

use std::time::Duration;

use tokio::time::advance;

use super::*;
use crate::model::spec::HOST_WORKER;

const MIB: u64 = 1 << 20;

fn spec(name: &str, cap: u64) -> WorkerSpec {
    WorkerSpec {
        name: name.into(),
        source: MemorySource::Cgroup(format!("/sys/fs/cgroup/memory/{name}").into()),
        soft_cap: Some(cap),
        unhealthy_after: Duration::from_secs(60),
        recover_after: Duration::from_secs(30),
        pressure: None,
    }
}

fn watchdog() -> Watchdog {
    Watchdog::new(vec![spec("w1", 200 * MIB)], Settings::default())
}

fn sample(worker: u64, tasks: &[(&str, u64)]) -> Sample {
    Sample {
        workers: [("w1".to_string(), worker)].into_iter().collect(),
        tasks: tasks.iter().map(|(id, m)| (id.to_string(), *m)).collect(),
        ..Sample::default()
    }
}

fn request(id: &str) -> TaskRequest {
    TaskRequest {
        task_id: id.into(),
        worker: None,
        source: Some(MemorySource::Cgroup(
            format!("/sys/fs/cgroup/memory/w1/{id}").into(),
        )),
        soft_cap: None,
        owner: crate::model::spec::ANONYMOUS.into(),
    }
}

fn kinds(events: &[EventBody]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

fn health(w: &Watchdog) -> Health {
    w.workers()[0].status
}

/// Samples every second for `secs` seconds; returns every event.
async fn hold(w: &mut Watchdog, s: &Sample, secs: u64) -> Vec<EventBody> {
    let mut events = Vec::new();
    for _ in 0..secs {
        events.extend(w.observe(s, Instant::now()));
        advance(Duration::from_secs(1)).await;
    }
    events
}

#[tokio::test(start_paused = true)]
async fn task_on_a_clean_worker_is_accepted() {
    let mut w = watchdog();
    let r = w
        .register(
            request("t1"),
            &sample(50 * MIB, &[("t1", 0)]),
            Instant::now(),
        )
        .unwrap();
    assert_eq!(r.admission, Admission::Accepted);
    assert_eq!(kinds(&r.events), [EventKind::TaskStarted]);
    assert_eq!(r.events[0].task_id.as_deref(), Some("t1"));
    assert_eq!(r.events[0].worker.as_deref(), Some("w1"));
    assert_eq!(w.tasks(Instant::now()).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn residual_over_cap_at_task_start_rejects_and_marks_unhealthy() {
    let mut w = watchdog();
    // 300 MiB on the worker, 20 MiB of it a running task: residual 280 MiB > 200 MiB.
    w.register(
        request("t0"),
        &sample(10 * MIB, &[("t0", 0)]),
        Instant::now(),
    )
    .unwrap();
    let r = w
        .register(
            request("t1"),
            &sample(300 * MIB, &[("t0", 20 * MIB)]),
            Instant::now(),
        )
        .unwrap();
    let Admission::Rejected { reason } = &r.admission else {
        panic!("{:?}", r.admission)
    };
    assert!(reason.contains("residual memory 280.0 MiB"), "{reason}");
    assert!(reason.contains("soft cap 200.0 MiB"), "{reason}");
    assert_eq!(
        kinds(&r.events),
        [EventKind::WorkerUnhealthy, EventKind::TaskRejected]
    );
    assert_eq!(health(&w), Health::Unhealthy);
    // The rejected task is not tracked; a second one is refused too, with no new unhealthy event.
    assert_eq!(w.tasks(Instant::now()).len(), 1);
    let r = w
        .register(request("t2"), &sample(300 * MIB, &[]), Instant::now())
        .unwrap();
    assert!(matches!(r.admission, Admission::Rejected { .. }));
    assert_eq!(kinds(&r.events), [EventKind::TaskRejected]);
}

#[tokio::test(start_paused = true)]
async fn running_tasks_memory_is_not_residual() {
    let mut w = watchdog();
    w.register(
        request("t0"),
        &sample(10 * MIB, &[("t0", 0)]),
        Instant::now(),
    )
    .unwrap();
    // Worker at 300 MiB, of which the running task holds 250 MiB: residual 50 MiB.
    let r = w
        .register(
            request("t1"),
            &sample(300 * MIB, &[("t0", 250 * MIB)]),
            Instant::now(),
        )
        .unwrap();
    assert_eq!(r.admission, Admission::Accepted);
    assert_eq!(health(&w), Health::Healthy);
}

#[tokio::test(start_paused = true)]
async fn flag_policy_accepts_but_still_marks_unhealthy() {
    let settings = Settings {
        on_residual_over_cap: OnResidualOverCap::Flag,
        ..Settings::default()
    };
    let mut w = Watchdog::new(vec![spec("w1", 200 * MIB)], settings);
    let r = w
        .register(request("t1"), &sample(300 * MIB, &[]), Instant::now())
        .unwrap();
    assert!(
        matches!(r.admission, Admission::Flagged { .. }),
        "{:?}",
        r.admission
    );
    assert_eq!(
        kinds(&r.events),
        [EventKind::WorkerUnhealthy, EventKind::TaskStarted]
    );
    assert!(
        r.events[1]
            .reason
            .as_deref()
            .unwrap()
            .starts_with("flagged: worker w1 is unhealthy")
    );
    assert_eq!(health(&w), Health::Unhealthy);
}

#[tokio::test(start_paused = true)]
async fn retried_registration_is_idempotent() {
    let mut w = watchdog();
    w.register(request("t1"), &sample(10 * MIB, &[]), Instant::now())
        .unwrap();
    let again = w
        .register(request("t1"), &sample(10 * MIB, &[]), Instant::now())
        .unwrap();
    assert_eq!(again.admission, Admission::Accepted);
    assert!(again.events.is_empty());
}

#[tokio::test(start_paused = true)]
async fn unknown_or_ambiguous_worker_is_an_error() {
    let mut w = Watchdog::new(vec![spec("a", MIB), spec("b", MIB)], Settings::default());
    let mut req = request("t1");
    assert_eq!(
        w.register(req.clone(), &Sample::default(), Instant::now())
            .unwrap_err(),
        WatchdogError::WorkerRequired("a, b".into())
    );
    req.worker = Some("c".into());
    assert_eq!(
        w.register(req, &Sample::default(), Instant::now())
            .unwrap_err(),
        WatchdogError::UnknownWorker("c".into())
    );
}

#[tokio::test(start_paused = true)]
async fn no_configured_worker_means_the_host() {
    let w = Watchdog::new(Vec::new(), Settings::default());
    assert_eq!(w.resolve_worker(None).unwrap(), HOST_WORKER);
    assert_eq!(
        w.worker_sources(),
        [(HOST_WORKER.to_string(), MemorySource::Host)]
    );
}

#[tokio::test(start_paused = true)]
async fn task_soft_cap_crossing_fires_once_with_growth_rate() {
    let mut w = watchdog();
    let mut req = request("t1");
    req.soft_cap = Some(64 * MIB);
    w.register(req, &sample(0, &[("t1", 0)]), Instant::now())
        .unwrap();
    let mut events = Vec::new();
    for step in 1..=8u64 {
        advance(Duration::from_secs(1)).await;
        events.extend(w.observe(
            &sample(step * 16 * MIB, &[("t1", step * 16 * MIB)]),
            Instant::now(),
        ));
    }
    let crossings: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::SoftCapExceeded && e.task_id.is_some())
        .collect();
    assert_eq!(crossings.len(), 1, "{events:?}");
    assert_eq!(crossings[0].task_id.as_deref(), Some("t1"));
    assert_eq!(crossings[0].rss_bytes, Some(80 * MIB));
    assert_eq!(crossings[0].soft_cap_bytes, Some(64 * MIB));
    assert_eq!(crossings[0].growth_bytes_per_sec, Some((16 * MIB) as i64));
}

#[tokio::test(start_paused = true)]
async fn stuck_above_cap_with_no_growing_task_becomes_unhealthy_after_the_delay() {
    let mut w = watchdog();
    let high = sample(250 * MIB, &[]);
    let events = hold(&mut w, &high, 60).await;
    // Degraded for the first 60 s (crossing reported once), not yet unhealthy.
    assert_eq!(kinds(&events), [EventKind::SoftCapExceeded]);
    assert_eq!(health(&w), Health::Degraded);
    assert!(
        w.workers()[0].reasons[0].contains("with no task growing"),
        "{:?}",
        w.workers()[0].reasons
    );
    let events = hold(&mut w, &high, 1).await;
    assert_eq!(kinds(&events), [EventKind::WorkerUnhealthy]);
    assert!(
        events[0]
            .reason
            .as_deref()
            .unwrap()
            .starts_with("unmanaged memory: 250.0 MiB")
    );
    assert_eq!(health(&w), Health::Unhealthy);
}

#[tokio::test(start_paused = true)]
async fn a_growing_task_holds_off_the_unhealthy_verdict() {
    let mut w = watchdog();
    w.register(request("t1"), &sample(0, &[("t1", 0)]), Instant::now())
        .unwrap();
    let mut events = Vec::new();
    for step in 0..120u64 {
        // The task grows 2 MiB/s the whole time; the worker stays over its cap.
        let task = step * 2 * MIB;
        events.extend(w.observe(&sample(250 * MIB + task, &[("t1", task)]), Instant::now()));
        advance(Duration::from_secs(1)).await;
    }
    assert!(
        !kinds(&events).contains(&EventKind::WorkerUnhealthy),
        "{events:?}"
    );
    assert_eq!(health(&w), Health::Degraded);
    // Once it stops growing, the clock runs: unhealthy after unhealthy_after.
    let flat = sample(490 * MIB, &[("t1", 240 * MIB)]);
    let events = hold(&mut w, &flat, 75).await;
    assert_eq!(kinds(&events), [EventKind::WorkerUnhealthy]);
}

#[tokio::test(start_paused = true)]
async fn recovery_needs_recover_after_clearly_below_the_cap() {
    let mut w = watchdog();
    hold(&mut w, &sample(250 * MIB, &[]), 61).await;
    assert_eq!(health(&w), Health::Unhealthy);
    // Just under the cap is inside the hysteresis band: no recovery.
    let events = hold(&mut w, &sample(195 * MIB, &[]), 40).await;
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(health(&w), Health::Unhealthy);
    // Clearly below: recovered after 30 s, not before.
    let low = sample(100 * MIB, &[]);
    assert!(hold(&mut w, &low, 30).await.is_empty());
    assert_eq!(health(&w), Health::Unhealthy);
    assert!(
        w.workers()[0]
            .reasons
            .iter()
            .any(|r| r.starts_with("recovering"))
    );
    let events = hold(&mut w, &low, 1).await;
    assert_eq!(kinds(&events), [EventKind::WorkerRecovered]);
    assert_eq!(health(&w), Health::Healthy);
}

#[tokio::test(start_paused = true)]
async fn flapping_around_the_cap_neither_recovers_nor_refires() {
    let mut w = watchdog();
    hold(&mut w, &sample(250 * MIB, &[]), 61).await;
    let mut events = Vec::new();
    for i in 0..100 {
        let m = if i % 2 == 0 { 205 * MIB } else { 196 * MIB };
        events.extend(hold(&mut w, &sample(m, &[]), 1).await);
    }
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(health(&w), Health::Unhealthy);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_recovers_then_relapses_goes_unhealthy_again() {
    let mut w = watchdog();
    let high = sample(250 * MIB, &[]);
    hold(&mut w, &high, 61).await;
    hold(&mut w, &sample(100 * MIB, &[]), 31).await;
    assert_eq!(health(&w), Health::Healthy);
    let events = hold(&mut w, &high, 62).await;
    assert_eq!(
        kinds(&events),
        [EventKind::SoftCapExceeded, EventKind::WorkerUnhealthy],
        "a new crossing, then unhealthy again"
    );
}

#[tokio::test(start_paused = true)]
async fn residual_unhealthy_recovers_on_residual_not_total() {
    let mut w = watchdog();
    w.register(request("t0"), &sample(0, &[("t0", 0)]), Instant::now())
        .unwrap();
    w.register(
        request("t1"),
        &sample(300 * MIB, &[("t0", 0)]),
        Instant::now(),
    )
    .unwrap();
    assert_eq!(health(&w), Health::Unhealthy);
    // The leftover is gone; the worker is high only because its task is big.
    let events = hold(&mut w, &sample(300 * MIB, &[("t0", 290 * MIB)]), 31).await;
    assert_eq!(
        kinds(&events).last(),
        Some(&EventKind::WorkerRecovered),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn operator_reset_clears_unhealthy_at_once() {
    let mut w = watchdog();
    w.register(request("t1"), &sample(300 * MIB, &[]), Instant::now())
        .unwrap();
    assert_eq!(health(&w), Health::Unhealthy);
    let events = w.reset("w1").unwrap();
    assert_eq!(kinds(&events), [EventKind::WorkerRecovered]);
    assert_eq!(events[0].reason.as_deref(), Some("operator reset"));
    assert_eq!(health(&w), Health::Healthy);
    assert!(
        w.reset("w1").unwrap().is_empty(),
        "resetting a healthy worker says nothing"
    );
    assert_eq!(
        w.reset("nope").unwrap_err(),
        WatchdogError::UnknownWorker("nope".into())
    );
}

#[tokio::test(start_paused = true)]
async fn oom_kill_is_attributed_to_the_innermost_task_which_ends_killed() {
    let mut w = watchdog();
    w.register(request("t1"), &sample(0, &[]), Instant::now())
        .unwrap();
    let victim = Path::new("/sys/fs/cgroup/memory/w1/t1/sub");
    let (task, worker, events) = w.attribute_oom(Some(victim), 4242, Instant::now());
    assert_eq!(
        (task.as_deref(), worker.as_deref()),
        (Some("t1"), Some("w1"))
    );
    assert_eq!(kinds(&events), [EventKind::TaskFinished]);
    assert_eq!(events[0].reason.as_deref(), Some("OOM-killed"));
    assert!(w.tasks(Instant::now()).is_empty());
    // The client's DELETE afterwards is answered with the final state.
    let (view, events) = w
        .finish(
            "t1",
            TaskOutcome::Ended {
                exit_code: Some(137),
            },
            Instant::now(),
        )
        .unwrap();
    assert_eq!(view.outcome, Some(TaskOutcome::OomKilled));
    assert!(events.is_empty());
    // A victim outside any task but inside the worker names the worker only.
    let (task, worker, _) = w.attribute_oom(
        Some(Path::new("/sys/fs/cgroup/memory/w1/x")),
        1,
        Instant::now(),
    );
    assert_eq!((task, worker.as_deref()), (None, Some("w1")));
    assert_eq!(
        w.finish("zz", TaskOutcome::OomKilled, Instant::now())
            .unwrap_err(),
        WatchdogError::UnknownTask("zz".into())
    );
}

#[tokio::test(start_paused = true)]
async fn oom_record_read_after_the_client_ended_the_task_still_names_it() {
    let mut w = watchdog();
    w.register(request("t1"), &sample(0, &[]), Instant::now())
        .unwrap();
    w.finish("t1", TaskOutcome::OomKilled, Instant::now())
        .unwrap();
    let (task, worker, events) = w.attribute_oom(
        Some(Path::new("/sys/fs/cgroup/memory/w1/t1")),
        7,
        Instant::now(),
    );
    assert_eq!(
        (task.as_deref(), worker.as_deref()),
        (Some("t1"), Some("w1"))
    );
    assert!(events.is_empty(), "the task ended once");
}

#[tokio::test(start_paused = true)]
async fn a_worker_takes_no_more_tasks_than_its_bound() {
    let settings = Settings {
        max_tasks_per_worker: 2,
        ..Settings::default()
    };
    let mut w = Watchdog::new(vec![spec("w1", 200 * MIB)], settings);
    let s = sample(10 * MIB, &[]);
    w.register(request("t1"), &s, Instant::now()).unwrap();
    w.register(request("t2"), &s, Instant::now()).unwrap();
    let refused = w.register(request("t3"), &s, Instant::now()).unwrap_err();
    assert_eq!(
        refused,
        WatchdogError::TooManyTasks {
            worker: "w1".into(),
            limit: 2
        }
    );
    // A retried registration of a task it has is still answered.
    w.register(request("t2"), &s, Instant::now()).unwrap();
    // Once one ends, there is room again.
    w.finish(
        "t1",
        TaskOutcome::Ended { exit_code: Some(0) },
        Instant::now(),
    )
    .unwrap();
    w.register(request("t3"), &s, Instant::now()).unwrap();
}

/// Between full rounds a tick reads only the tasks whose figure may
/// matter now: never read, under a worker over its cap or not healthy,
/// near or over their own cap, or with a cap the kernel is not quiet about.
#[tokio::test(start_paused = true)]
async fn a_tick_reads_the_busy_tasks_only() {
    let mut w = watchdog();
    let ids = |sources: Sources| {
        let mut ids: Vec<String> = sources.into_iter().map(|(id, _)| id).collect();
        ids.sort();
        ids
    };
    let capped = |id: &str, cap: u64| TaskRequest {
        soft_cap: Some(cap),
        ..request(id)
    };
    let admit = sample(
        50 * MIB,
        &[
            ("uncapped", MIB),
            ("quiet", MIB),
            ("loud", MIB),
            ("near", 95 * MIB),
        ],
    );
    for req in [
        request("uncapped"),
        capped("quiet", 100 * MIB),
        capped("loud", 100 * MIB),
        capped("near", 100 * MIB),
    ] {
        w.register(req, &admit, Instant::now()).unwrap();
    }
    w.register(request("unread"), &sample(50 * MIB, &[]), Instant::now())
        .unwrap();
    let workers =
        |bytes: u64| -> FastMap<String, u64> { [("w1".to_string(), bytes)].into_iter().collect() };
    let quiet_but_loud = |task: &str, _: Instant| task != "loud";
    assert_eq!(
        ids(w.busy_tasks(&workers(50 * MIB), quiet_but_loud)),
        ["loud", "near", "unread"],
        "calm worker: the uncapped task and the quiet one wait"
    );
    assert_eq!(
        ids(w.busy_tasks(&workers(50 * MIB), |_, _| false)),
        ["loud", "near", "quiet", "unread"],
        "no kernel watch (polling): every capped task is read"
    );
    assert_eq!(
        ids(w.busy_tasks(&workers(300 * MIB), quiet_but_loud)).len(),
        5,
        "a worker over its cap: every task is read (its residual counts)"
    );
}

/// The predictor's targets are shared between ticks and built again after
/// every change of the tasks: a task registered, restored, ended or killed
/// is in them (or gone) at the next call, never a tick late.
#[tokio::test(start_paused = true)]
async fn the_predictors_targets_follow_every_task_that_comes_or_goes() {
    let mut w = watchdog();
    let ids = |w: &mut Watchdog| -> Vec<Option<String>> {
        w.prediction_targets()
            .iter()
            .map(|t| t.task_id.as_deref().map(str::to_owned))
            .collect()
    };
    assert_eq!(ids(&mut w), [None], "the worker's own cgroup");
    let first = w.prediction_targets();
    assert!(
        std::sync::Arc::ptr_eq(&first, &w.prediction_targets()),
        "shared while nothing changed"
    );
    w.register(request("t1"), &sample(0, &[]), Instant::now())
        .unwrap();
    assert_eq!(ids(&mut w), [None, Some("t1".into())]);
    w.restore(request("t2"), Instant::now()).unwrap();
    assert_eq!(ids(&mut w), [None, Some("t1".into()), Some("t2".into())]);
    let t1 = w.prediction_targets()[1].clone();
    assert_eq!(
        &*t1.cgroup,
        std::path::Path::new("/sys/fs/cgroup/memory/w1/t1")
    );
    assert_eq!(&*t1.worker, "w1");
    w.finish(
        "t1",
        TaskOutcome::Ended { exit_code: Some(0) },
        Instant::now(),
    )
    .unwrap();
    assert_eq!(ids(&mut w), [None, Some("t2".into())]);
    let killed = std::path::Path::new("/sys/fs/cgroup/memory/w1/t2");
    let (task, _, _) = w.attribute_oom(Some(killed), 1, Instant::now());
    assert_eq!(task.as_deref(), Some("t2"));
    assert_eq!(ids(&mut w), [None]);
}
