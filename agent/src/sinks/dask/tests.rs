use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Json, Router,
    extract::State,
    routing::{get, post},
};
use chrono::Utc;
use serde_json::{Value, json};

use super::*;
use crate::{
    model::{event::EventBody, health::Health},
    sinks::guard::Guard,
};

/// Every worker unhealthy now: events are never stale.
fn unhealthy_now() -> WorkerHealth {
    Arc::new(|_| Some(Health::Unhealthy))
}
use crate::{model::spec::MemorySource, outbox::Outbox, telemetry::Metrics};

/// A Dask scheduler's HTTP API: the workers it lists with their status,
/// the retirements asked; it retires as Dask does (the answer names the
/// workers retired), or refuses (`refuse`: an empty answer).
#[derive(Clone, Default)]
struct FakeScheduler {
    workers: Arc<Mutex<Vec<(String, String)>>>,
    /// Status by address; `running` when absent.
    status: Arc<Mutex<std::collections::HashMap<String, String>>>,
    retired: Arc<Mutex<Vec<Vec<String>>>>,
    refuse: Arc<std::sync::atomic::AtomicBool>,
    /// Never answers `retire_workers`; with `Some(status)` the workers
    /// asked take that status first (`closing_gracefully`: under way).
    hang: Arc<Mutex<Option<Option<&'static str>>>>,
}

impl FakeScheduler {
    fn set_status(&self, address: &str, status: &str) {
        self.status
            .lock()
            .unwrap()
            .insert(address.into(), status.into());
    }
}

async fn identity(State(f): State<FakeScheduler>) -> Json<Value> {
    let workers = f.workers.lock().unwrap();
    let status = f.status.lock().unwrap();
    let map: serde_json::Map<String, Value> = workers
        .iter()
        .map(|(name, address)| {
            let s = status.get(address).map_or("running", String::as_str);
            (address.clone(), json!({"name": name, "status": s}))
        })
        .collect();
    Json(json!({"type": "Scheduler", "workers": map}))
}

async fn retire_workers(State(f): State<FakeScheduler>, Json(body): Json<Value>) -> Json<Value> {
    let asked: Vec<String> = serde_json::from_value(body["workers"].clone()).unwrap();
    f.retired.lock().unwrap().push(asked.clone());
    let hang = *f.hang.lock().unwrap();
    if let Some(status) = hang {
        for a in status
            .iter()
            .flat_map(|s| asked.iter().map(move |a| (a, *s)))
        {
            f.set_status(a.0, a.1);
        }
        std::future::pending::<()>().await;
    }
    if f.refuse.load(std::sync::atomic::Ordering::SeqCst) {
        return Json(json!({}));
    }
    f.workers
        .lock()
        .unwrap()
        .retain(|(_, a)| !asked.contains(a));
    let answer: serde_json::Map<String, Value> = asked
        .into_iter()
        .map(|a| (a, json!({"status": "closed"})))
        .collect();
    Json(Value::Object(answer))
}

