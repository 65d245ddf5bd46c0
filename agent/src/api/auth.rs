//! Bearer-token check for mutating routes, when a token is configured.

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use subtle::ConstantTimeEq as _;

use super::{ApiError, AppState};

/// Lets the request through when no token is configured or the request
/// carries `Authorization: Bearer <token>`; 401 otherwise.
pub(super) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.api_token.as_deref() else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(token) if bool::from(token.as_bytes().ct_eq(expected.as_bytes())) => {
            next.run(request).await
        }
        _ => {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "this route needs `Authorization: Bearer <token>` (the agent's api_token)",
            )
            .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            response
        }
    }
}
