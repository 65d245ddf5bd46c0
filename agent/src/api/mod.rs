//! The local HTTP API (the contract: docs/design.md).

mod auth;
mod events;
pub(crate) mod health;
mod metrics;
mod status;
pub(crate) mod tasks;

use std::sync::{Arc, Mutex, MutexGuard};

use axum::{
    Json, Router,
    extract::DefaultBodyLimit,
    http::StatusCode,
    middleware,
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use prometheus::Registry;

use crate::{
    daemon::{monitor::Monitor, status::StatusFn},
    outbox::Outbox,
    telemetry::liveness::Liveness,
    watchdog::self_health::ProbeState,
};

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AppState {
    pub outbox: Outbox,
    pub registry: Registry,
    pub probe: Arc<Mutex<ProbeState>>,
    pub monitor: Arc<Monitor>,
    /// Required on mutating routes when set.
    pub api_token: Option<Arc<str>>,
    /// The full state for `/v1/status`.
    pub status: StatusFn,
    /// Whether the agent's loops make progress (`/live`).
    pub liveness: Liveness,
}

impl AppState {
    pub(crate) fn probe(&self) -> MutexGuard<'_, ProbeState> {
        self.probe.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) fn router(state: AppState) -> Router {
    let mutating = Router::new()
        .route("/v1/tasks", post(tasks::create))
        .route("/v1/tasks/{task_id}", delete(tasks::delete))
        .route("/v1/workers/{name}/reset", post(tasks::reset))
        .layer(DefaultBodyLimit::max(tasks::MAX_BODY_BYTES))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .merge(mutating)
        .route("/health", get(health::health))
        .route("/v1/status", get(status::status))
        .route("/ready", get(health::ready))
        .route("/live", get(health::live))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/events", get(events::list))
        .fallback(not_found)
        .with_state(state)
}

/// A JSON error body: `{"error": "..."}`.
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

#[cfg(test)]
mod tests;