async fn serve(fake: FakeScheduler) -> String {
    let app = Router::new()
        .route("/json/identity.json", get(identity))
        .route("/api/v1/retire_workers", post(retire_workers))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn sink(url: &str, outbox: &Outbox) -> DaskSink {
    sink_seeing(url, outbox, unhealthy_now())
}

/// `health`: each worker's health now, as the watchdog says it.
fn sink_seeing(url: &str, outbox: &Outbox, health: WorkerHealth) -> DaskSink {
    // Pids that do not exist: the Dask workers are matched by name, which
    // needs their addresses on this host (loopback: 127.0.0.0/8).
    let specs: Arc<[WorkerSpec]> = ["w1", "w2", "w3"]
        .iter()
        .enumerate()
        .map(|(i, name)| WorkerSpec {
            name: name.to_string(),
            source: MemorySource::Pid(u32::MAX - i as u32),
            soft_cap: None,
            unhealthy_after: Duration::from_secs(1),
            recover_after: Duration::from_secs(1),
            pressure: None,
        })
        .collect::<Vec<_>>()
        .into();
    let config = DaskConfig {
        name: "dask-1".into(),
        url: url.parse().unwrap(),
        guard: Guard::default(),
        refresh_interval: Duration::from_secs(1),
        retire_imminent: true,
        delivery: Delivery {
            timeout: Duration::from_secs(5),
            ..Delivery::default()
        },
    };
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    DaskSink::new(
        config,
        specs,
        Recorder::new(outbox.clone(), metrics),
        SchedulerNames::default(),
        health,
    )
    .unwrap()
}

fn event(seq: u64, kind: EventKind, worker: Option<&str>, state: Option<Value>) -> Event {
    let mut body = EventBody::new(kind);
    body.worker = worker.map(str::to_string);
    body.state = state;
    Event {
        id: format!("e{seq}"),
        seq,
        time: Utc::now(),
        host: "h".into(),
        epoch: None,
        body,
    }
}

fn heartbeat(seq: u64, unhealthy: &[&str]) -> Event {
    let workers: Vec<Value> = ["w1", "w2", "w3"]
        .iter()
        .map(|w| {
            let status = if unhealthy.contains(w) {
                "unhealthy"
            } else {
                "healthy"
            };
            json!({"name": w, "status": status})
        })
        .collect();
    event(
        seq,
        EventKind::Heartbeat,
        None,
        Some(json!({"workers": workers})),
    )
}

fn of_kind(outbox: &Outbox, kind: EventKind) -> Vec<Event> {
    outbox
        .read(0, 100)
        .into_iter()
        .filter(|e| e.body.kind == kind)
        .collect()
}

fn guard_blocked(outbox: &Outbox) -> Vec<Event> {
    of_kind(outbox, EventKind::GuardBlocked)
}

fn two_workers() -> FakeScheduler {
    let fake = FakeScheduler::default();
    *fake.workers.lock().unwrap() = vec![
        ("w1".into(), "tcp://127.0.0.1:1".into()),
        ("w2".into(), "tcp://127.0.0.2:2".into()),
    ];
    fake
}

/// [`two_workers`] and w3: one of three may go under the default guard.
fn three_workers() -> FakeScheduler {
    let fake = two_workers();
    fake.workers
        .lock()
        .unwrap()
        .push(("w3".into(), "tcp://127.0.0.3:3".into()));
    fake
}

fn outbox() -> Outbox {
    Outbox::new(
        "h",
        100,
        Metrics::new(&prometheus::Registry::new()).unwrap(),
    )
}

#[tokio::test]
async fn retires_one_worker_at_a_time_and_reports_a_blocked_guard_once() {
    let fake = FakeScheduler::default();
    *fake.workers.lock().unwrap() = vec![
        ("w1".into(), "tcp://127.0.0.1:1".into()),
        ("w2".into(), "tcp://127.0.0.2:2".into()),
    ];
    let url = serve(fake.clone()).await;
    let outbox = Outbox::new(
        "h",
        100,
        Metrics::new(&prometheus::Registry::new()).unwrap(),
    );
    let mut sink = sink(&url, &outbox);

    // Both leak: the first goes, the guard keeps the second.
    let both = [
        event(1, EventKind::WorkerUnhealthy, Some("w1"), None),
        event(2, EventKind::WorkerUnhealthy, Some("w2"), None),
    ];
    sink.send(&both).await.unwrap();
    assert_eq!(*fake.retired.lock().unwrap(), [["tcp://127.0.0.1:1"]]);
    let blocked = guard_blocked(&outbox);
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].body.worker.as_deref(), Some("w2"));
    assert_eq!(
        blocked[0].body.scheduler_worker.as_deref(),
        Some("tcp://127.0.0.2:2")
    );

    // Still blocked at the next heartbeat: nothing retired, nothing reported again.
    sink.send(&[heartbeat(3, &["w1", "w2"])]).await.unwrap();
    assert_eq!(fake.retired.lock().unwrap().len(), 1);
    assert_eq!(guard_blocked(&outbox).len(), 1);

    // A fresh worker joins (the supervisor replaced w1): the cluster changed,
    // w2 goes now; w1, retired in this episode, is not asked again.
    fake.workers
        .lock()
        .unwrap()
        .push(("w3".into(), "tcp://127.0.0.3:3".into()));
    sink.send(&[heartbeat(4, &["w1", "w2"])]).await.unwrap();
    assert_eq!(
        *fake.retired.lock().unwrap(),
        [["tcp://127.0.0.1:1"], ["tcp://127.0.0.2:2"]]
    );
    assert_eq!(
        *fake.workers.lock().unwrap(),
        [("w3".to_string(), "tcp://127.0.0.3:3".to_string())]
    );

    // A recovered worker that turns unhealthy again is acted on again.
    fake.workers
        .lock()
        .unwrap()
        .push(("w1".into(), "tcp://127.0.0.1:5".into()));
    sink.send(&[
        event(5, EventKind::WorkerRecovered, Some("w1"), None),
        event(6, EventKind::WorkerUnhealthy, Some("w1"), None),
    ])
    .await
    .unwrap();
    assert_eq!(
        fake.retired.lock().unwrap().last().unwrap(),
        &["tcp://127.0.0.1:5"]
    );
}

