//! Route tests against the router in memory (no socket, no privilege).

use axum::{body::Body, http::Request};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use super::*;
use crate::{
    daemon::sampler::fake::FakeReader,
    model::event::{EventBody, EventKind},
    model::source::SourceKind,
    model::spec::{MemorySource, Settings, WorkerSpec},
    record::Recorder,
    telemetry::Metrics,
};

fn state() -> AppState {
    state_with(FakeReader::default(), None)
}

pub(crate) const MIB: u64 = 1 << 20;
/// The uid the agent of these tests runs as (admin on the socket, as root).
pub(crate) const AGENT_UID: u32 = 4_000_000;

/// One worker `w1` (cgroup /cg/w1, soft cap 200 MiB) read from `reader`.
fn state_with(reader: FakeReader, token: Option<&str>) -> AppState {
    state_with_tokens(reader, auth::Tokens::new(token, None, None))
}

/// [`state_with`] with the tokens of every scope.
pub(crate) fn state_with_tokens(reader: FakeReader, tokens: auth::Tokens) -> AppState {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let outbox = Outbox::new("test-host", 100, metrics.clone());
    let worker = WorkerSpec {
        name: "w1".into(),
        source: MemorySource::Cgroup("/cg/w1".into()),
        soft_cap: Some(200 * MIB),
        unhealthy_after: std::time::Duration::from_secs(60),
        recover_after: std::time::Duration::from_secs(30),
        pressure: None,
    };
    let monitor = Monitor::new(
        vec![worker],
        Settings::default(),
        Vec::new(),
        crate::cgroup::MemoryHierarchy {
            root: "/cg".into(),
            version: crate::cgroup::CgroupVersion::V1,
        },
        Arc::new(reader),
        Recorder::new(outbox.clone(), metrics),
    );
    let probe: Arc<Mutex<ProbeState>> = Arc::default();
    let monitor = Arc::new(monitor);
    let liveness = Liveness::default();
    AppState {
        status: crate::daemon::status::agent_status(
            "test-host".into(),
            probe.clone(),
            outbox.clone(),
            monitor.clone(),
            liveness.clone(),
        ),
        liveness,
        outbox,
        registry,
        probe,
        monitor,
        tokens,
        agent_uid: AGENT_UID,
        owners: Arc::new(owned::tests::FakeOwners::default()),
        socket: None,
        lent: Default::default(),
    }
}

async fn get(state: &AppState, uri: &str) -> (StatusCode, String) {
    let response = router(state.clone())
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn attach(state: &AppState) {
    let mut probe = state.probe();
    probe.source = Some(SourceKind::Ebpf);
    probe.attach = Some("tp_btf");
}

#[tokio::test]
async fn ready_flips_only_after_attach() {
    let state = state();
    assert_eq!(
        get(&state, "/ready").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    attach(&state);
    assert_eq!(get(&state, "/ready").await.0, StatusCode::OK);
    assert_eq!(get(&state, "/live").await.0, StatusCode::OK);
}

#[tokio::test]
async fn health_names_source_and_reasons() {
    let state = state();
    let (code, body) = get(&state, "/health").await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(code, StatusCode::OK);
    assert_eq!(json["status"], "degraded");
    assert_eq!(json["reasons"][0], "probe not attached yet");
    assert_eq!(json["source"], serde_json::Value::Null);

    attach(&state);
    let (code, body) = get(&state, "/health").await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(code, StatusCode::OK);
    assert_eq!(json["status"], "healthy");
    assert_eq!(json["source"], "ebpf");
    assert_eq!(json["workers"][0]["name"], "w1");
    assert_eq!(json["workers"][0]["status"], "healthy");
}

#[tokio::test]
async fn events_page_by_seq() {
    let state = state();
    for _ in 0..3 {
        state
            .outbox
            .append(EventBody::new(EventKind::OomKill), None);
    }
    let (code, body) = get(&state, "/v1/events?after=1&limit=1").await;
    assert_eq!(code, StatusCode::OK);
    let events: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["seq"], 2);
    assert_eq!(events[0]["kind"], "oom_kill");
    assert_eq!(events[0]["host"], "test-host");

    let (_, body) = get(&state, "/v1/events").await;
    let events: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(events.len(), 3);
}

#[tokio::test]
async fn bad_event_queries_are_400_with_a_message() {
    let state = state();
    for uri in [
        "/v1/events?after=abc",
        "/v1/events?limit=0",
        "/v1/events?limit=100000",
        "/v1/events?bogus=1",
        "/health?bogus=1",
    ] {
        let (code, body) = get(&state, uri).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{uri}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            json["error"].as_str().is_some_and(|m| !m.is_empty()),
            "{uri}: {body}"
        );
    }
}

