//! `/health`, `/ready`, `/live`.

use axum::{Json, extract::State, http::StatusCode};
use serde::Serialize;
use tokio::time::Instant;

use super::AppState;
use crate::watchdog::{Health, self_health};

#[derive(Serialize)]
pub struct HealthBody {
    pub status: Health,
    pub reasons: Vec<String>,
    /// Per-worker verdicts (the watchdog fills these in).
    pub workers: Vec<serde_json::Value>,
    /// `ebpf` or `poll`; null until a source runs.
    pub source: Option<&'static str>,
    pub attach: Option<&'static str>,
}

/// 200 when healthy or degraded, 503 when unhealthy; always with reasons.
pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<HealthBody>) {
    let probe = state.probe().clone();
    let mut verdict = self_health::assess(&probe, Instant::now());
    self_health::assess_outbox(&state.outbox.status(), &mut verdict);
    let code = match verdict.status {
        Health::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
        Health::Healthy | Health::Degraded => StatusCode::OK,
    };
    let body = HealthBody {
        status: verdict.status,
        reasons: verdict.reasons,
        workers: Vec::new(),
        source: probe.source.map(|s| s.as_str()),
        attach: probe.attach,
    };
    (code, Json(body))
}

/// 200 once the event source runs (the probe is attached), 503 before.
pub async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.probe().ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "probe not attached\n")
    }
}

/// The process answers: for a liveness probe, never tied to worker health.
pub async fn live() -> &'static str {
    "alive\n"
}
