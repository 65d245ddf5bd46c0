//! The local HTTP API (the contract: docs/design.md).

pub(crate) mod auth;
mod events;
pub(crate) mod health;
mod metrics;
pub(crate) mod owned;
pub(crate) mod serve;
pub(crate) mod socket;
mod status;
pub(crate) mod tasks;

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, Request, State},
    http::{HeaderValue, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
};
use prometheus::Registry;

use self::auth::{Guard, Scope, Tokens};
use crate::{
    daemon::{
        monitor::Monitor,
        status::{SocketStatus, StatusFn},
    },
    outbox::Outbox,
    sinks::Lent,
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
    /// The tokens of the scopes (none: TCP reads only; changes go through
    /// the socket).
    pub tokens: Tokens,
    /// The uid the agent runs as: admin on the local socket, as root is.
    pub agent_uid: u32,
    /// Who owns a process or a cgroup: what a user on the socket may
    /// register (owned.rs).
    pub owners: Arc<dyn owned::Owners>,
    /// Whether the local socket is served (shown on `/v1/status`).
    pub socket: Option<SocketStatus>,
    /// The full state for `/v1/status`.
    pub status: StatusFn,
    /// Whether the agent's loops make progress (`/live`).
    pub liveness: Liveness,
    /// What the sinks lent: told of each registration before the answer
    /// (a Slurm sink asks which job the registering process is in).
    pub lent: Lent,
}

impl AppState {
    pub(crate) fn probe(&self) -> MutexGuard<'_, ProbeState> {
        self.probe.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Every route, with the scope it needs (auth.rs); `/health`, `/ready`,
/// `/live` and `/metrics` are open to all.
pub(crate) fn router(state: AppState) -> Router {
    let guarded = |needs: Scope, routes: Router<AppState>| {
        routes.route_layer(middleware::from_fn_with_state(
            Guard {
                tokens: state.tokens.clone(),
                agent_uid: state.agent_uid,
                needs,
            },
            auth::guard,
        ))
    };
    let admin = Router::new().route("/v1/workers/{name}/reset", post(tasks::reset));
    let task = Router::new()
        .route("/v1/tasks", post(tasks::create))
        .route("/v1/tasks/{task_id}", delete(tasks::delete));
    let read = Router::new()
        .route("/v1/status", get(status::status))
        .route("/v1/events", get(events::list));
    // Writes answer once their events are stored (see `stored_first`).
    let stored_first = |routes: Router<AppState>| {
        routes.route_layer(middleware::from_fn_with_state(
            state.outbox.clone(),
            stored_first,
        ))
    };
    Router::new()
        .merge(guarded(Scope::Admin, stored_first(admin)))
        .merge(guarded(Scope::Task, stored_first(task)))
        .merge(guarded(Scope::Read, read))
        .layer(DefaultBodyLimit::max(tasks::MAX_BODY_BYTES))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/live", get(health::live))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .with_state(state)
}

/// How long a write's answer waits for its events to be stored.
pub(crate) const STORE_WAIT: Duration = Duration::from_secs(2);

/// Runs a write (a task started or ended, a worker reset) and answers only
/// once the events it made are in the state directory, synced: the
/// outbox's group commit, shared by every request waiting. So a 2xx is
/// never lost to a crash. While the state directory cannot be written
/// (`/health` degraded), or past [`STORE_WAIT`], the answer goes out with
/// the events held in memory, and `memwatch-stored: false` says so.
async fn stored_first(State(outbox): State<Outbox>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if !outbox.stored(STORE_WAIT).await {
        response
            .headers_mut()
            .insert("memwatch-stored", HeaderValue::from_static("false"));
    }
    response
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
pub(crate) mod tests;