#[tokio::test]
async fn metrics_export_oom_counter() {
    let state = state();
    state
        .outbox
        .append(EventBody::new(EventKind::OomKill), None);
    let (code, body) = get(&state, "/metrics").await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        body.contains("# TYPE memwatch_oom_kills_total counter"),
        "{body}"
    );
    // One series per constraint from the start; one metric per probe
    // counter; the process's own cost.
    for series in [
        "memwatch_oom_kills_total{constraint=\"cgroup\"} 0",
        "memwatch_oom_kills_total{constraint=\"global\"} 0",
        "memwatch_probe_records_lost_total 0",
        "memwatch_probe_oom_victims_total 0",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
    ] {
        assert!(body.contains(series), "{series} in {body}");
    }
    assert!(
        body.contains("memwatch_events_total{kind=\"oom_kill\"} 1"),
        "{body}"
    );
}

#[tokio::test]
async fn status_has_version_source_and_sink_backlog() {
    let state = state();
    attach(&state);
    state.outbox.register_sink("hook");
    state
        .outbox
        .append(EventBody::new(EventKind::OomKill), None);
    let (code, body) = get(&state, "/v1/status").await;
    assert_eq!(code, StatusCode::OK);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["source"], "ebpf");
    assert_eq!(json["health"]["status"], "healthy");
    assert_eq!(json["outbox"]["last_seq"], 1);
    assert_eq!(json["outbox"]["sinks"]["hook"]["backlog"], 1);
}

#[tokio::test]
async fn unknown_route_is_404_json() {
    let (code, body) = get(&state(), "/nope").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(body.contains("no such route"));
}

/// A request from root on the local socket (an operator: admin), as the
/// route tests call when they send no token: over TCP with no token, a
/// caller only reads.
pub(crate) fn as_operator(req: axum::http::request::Builder) -> axum::http::request::Builder {
    req.extension(auth::Peer::Unix { uid: 0, pid: None })
}

