//! `/health`, `/ready`, `/live`.

use axum::{
    Json,
    extract::{Query, State, rejection::QueryRejection},
    http::StatusCode,
};
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState};
use crate::{
    model::{health::Health, source::SourceKind},
    watchdog::worker::WorkerView,
};

/// The answer of `/health` (served by the API, read by `memwatch status`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct HealthBody {
    pub status: Health,
    pub reasons: Vec<String>,
    /// Per-worker verdicts with their figures.
    pub workers: Vec<WorkerView>,
    /// `ebpf` or `poll`; null until a source runs.
    pub source: Option<SourceKind>,
    pub attach: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HealthQuery {
    /// Only this worker's verdict (and the agent's own).
    worker: Option<String>,
}

/// 200 when healthy or degraded, 503 when unhealthy; always with reasons.
/// The status is the worst of the agent's own and every worker's (or the
/// one named by `?worker=`): a scheduler polling it gets the same verdicts
/// as the events say.
pub(crate) async fn health(
    State(state): State<AppState>,
    query: Result<Query<HealthQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<HealthBody>), ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let mut workers = state.monitor.workers();
    if let Some(name) = &query.worker {
        workers.retain(|w| &w.name == name);
        if workers.is_empty() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("unknown worker `{name}`"),
            ));
        }
    }
    let probe = state.probe().clone();
    let verdict = crate::daemon::status::overall(
        &probe,
        &state.outbox.status(),
        &workers,
        &state.liveness.stalled(),
    );
    let code = match verdict.status {
        Health::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
        Health::Healthy | Health::Degraded => StatusCode::OK,
    };
    let body = HealthBody {
        status: verdict.status,
        reasons: verdict.reasons,
        workers,
        source: probe.source,
        attach: probe.attach.map(str::to_string),
    };
    Ok((code, Json(body)))
}

/// 200 once the event source runs (the probe is attached), 503 before.
pub(crate) async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.probe().ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "probe not attached\n")
    }
}

/// For a liveness probe, never tied to worker health: 200 while every loop
/// of the agent makes progress, 503 naming those that do not (a restart
/// is then the cure: see telemetry/liveness.rs).
pub(crate) async fn live(State(state): State<AppState>) -> (StatusCode, String) {
    let stalled = state.liveness.stalled();
    if stalled.is_empty() {
        return (StatusCode::OK, "alive\n".into());
    }
    let names: Vec<String> = stalled
        .iter()
        .map(|(name, silent)| format!("{name} ({}s)", silent.as_secs()))
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("stalled: {}\n", names.join(", ")),
    )
}