#[tokio::test]
async fn an_unreachable_scheduler_fails_the_batch_for_a_retry() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let outbox = Outbox::new(
        "h",
        100,
        Metrics::new(&prometheus::Registry::new()).unwrap(),
    );
    let mut sink = sink(&format!("http://127.0.0.1:{port}"), &outbox);
    let error = sink
        .send(&[event(1, EventKind::WorkerUnhealthy, Some("w1"), None)])
        .await
        .unwrap_err();
    assert_eq!(error.class, FailureClass::Connect, "{error}");
    // Events that need no action need no scheduler.
    sink.actions.forget("w1");
    sink.send(&[event(2, EventKind::TaskStarted, Some("w1"), None)])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_worker_another_host_is_retiring_counts_as_gone() {
    let fake = two_workers();
    // w2 is being retired by another host's agent (or anyone).
    fake.set_status("tcp://127.0.0.2:2", "closing_gracefully");
    let url = serve(fake.clone()).await;
    let outbox = outbox();
    let mut sink = sink(&url, &outbox);
    sink.send(&[event(1, EventKind::WorkerUnhealthy, Some("w1"), None)])
        .await
        .unwrap();
    assert!(fake.retired.lock().unwrap().is_empty(), "w1 kept");
    let blocked = guard_blocked(&outbox);
    assert_eq!(blocked.len(), 1);
    assert!(
        blocked[0]
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("would leave 0 of 2"),
        "{blocked:?}"
    );
}

#[tokio::test]
async fn a_paused_worker_may_go_where_a_running_one_may_not() {
    let fake = three_workers();
    // w2 and w3 paused (over Dask's pause threshold): one worker runs.
    fake.set_status("tcp://127.0.0.2:2", "paused");
    fake.set_status("tcp://127.0.0.3:3", "paused");
    let url = serve(fake.clone()).await;
    let outbox = outbox();
    let mut sink = sink(&url, &outbox);
    // The running one is kept: fewer running workers than the floor (2 of 3) would be left.
    sink.send(&[event(1, EventKind::WorkerUnhealthy, Some("w1"), None)])
        .await
        .unwrap();
    assert!(fake.retired.lock().unwrap().is_empty());
    assert_eq!(guard_blocked(&outbox).len(), 1);
    // A paused one goes: it runs nothing, and 2 of 3 remain.
    sink.send(&[event(2, EventKind::WorkerUnhealthy, Some("w2"), None)])
        .await
        .unwrap();
    assert_eq!(*fake.retired.lock().unwrap(), [["tcp://127.0.0.2:2"]]);
}

