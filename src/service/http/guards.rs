//! What every request passes before its handler: the request timeout, the
//! declared body size, and the bearer token (`authorize`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::errors::{ApiError, ApiResult};
use crate::service::Service;

/// Bounds every request by `server.request_timeout` (plus a margin, so
/// `?wait=commit`, which waits that long itself, answers first).
pub(super) async fn request_timeout(
    State(service): State<Arc<Service>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let limit = service
        .config
        .request_timeout()
        .unwrap_or(Duration::from_secs(60))
        + Duration::from_secs(5);
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::RequestTimeout(format!(
            "the request took longer than {limit:?}; retry it (with its Idempotency-Key)"
        ))
        .into_response(),
    }
}

/// A `Content-Length` over `max_body_bytes` is refused at once, before any
/// of the body is read (the body limit alone would wait for it); a body
/// found over it while read is refused with the same code.
pub(super) async fn content_length_limit(
    State(service): State<Arc<Service>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let limit = service.config.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => ApiError::BodyTooLarge(format!(
            "the body is {n} bytes, over server.max_body_bytes = {limit}; send smaller requests"
        ))
        .into_response(),
        _ => {
            let resp = next.run(req).await;
            // axum's own refusal of a body it found over the limit while
            // reading it (one sent without `Content-Length`) is plain text:
            // it gets the JSON error and code every refusal has.
            let json = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            if resp.status() == StatusCode::PAYLOAD_TOO_LARGE && !json {
                return ApiError::BodyTooLarge(format!(
                    "the body is over server.max_body_bytes = {limit} bytes; send smaller requests"
                ))
                .into_response();
            }
            resp
        }
    }
}

/// Checks the bearer token when tokens are configured.
/// Checks the bearer token against `[server] tokens`; returns the token's
/// entry (None when no tokens are configured).
pub(super) fn authorize<'a>(
    service: &'a Service,
    headers: &HeaderMap,
    flow: Option<&str>,
) -> ApiResult<Option<&'a crate::config::TokenConfig>> {
    let tokens = &service.config.tokens;
    if tokens.is_empty() {
        return Ok(None);
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(given) = given else {
        return Err(ApiError::Unauthorized(
            "missing `Authorization: Bearer <token>`".into(),
        ));
    };
    let Some(t) = tokens.iter().find(|t| t.token == given) else {
        return Err(ApiError::Unauthorized("unknown token".into()));
    };
    match flow {
        Some(f) if !t.flows.is_empty() && !t.flows.iter().any(|x| x == f) => Err(
            ApiError::Forbidden(format!("this token may not use flow `{f}`")),
        ),
        None if !t.flows.is_empty() => Err(ApiError::Forbidden(
            "this token is limited to some flows".into(),
        )),
        _ => Ok(Some(t)),
    }
}