/// Who sends a route test's request.
#[derive(Clone, Copy)]
enum By {
    /// Root on the local socket ([`as_operator`]).
    Operator,
    /// A TCP client with no token.
    Tcp,
    /// A TCP client with this bearer token.
    Token(&'static str),
}

/// Sends a request with an optional body and content type, `by` a caller.
async fn send(
    state: &AppState,
    method: &str,
    uri: &str,
    body: Option<(&str, &str)>,
    by: By,
) -> (StatusCode, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(uri);
    let tcp = auth::Peer::Tcp(([127, 0, 0, 1], 40000).into());
    req = match by {
        By::Operator => as_operator(req),
        By::Tcp => req.extension(tcp),
        By::Token(token) => req
            .header("authorization", format!("Bearer {token}"))
            .extension(tcp),
    };
    let req = match body {
        Some((content_type, text)) => req
            .header("content-type", content_type)
            .body(Body::from(text.to_string())),
        None => req.body(Body::empty()),
    }
    .unwrap();
    let response = router(state.clone()).oneshot(req).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

const JSON: &str = "application/json";

pub(crate) fn reader(worker: u64) -> FakeReader {
    let r = FakeReader::default();
    r.set(MemorySource::Cgroup("/cg/w1".into()), worker);
    r
}

#[tokio::test]
async fn task_on_a_clean_worker_is_201_and_listed() {
    let state = state_with(reader(50 * MIB), None);
    let (code, json) = send(
        &state,
        "POST",
        "/v1/tasks",
        Some((JSON, r#"{"task_id":"t1"}"#)),
        By::Operator,
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{json}");
    assert_eq!(json["verdict"], "accepted");
    assert_eq!(json["worker"], "w1");
    let (_, status) = get(&state, "/v1/status").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["tasks"][0]["task_id"], "t1");
    assert_eq!(status["workers"][0]["running_tasks"], 1);

    let (code, json) = send(
        &state,
        "DELETE",
        "/v1/tasks/t1?exit_code=0",
        None,
        By::Operator,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["outcome"]["outcome"], "ended");
    let (code, _) = send(&state, "DELETE", "/v1/tasks/nope", None, By::Operator).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn residual_over_cap_is_409_and_health_503_until_reset() {
    let state = state_with(reader(300 * MIB), None);
    attach(&state);
    let (code, json) = send(
        &state,
        "POST",
        "/v1/tasks",
        Some((JSON, r#"{"task_id":"t1"}"#)),
        By::Operator,
    )
    .await;
    assert_eq!(code, StatusCode::CONFLICT, "{json}");
    assert_eq!(json["verdict"], "rejected");
    assert!(
        json["reason"]
            .as_str()
            .unwrap()
            .contains("residual memory 300.0 MiB"),
        "{json}"
    );

    let (code, body) = get(&state, "/health").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "unhealthy");
    assert!(
        health["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("worker w1: residual memory"),
        "{health}"
    );
    assert_eq!(
        get(&state, "/health?worker=w1").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get(&state, "/health?worker=zz").await.0,
        StatusCode::NOT_FOUND
    );

    let events = state.outbox.read(0, 10);
    let kinds: Vec<_> = events.iter().map(|e| e.body.kind).collect();
    assert_eq!(kinds, [EventKind::WorkerUnhealthy, EventKind::TaskRejected]);

    let (code, _) = send(&state, "POST", "/v1/workers/w1/reset", None, By::Operator).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(get(&state, "/health").await.0, StatusCode::OK);
    let (code, _) = send(&state, "POST", "/v1/workers/nope/reset", None, By::Operator).await;
    assert_eq!(code, StatusCode::NOT_FOUND);

    let (_, metrics) = get(&state, "/metrics").await;
    for line in [
        "memwatch_task_rejections_total{worker=\"w1\"} 1",
        "memwatch_worker_transitions_total{to=\"unhealthy\",worker=\"w1\"} 1",
        "memwatch_worker_transitions_total{to=\"healthy\",worker=\"w1\"} 1",
        "memwatch_worker_memory_bytes{worker=\"w1\"} 314572800",
        "memwatch_worker_soft_cap_bytes{worker=\"w1\"} 209715200",
        "memwatch_worker_health{state=\"healthy\",worker=\"w1\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

#[tokio::test]
async fn bad_task_requests_are_rejected_and_change_nothing() {
    let state = state_with(reader(50 * MIB), None);
    let big = format!(r#"{{"task_id":"{}"}}"#, "x".repeat(tasks::MAX_BODY_BYTES));
    let cases: Vec<(Option<&str>, &str, StatusCode)> = vec![
        (Some(JSON), "{not json", StatusCode::BAD_REQUEST),
        (Some(JSON), r#"{"task_id": 7}"#, StatusCode::BAD_REQUEST),
        (
            Some(JSON),
            r#"{"task_id":"t","colour":"red"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (Some(JSON), r#"{"worker":"w1"}"#, StatusCode::BAD_REQUEST),
        (Some(JSON), r#"{"task_id":""}"#, StatusCode::BAD_REQUEST),
        (
            Some(JSON),
            r#"{"task_id":"t","pid":1,"cgroup":"/cg/w1"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Some(JSON),
            r#"{"task_id":"t","cgroup":"relative"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Some(JSON),
            r#"{"task_id":"t","cgroup":"/no/such/cgroup"}"#,
            StatusCode::BAD_REQUEST,
        ),
        // A real directory, but not a cgroup of the hierarchy: it
        // would hide a sick worker behind a fake task.
        (
            Some(JSON),
            r#"{"task_id":"t","cgroup":"/tmp"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            Some(JSON),
            r#"{"task_id":"t","worker":"nope"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (Some(JSON), &big, StatusCode::PAYLOAD_TOO_LARGE),
        (
            Some("text/plain"),
            r#"{"task_id":"t"}"#,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            None,
            r#"{"task_id":"t"}"#,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
    ];
    for (content_type, body, expected) in cases {
        let (code, json) = match content_type {
            Some(ct) => send(&state, "POST", "/v1/tasks", Some((ct, body)), By::Operator).await,
            None => {
                let req = as_operator(Request::post("/v1/tasks"))
                    .body(Body::from(body.to_string()))
                    .unwrap();
                let r = router(state.clone()).oneshot(req).await.unwrap();
                (r.status(), serde_json::Value::Null)
            }
        };
        assert_eq!(code, expected, "{}: {json}", &body[..body.len().min(60)]);
        if content_type.is_some() {
            assert!(
                json["error"].as_str().is_some_and(|m| !m.is_empty()),
                "{json}"
            );
        }
    }
    assert!(state.monitor.tasks().is_empty());
    assert!(
        state.outbox.read(0, 10).is_empty(),
        "no event from a bad request"
    );
}

#[tokio::test]
async fn mutating_routes_need_the_token_when_one_is_set() {
    let state = state_with(reader(50 * MIB), Some("s3cret"));
    let body = Some((JSON, r#"{"task_id":"t1"}"#));
    for token in [By::Tcp, By::Token("wrong")] {
        let (code, json) = send(&state, "POST", "/v1/tasks", body, token).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{json}");
        assert_eq!(
            send(&state, "POST", "/v1/workers/w1/reset", None, token)
                .await
                .0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            send(&state, "DELETE", "/v1/tasks/t1", None, token).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert!(state.monitor.tasks().is_empty());
    assert_eq!(
        send(&state, "POST", "/v1/tasks", body, By::Token("s3cret"))
            .await
            .0,
        StatusCode::CREATED
    );
    // Reads need a token too now (any scope); the probes stay open.
    assert_eq!(get(&state, "/v1/status").await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(get(&state, "/health").await.0, StatusCode::OK);
}

mod properties;
mod scopes;
mod serve;

#[tokio::test]
async fn an_events_page_is_bounded_in_bytes_too() {
    let state = state();
    // Ten events of 1 MiB each: a page of 100 would be 10 MiB.
    for _ in 0..10 {
        let mut body = EventBody::new(EventKind::Heartbeat);
        body.reason = Some("x".repeat(1 << 20));
        state.outbox.append(body, None);
    }
    let (code, body) = get(&state, "/v1/events?limit=100").await;
    assert_eq!(code, StatusCode::OK);
    let page: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert!(
        (1..=4).contains(&page.len()),
        "{} events, {} bytes",
        page.len(),
        body.len()
    );
    assert!(
        body.len() <= events::MAX_PAGE_BYTES + 1024,
        "{}",
        body.len()
    );
    // The next page goes on where this one ended.
    let last = page.last().unwrap()["seq"].as_u64().unwrap();
    let (_, next) = get(&state, &format!("/v1/events?after={last}&limit=100")).await;
    let next: Vec<serde_json::Value> = serde_json::from_str(&next).unwrap();
    assert_eq!(next[0]["seq"].as_u64(), Some(last + 1));
}

#[tokio::test(start_paused = true)]
async fn live_fails_naming_a_loop_that_stopped_making_progress() {
    let state = state();
    let pipeline = state
        .liveness
        .register("pipeline", crate::telemetry::liveness::IDLE_BEAT);
    let (code, body) = get(&state, "/live").await;
    assert_eq!((code, body.as_str()), (StatusCode::OK, "alive\n"));
    tokio::time::advance(crate::telemetry::liveness::MIN_STALL).await;
    let (code, body) = get(&state, "/live").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("stalled: pipeline (60s)"), "{body}");
    let (_, health) = get(&state, "/health").await;
    assert!(
        health.contains("pipeline made no progress for 60s"),
        "{health}"
    );
    pipeline.beat();
    let (code, _) = get(&state, "/live").await;
    assert_eq!(code, StatusCode::OK, "progress again");
}

/// A write answers once its events are stored; while the state directory
/// cannot be written it still answers (events held in memory) and says so
/// with `memwatch-stored: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_says_when_its_events_could_not_be_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = state_with(reader(50 * MIB), None);
    let metrics = Metrics::new(&Registry::new()).unwrap();
    let outbox = Outbox::open(dir.path(), "test-host", Default::default(), metrics).unwrap();
    state.outbox = outbox.clone();
    let post = |task: &str| {
        as_operator(Request::post("/v1/tasks"))
            .header("content-type", JSON)
            .body(Body::from(format!(r#"{{"task_id":"{task}"}}"#)))
            .unwrap()
    };
    let response = router(state.clone()).oneshot(post("t1")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers().get("memwatch-stored"), None);
    assert_eq!(outbox.status().pending, 0, "stored before the answer");

    // A real SQLITE_FULL: the database capped at its size, then filled.
    outbox.store().limit_pages(1);
    for _ in 0..10_000 {
        outbox.append(EventBody::new(EventKind::Heartbeat), None);
        outbox.maintain();
        if outbox.status().persist_error.is_some() {
            break;
        }
    }
    assert!(outbox.status().persist_error.is_some(), "the store is full");
    let response = router(state.clone()).oneshot(post("t2")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response
            .headers()
            .get("memwatch-stored")
            .map(|v| v.as_bytes()),
        Some(&b"false"[..])
    );
}
