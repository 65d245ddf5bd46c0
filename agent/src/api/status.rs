//! `GET /v1/status`: the agent's full state (the same JSON as heartbeats carry).

use axum::{Json, extract::State};

use super::AppState;
use crate::daemon::status::AgentStatus;

pub(super) async fn status(State(state): State<AppState>) -> Json<AgentStatus> {
    let mut status = (state.status)();
    status.socket = state.socket.clone();
    Json(status)
}
