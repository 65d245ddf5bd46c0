//! `GET /v1/events?after=SEQ&limit=N`: events from the outbox, oldest first.

use axum::{
    Json,
    extract::{Query, State, rejection::QueryRejection},
    http::StatusCode,
};
use serde::Deserialize;

use super::{ApiError, AppState};
use crate::model::event::Event;

/// Events per page when `limit` is not given.
pub(super) const DEFAULT_LIMIT: usize = 100;
/// The most events one page returns.
pub(super) const MAX_LIMIT: usize = 1000;
/// The most bytes of JSON one page holds (a heartbeat can be large): the
/// page ends before the event that would pass it, never before the first.
pub(super) const MAX_PAGE_BYTES: usize = 4 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    #[serde(default)]
    after: u64,
    limit: Option<usize>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<Vec<Event>>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("limit must be between 1 and {MAX_LIMIT}, got {limit}"),
        ));
    }
    let mut page = state.outbox.read(query.after, limit);
    let mut bytes = 0;
    let fits = page
        .iter()
        .take_while(|event| {
            bytes += serde_json::to_vec(event).map_or(0, |json| json.len() + 1);
            bytes <= MAX_PAGE_BYTES
        })
        .count();
    page.truncate(fits.max(1));
    Ok(Json(page))
}
