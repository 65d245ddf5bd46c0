//! `GET /v1/status`: the full state, for a scheduler to reconcile with.

use axum::{Json, extract::State};
use serde::Serialize;

use super::AppState;
use crate::watchdog::{task::TaskView, worker::WorkerView};

#[derive(Serialize)]
pub struct Status {
    pub host: String,
    pub version: &'static str,
    pub source: Option<&'static str>,
    pub workers: Vec<WorkerView>,
    pub tasks: Vec<TaskView>,
    /// Recently finished tasks, oldest first, with how they ended.
    pub finished_tasks: Vec<TaskView>,
}

pub async fn status(State(state): State<AppState>) -> Json<Status> {
    Json(Status {
        host: state.outbox.host().to_string(),
        version: env!("CARGO_PKG_VERSION"),
        source: state.probe().source.map(|s| s.as_str()),
        workers: state.monitor.workers(),
        tasks: state.monitor.tasks(),
        finished_tasks: state.monitor.finished_tasks(),
    })
}
