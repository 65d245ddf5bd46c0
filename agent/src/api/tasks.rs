//! `POST /v1/tasks`, `DELETE /v1/tasks/{task_id}`, `POST /v1/workers/{name}/reset`.

use std::path::PathBuf;

use axum::{
    Extension, Json,
    extract::{Path, Query, State, rejection::JsonRejection, rejection::QueryRejection},
    http::StatusCode,
};
use serde::{Deserialize, Serialize};

use super::{
    ApiError, AppState,
    auth::{Caller, Peer, Scope},
    owned,
};
use crate::{
    model::spec::{MemorySource, TaskOutcome, TaskRequest},
    watchdog::{
        policy::{Admission, WatchdogError},
        task::TaskView,
    },
};

/// Largest accepted request body.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest task id or worker name.
const MAX_NAME_LEN: usize = 256;

/// The registration body (contract in DESIGN.md). Unknown fields are errors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewTask {
    pub task_id: String,
    pub worker: Option<String>,
    pub pid: Option<u32>,
    pub cgroup: Option<PathBuf>,
    pub soft_cap_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct TaskAnswer {
    /// `accepted`, `flagged` or `rejected`.
    pub verdict: String,
    pub task_id: String,
    pub worker: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The caller becomes the task's owner: only it (or an admin) may end it.
/// With a Slurm sink that requeues, the caller's pid (known on the local
/// socket only) is placed in its Slurm job by Slurm itself, the proof a
/// requeue needs (sinks/slurm/jobs.rs).
pub(crate) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    peer: Option<Extension<Peer>>,
    body: Result<Json<NewTask>, JsonRejection>,
) -> Result<(StatusCode, Json<TaskAnswer>), ApiError> {
    let Json(task) = body.map_err(json_error)?;
    let request = checked(&state, task, caller).await?;
    let task_id = request.task_id.clone();
    // Off the runtime: it reads the task's memory (/proc, cgroup files) and
    // writes the outbox (SQLite).
    let monitor = state.monitor.clone();
    let registration = tokio::task::spawn_blocking(move || monitor.register(request))
        .await
        .map_err(join_error)?
        .map_err(watchdog_error)?;
    // Before the answer: `memwatch exec` starts its workload only then.
    let process = match peer {
        Some(Extension(Peer::Unix { pid, .. })) => pid,
        _ => None,
    };
    state
        .lent
        .task_registered(&task_id, Some(&registration.worker), process)
        .await;
    let (code, verdict, reason) = match registration.admission {
        Admission::Accepted => (StatusCode::CREATED, "accepted", None),
        Admission::Flagged { reason } => (StatusCode::CREATED, "flagged", Some(reason)),
        Admission::Rejected { reason } => (StatusCode::CONFLICT, "rejected", Some(reason)),
    };
    Ok((
        code,
        Json(TaskAnswer {
            verdict: verdict.into(),
            task_id,
            worker: registration.worker,
            reason,
        }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndQuery {
    /// The task's exit status, when the caller knows it.
    exit_code: Option<i32>,
    /// `true` when the caller saw the task OOM-killed.
    #[serde(default)]
    oom_killed: bool,
}

/// Only the task's owner or an admin may end it (403 for anyone else).
pub(crate) async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(task_id): Path<String>,
    query: Result<Query<EndQuery>, QueryRejection>,
) -> Result<Json<TaskView>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let outcome = if query.oom_killed {
        TaskOutcome::OomKilled
    } else {
        TaskOutcome::Ended {
            exit_code: query.exit_code,
        }
    };
    let principal = (!caller.any_owner).then_some(caller.principal);
    // Off the runtime: it writes the outbox (SQLite).
    let monitor = state.monitor.clone();
    tokio::task::spawn_blocking(move || monitor.finish_by(&task_id, outcome, principal.as_deref()))
        .await
        .map_err(join_error)?
        .map(Json)
        .map_err(watchdog_error)
}

/// A blocking task that panicked or was cancelled: 500.
fn join_error(e: tokio::task::JoinError) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

pub(crate) async fn reset(
    State(state): State<AppState>,
    Path(worker): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let monitor = state.monitor.clone();
    let name = worker.clone();
    let reset = tokio::task::spawn_blocking(move || monitor.reset(&name))
        .await
        .map_err(join_error)?;
    reset.map_err(|e| match e {
        WatchdogError::UnknownWorker(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        other => watchdog_error(other),
    })?;
    Ok(Json(
        serde_json::json!({ "worker": worker, "status": "healthy" }),
    ))
}

/// [`validate`], then, for a caller on the socket below admin, that the
/// source is its own (owned.rs): off the runtime, since both read the file
/// system and `/proc` (a hung mount must not stall every request).
async fn checked(state: &AppState, task: NewTask, caller: Caller) -> Result<TaskRequest, ApiError> {
    let root = state.monitor.cgroup_root();
    let workers: Vec<PathBuf> = state
        .monitor
        .workers()
        .into_iter()
        .filter_map(|w| w.cgroup.map(PathBuf::from))
        .collect();
    let owners = state.owners.clone();
    let user = caller.uid.filter(|_| caller.scope < Scope::Admin);
    tokio::task::spawn_blocking(move || {
        let request = validate(task, &root, caller.principal)?;
        if let (Some(uid), Some(source)) = (user, &request.source) {
            let workers: Vec<&std::path::Path> = workers.iter().map(PathBuf::as_path).collect();
            owned::may_register(owners.as_ref(), uid, source, &root, &workers)
                .map_err(|reason| ApiError::new(StatusCode::FORBIDDEN, reason))?;
        }
        Ok(request)
    })
    .await
    .map_err(join_error)?
}

/// Checks everything before the watchdog sees the request, so a bad one
/// changes nothing.
fn validate(
    task: NewTask,
    cgroup_root: &std::path::Path,
    owner: String,
) -> Result<TaskRequest, ApiError> {
    let bad = |message: String| ApiError::new(StatusCode::BAD_REQUEST, message);
    check_name("task_id", &task.task_id).map_err(bad)?;
    if let Some(worker) = &task.worker {
        check_name("worker", worker).map_err(bad)?;
    }
    let source = match (task.pid, task.cgroup) {
        (Some(_), Some(_)) => return Err(bad("give `pid` or `cgroup`, not both".into())),
        (Some(0), None) => return Err(bad("`pid` must be a process id, not 0".into())),
        (Some(pid), None) => Some(MemorySource::Pid(pid)),
        (None, Some(path)) if !path.is_absolute() => {
            return Err(bad(format!(
                "`cgroup` must be an absolute path, got {}",
                path.display()
            )));
        }
        (None, Some(path)) if !path.is_dir() => {
            return Err(bad(format!("`cgroup` {} does not exist", path.display())));
        }
        (None, Some(path)) => match crate::cgroup::cgroup_under(cgroup_root, &path) {
            Ok(real) => Some(MemorySource::Cgroup(real)),
            Err(problem) => return Err(bad(format!("`cgroup` {}: {problem}", path.display()))),
        },
        (None, None) => None,
    };
    Ok(TaskRequest {
        task_id: task.task_id,
        worker: task.worker,
        source,
        soft_cap: task.soft_cap_bytes,
        owner,
    })
}

fn check_name(key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_NAME_LEN {
        return Err(format!("`{key}` must be 1 to {MAX_NAME_LEN} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("`{key}` must not contain control characters"));
    }
    Ok(())
}

/// Malformed JSON, wrong types and unknown fields are 400; a wrong content
/// type 415; a body over the limit 413.
fn json_error(rejection: JsonRejection) -> ApiError {
    let status = match rejection.status() {
        StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
        other => other,
    };
    ApiError::new(status, rejection.body_text())
}

fn watchdog_error(error: WatchdogError) -> ApiError {
    let status = match error {
        WatchdogError::UnknownTask(_) => StatusCode::NOT_FOUND,
        WatchdogError::UnknownWorker(_) | WatchdogError::WorkerRequired(_) => {
            StatusCode::BAD_REQUEST
        }
        WatchdogError::TooManyTasks { .. } => StatusCode::TOO_MANY_REQUESTS,
        WatchdogError::NotOwner { .. } => StatusCode::FORBIDDEN,
        WatchdogError::TaskTaken { .. } => StatusCode::CONFLICT,
    };
    ApiError::new(status, error.to_string())
}
