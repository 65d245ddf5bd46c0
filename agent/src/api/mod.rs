//! The local HTTP API (contract in ../shared/DESIGN.md).

mod events;
mod health;
mod metrics;
mod status;

use std::sync::{Arc, Mutex, MutexGuard};

use axum::{
    Json, Router,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus::Registry;

use crate::{shipper::outbox::Outbox, status::StateFn, watchdog::self_health::ProbeState};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub outbox: Outbox,
    pub registry: Registry,
    pub probe: Arc<Mutex<ProbeState>>,
    /// The full state for `/v1/status`.
    pub status: StateFn,
}

impl AppState {
    pub fn probe(&self) -> MutexGuard<'_, ProbeState> {
        self.probe.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/live", get(health::live))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/events", get(events::list))
        .route("/v1/status", get(status::status))
        .fallback(not_found)
        .with_state(state)
}

/// A JSON error body: `{"error": "..."}`.
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
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
