//! `/metrics` in the Prometheus text format.

use axum::{
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
};
use prometheus::{Encoder as _, TextEncoder};

use super::{ApiError, AppState};

pub(super) async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    encoder
        .encode(&state.registry.gather(), &mut body)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((
        [(header::CONTENT_TYPE, encoder.format_type().to_string())],
        body,
    ))
}
