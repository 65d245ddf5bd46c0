//! `GET /v1/status`: the agent's full state (the same JSON as heartbeats carry).

use axum::{Json, extract::State};

use super::AppState;

pub async fn status(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json((state.status)())
}