#[tokio::test]
async fn a_retirement_the_scheduler_refuses_is_reported_and_tried_again() {
    let fake = FakeScheduler::default();
    *fake.workers.lock().unwrap() = vec![
        ("w1".into(), "tcp://127.0.0.1:1".into()),
        ("w2".into(), "tcp://127.0.0.2:2".into()),
        ("w3".into(), "tcp://127.0.0.3:3".into()),
    ];
    fake.refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    let url = serve(fake.clone()).await;
    let outbox = outbox();
    let mut sink = sink(&url, &outbox);
    sink.send(&[event(1, EventKind::WorkerUnhealthy, Some("w1"), None)])
        .await
        .unwrap();
    let refused = of_kind(&outbox, EventKind::ActionRefused);
    assert_eq!(refused.len(), 1, "reported as refused, not as retired");
    assert!(
        refused[0]
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("retired none"),
        "{refused:?}"
    );
    // Still pending: the next heartbeat asks again (reported once), and
    // once the scheduler agrees, it is done.
    sink.send(&[heartbeat(2, &["w1"])]).await.unwrap();
    assert_eq!(fake.retired.lock().unwrap().len(), 2);
    assert_eq!(of_kind(&outbox, EventKind::ActionRefused).len(), 1);
    fake.refuse
        .store(false, std::sync::atomic::Ordering::SeqCst);
    sink.send(&[heartbeat(3, &["w1"])]).await.unwrap();
    assert_eq!(fake.retired.lock().unwrap().len(), 3);
    sink.send(&[heartbeat(4, &["w1"])]).await.unwrap();
    assert_eq!(
        fake.retired.lock().unwrap().len(),
        3,
        "done: not asked again"
    );
}

#[tokio::test]
async fn a_stale_unhealthy_event_retires_nothing() {
    let fake = three_workers();
    let url = serve(fake.clone()).await;
    let outbox = outbox();
    // Replayed after a scheduler outage: w1 recovered in the meantime.
    let mut sink = sink_seeing(&url, &outbox, Arc::new(|_| Some(Health::Healthy)));
    sink.send(&[event(1, EventKind::WorkerUnhealthy, Some("w1"), None)])
        .await
        .unwrap();
    assert!(fake.retired.lock().unwrap().is_empty());
    let skipped = of_kind(&outbox, EventKind::ActionSkipped);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(!sink.actions.has_pending());
}

/// `retire_workers` that never answers (two hosts retiring each other's
/// only recipient): the scheduler's statuses decide, after a bounded wait.
#[tokio::test]
async fn a_retirement_without_an_answer_is_judged_from_the_statuses() {
    for (status, retired) in [(Some("closing_gracefully"), true), (None, false)] {
        let fake = three_workers();
        *fake.hang.lock().unwrap() = Some(status);
        let url = serve(fake.clone()).await;
        let outbox = outbox();
        let mut sink = sink(&url, &outbox);
        sink.retire_wait = Duration::from_millis(300);
        let started = std::time::Instant::now();
        sink.send(&[event(1, EventKind::WorkerUnhealthy, Some("w1"), None)])
            .await
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(fake.retired.lock().unwrap().len(), 1);
        let refused = of_kind(&outbox, EventKind::ActionRefused);
        if retired {
            assert!(refused.is_empty(), "{refused:?}");
            assert!(sink.actions.is_done("w1") && !sink.actions.has_pending());
        } else {
            assert_eq!(refused.len(), 1, "{status:?}");
            assert!(
                refused[0]
                    .body
                    .reason
                    .as_deref()
                    .unwrap()
                    .contains("none was leaving after 0.3s"),
                "{refused:?}"
            );
            assert!(sink.actions.is_pending("w1"), "tried again later");
        }
    }
}

