//! Route tests against the router in memory (no socket, no privilege).

use axum::{body::Body, http::Request};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use super::*;
use crate::{
    event::{EventBody, EventKind},
    probe::SourceKind,
    telemetry::Metrics,
};

fn state() -> AppState {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let outbox = Outbox::new("test-host", 100, metrics);
    let probe: Arc<Mutex<ProbeState>> = Arc::default();
    AppState {
        status: crate::status::agent_state("test-host".into(), probe.clone(), outbox.clone()),
        outbox,
        registry,
        probe,
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
    assert_eq!(json["workers"], serde_json::json!([]));
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