/// After a start that set the outbox database aside, retirements wait one
/// window (paused clock): skipped with one `action_skipped` and no call to
/// the scheduler, then done at the first batch past it.
#[tokio::test]
async fn retirements_wait_out_the_gate_after_a_state_loss() {
    tokio::time::pause();
    let fake = three_workers();
    let url = serve(fake.clone()).await;
    let outbox = outbox();
    let mut sink = sink(&url, &outbox);
    sink.actions.set_gate(crate::sinks::ActionGate::closed_for(
        Duration::from_secs(30),
        "the outbox database was corrupt and set aside as /s/outbox.sqlite.corrupt-1".into(),
    ));
    sink.send(&[event(1, EventKind::WorkerUnhealthy, Some("w1"), None)])
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(29)).await;
    sink.send(&[heartbeat(2, &["w1"])]).await.unwrap();
    assert!(fake.retired.lock().unwrap().is_empty());
    let skipped = of_kind(&outbox, EventKind::ActionSkipped);
    assert_eq!(skipped.len(), 1, "said once: {skipped:?}");
    let reason = skipped[0].body.reason.as_deref().unwrap();
    assert!(
        reason.contains("not retired yet: no scheduler action within 30s")
            && reason.contains("outbox.sqlite.corrupt-1"),
        "{reason}"
    );

    tokio::time::advance(Duration::from_secs(1)).await;
    // The fake scheduler is real HTTP: real time from here on.
    tokio::time::resume();
    sink.send(&[heartbeat(3, &["w1"])]).await.unwrap();
    assert_eq!(
        *fake.retired.lock().unwrap(),
        [vec!["tcp://127.0.0.1:1".to_string()]]
    );
}

/// `retire_imminent`: a worker whose kill is predicted is retired while the
/// prediction holds (re-checked right before acting); averted first, or no
/// longer predicted when the sink gets to it, nothing is retired; a
/// heartbeat saying the worker is healthy does not cancel the prediction.
#[tokio::test]
async fn a_predicted_kill_retires_the_worker_while_it_is_still_predicted() {
    let fake = three_workers();
    let url = serve(fake.clone()).await;
    let outbox = outbox();
    let mut sink = sink(&url, &outbox);
    let predicted = Arc::new(std::sync::Mutex::new(Some(12.0)));
    let now = Arc::clone(&predicted);
    sink.eta = Arc::new(move |w| {
        if w == "w1" {
            *now.lock().unwrap()
        } else {
            None
        }
    });
    let imminent = |seq| {
        let mut e = event(seq, EventKind::OomImminent, Some("w1"), None);
        e.body.eta_seconds = Some(12.0);
        e
    };
    sink.send(&[
        imminent(1),
        event(2, EventKind::OomAverted, Some("w1"), None),
    ])
    .await
    .unwrap();
    assert!(
        fake.retired.lock().unwrap().is_empty(),
        "averted before acting"
    );

    *predicted.lock().unwrap() = None;
    sink.send(&[imminent(3)]).await.unwrap();
    assert!(
        fake.retired.lock().unwrap().is_empty(),
        "no longer predicted"
    );
    let skipped = of_kind(&outbox, EventKind::ActionSkipped);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0]
            .body
            .reason
            .as_deref()
            .unwrap()
            .contains("no OOM kill is predicted for worker w1 now"),
        "{skipped:?}"
    );

    *predicted.lock().unwrap() = Some(11.0);
    sink.send(&[imminent(4), heartbeat(5, &[])]).await.unwrap();
    assert_eq!(
        *fake.retired.lock().unwrap(),
        [vec!["tcp://127.0.0.1:1".to_string()]]
    );
    // Said again in the same episode: retired once.
    sink.send(&[imminent(6)]).await.unwrap();
    assert_eq!(fake.retired.lock().unwrap().len(), 1);

    // Off: a prediction does nothing.
    let mut off = sink_seeing(&url, &outbox, unhealthy_now());
    off.actions = Actions::new(Guard::default(), Duration::ZERO);
    off.eta = Arc::new(|_| Some(5.0));
    off.send(&[event(7, EventKind::OomImminent, Some("w2"), None)])
        .await
        .unwrap();
    assert_eq!(fake.retired.lock().unwrap().len(), 1);
}
