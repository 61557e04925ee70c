//! The ingest handlers: `POST .../changes`, `.../snapshots` and `.../commit`;
//! a body decoded by its content type, the idempotency key, `?wait=commit`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::errors::{ApiError, ApiResult, ErrorResponse};
use super::guards::authorize;
use super::{ARROW_STREAM, NDJSON};
use crate::core::flow::SchemaEvolution;
use crate::error::Error;
use crate::service::Service;
use crate::service::input;

#[derive(Deserialize)]
pub(super) struct ChangesQuery {
    wait: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ChangesResponse {
    /// Rows in the batch.
    pub accepted: usize,
    /// The batch's offset in the flow's log (the same for a retried Idempotency-Key).
    pub offset: i64,
    /// True when the Idempotency-Key was seen before: this answer repeats the
    /// first one and nothing new was logged.
    pub duplicate: bool,
    /// With `?wait=commit`: the snapshot that contains the batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub snapshot_id: Option<Option<i64>>,
}

#[derive(Deserialize)]
pub(super) struct SnapshotQuery {
    version: Option<i64>,
    wait: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct SnapshotResponse {
    /// Rows in the snapshot (0 when skipped).
    pub accepted: usize,
    /// The snapshot's offset in the flow's log.
    pub offset: i64,
    /// True when the Idempotency-Key was seen before.
    pub duplicate: bool,
    pub version: i64,
    /// True when `version` is not above the highest version accepted: nothing
    /// was logged and nothing will be applied.
    pub skipped: bool,
    /// The highest version accepted before this push.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_version: Option<i64>,
    /// With `?wait=commit`: the snapshot that contains the changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub snapshot_id: Option<Option<i64>>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct CommitResponse {
    /// The snapshot committed, or null when nothing was pending.
    pub snapshot_id: Option<i64>,
    /// The flow's applied offset after the commit.
    pub offset: i64,
}

/// The body of a push in the flow's source schema, and its Idempotency-Key.
pub(super) async fn decode_body(
    service: &Arc<Service>,
    rt: Arc<crate::service::FlowRuntime>,
    headers: &HeaderMap,
    body: Bytes,
) -> ApiResult<(
    Arc<crate::service::FlowRuntime>,
    arrow_array::RecordBatch,
    Option<String>,
)> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let key = idempotency_key(headers)?;
    let format = match ctype.as_str() {
        NDJSON | "application/jsonl" => input::BodyFormat::Ndjson,
        "application/json" => input::BodyFormat::JsonArray,
        ARROW_STREAM => input::BodyFormat::ArrowStream,
        other => {
            rt.count_rejected();
            return Err(ApiError::UnsupportedMediaType(format!(
                "content type `{other}` is not accepted; use {NDJSON}, application/json (an array of objects) or {ARROW_STREAM}"
            )));
        }
    };
    let limits = service.limits();
    let first = decode_with(&rt.flow, format, &body, limits, true).await?;
    let err = match first {
        Ok(b) => return Ok((rt, b, key)),
        Err(e) if rt.flow.config.schema_evolution != SchemaEvolution::AddColumns => e,
        Err(_) => {
            // An `add_columns` flow: fields that name no column become
            // columns (one definition change), then the body is read again.
            let f = rt.flow.clone();
            let b = body.clone();
            let columns = tokio::task::spawn_blocking(move || {
                input::catch_quietly(|| input::new_columns(&f, format, &b, limits))
                    .unwrap_or_else(|_| Ok(Vec::new()))
            })
            .await
            .map_err(|e| ApiError::from(Error::Unavailable(e.to_string())))?;
            match columns {
                // Every unknown field is null in every row: nothing to add
                // yet, and nothing to refuse (the fields are ignored).
                Ok(c) if c.is_empty() => {
                    match decode_with(&rt.flow, format, &body, limits, false).await? {
                        Ok(b) => return Ok((rt, b, key)),
                        Err(e) => e,
                    }
                }
                Err(refused) => refused,
                Ok(columns) => {
                    // The body must be good under the widened definition
                    // before anything is added: a refused push adds nothing.
                    let candidate = crate::core::flow::Flow::new(
                        crate::service::infer::with_columns(&rt.flow, &columns)?,
                    )?;
                    let checked = decode_with(&candidate, format, &body, limits, false)
                        .await?
                        .and_then(|b| crate::core::resolve::validate(&candidate, &b));
                    if let Err(e) = checked {
                        rt.count_rejected();
                        return Err(e.into());
                    }
                    let rt = service.add_columns(&rt, columns).await?;
                    return match decode_with(&rt.flow, format, &body, limits, false).await? {
                        Ok(b) => Ok((rt, b, key)),
                        Err(e) => {
                            rt.count_rejected();
                            Err(e.into())
                        }
                    };
                }
            }
        }
    };
    rt.count_rejected();
    Err(err.into())
}

/// Decodes a body on a blocking thread. A decoder panic on hostile bytes
/// is the body's fault: a 400 without the panic's text, never a dead
/// worker or a 5xx.
pub(super) async fn decode_with(
    flow: &crate::core::flow::Flow,
    format: input::BodyFormat,
    body: &Bytes,
    limits: input::Limits,
    strict: bool,
) -> ApiResult<crate::error::Result<arrow_array::RecordBatch>> {
    let (f, body) = (flow.clone(), body.clone());
    tokio::task::spawn_blocking(move || {
        input::catch_quietly(|| input::decode(&f, format, &body, limits, strict)).unwrap_or_else(
            |_| {
                Err(Error::Input {
                    code: crate::error::codes::MALFORMED_BODY,
                    flow: f.name.clone(),
                    message: "the body could not be decoded".into(),
                })
            },
        )
    })
    .await
    .map_err(|e| ApiError::from(Error::Unavailable(e.to_string())))
}

/// The `Idempotency-Key` header: 1 to 200 visible ASCII characters. An
/// empty key would make every later keyless-looking push a "duplicate".
pub(super) fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    // Debezium Server's HTTP sink sends a `webhook-id`, stable across its
    // retries (the standard-webhooks authentication mode).
    let Some(v) = headers
        .get("idempotency-key")
        .or_else(|| headers.get("webhook-id"))
    else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Err(ApiError::BadIdempotencyKey(format!(
            "Idempotency-Key {why}"
        )))
    };
    let Ok(k) = v.to_str() else {
        return bad("must be visible ASCII");
    };
    if k.trim().is_empty() {
        return bad("is empty; leave the header out or send a non-empty key");
    }
    if k.len() > 200 {
        return bad("is longer than 200 bytes");
    }
    Ok(Some(k.to_string()))
}

/// Push a batch of changes. Validated whole, then made durable and acknowledged.
#[utoipa::path(
    post,
    path = "/v1/flows/{flow}/changes",
    params(
        ("flow" = String, Path, description = "flow name"),
        ("wait" = Option<String>, Query, description = "`commit`: answer once the batch is committed"),
        ("Idempotency-Key" = Option<String>, Header, description = "a retry with the same key is acknowledged with the same offset and applied once"),
    ),
    request_body(description = "the changes, in the flow's columns", content(
        ("application/x-ndjson"),
        (Vec<Object> = "application/json"),
        ("application/vnd.apache.arrow.stream"),
    )),
    responses(
        (status = 202, description = "durable in the flow's log", body = ChangesResponse),
        (status = 200, description = "with ?wait=commit: committed", body = ChangesResponse),
        (status = 400, description = "malformed body, unknown column or wrong type (row and column given)", body = ErrorResponse),
        (status = 413, description = "body over server.max_body_bytes"),
        (status = 415, description = "unsupported content type", body = ErrorResponse),
        (status = 422, description = "null key or sequence (row and column given)", body = ErrorResponse),
        (status = 429, description = "over max_uncommitted_bytes or max_log_bytes; see Retry-After", body = ErrorResponse),
        (status = 504, description = "with ?wait=commit: durable, not yet committed", body = ErrorResponse),
        (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on this flow", body = ErrorResponse), (status = 404, description = "unknown flow", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)
    )
)]
pub(super) async fn post_changes(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    Query(q): Query<ChangesQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    authorize(&service, &headers, Some(&flow))?;
    let rt = service.flow(&flow)?;
    let (rt, batch, key) = decode_body(&service, rt, &headers, body).await?;
    let accepted = service.ingest(&rt, batch, key).await?;
    if q.wait.as_deref() == Some("commit") {
        let snapshot_id = wait_for_commit(&service, &rt, accepted.offset).await?;
        return Ok((
            StatusCode::OK,
            Json(ChangesResponse {
                snapshot_id: Some(snapshot_id),
                ..ChangesResponse::from(&accepted)
            }),
        )
            .into_response());
    }
    Ok((StatusCode::ACCEPTED, Json(ChangesResponse::from(&accepted))).into_response())
}

impl From<&crate::service::Accepted> for ChangesResponse {
    fn from(a: &crate::service::Accepted) -> Self {
        ChangesResponse {
            accepted: a.accepted,
            offset: a.offset,
            duplicate: a.duplicate,
            snapshot_id: None,
        }
    }
}

/// Push a whole snapshot of the source (`from_snapshot` flows). Its
/// difference to the target is applied as changes at `version`.
#[utoipa::path(
    post,
    path = "/v1/flows/{flow}/snapshots",
    params(
        ("flow" = String, Path, description = "flow name"),
        ("version" = i64, Query, description = "the snapshot's version; versions must increase"),
        ("wait" = Option<String>, Query, description = "`commit`: answer once the snapshot is committed"),
        ("Idempotency-Key" = Option<String>, Header, description = "a retry with the same key is acknowledged with the same offset and applied once"),
    ),
    request_body(description = "every row of the source, in the flow's columns", content(
        ("application/x-ndjson"),
        (Vec<Object> = "application/json"),
        ("application/vnd.apache.arrow.stream"),
    )),
    responses(
        (status = 202, description = "durable in the flow's log", body = SnapshotResponse),
        (status = 200, description = "skipped (an older or repeated version), or with ?wait=commit: committed", body = SnapshotResponse),
        (status = 400, description = "no version, not a from_snapshot flow, malformed body, unknown column or wrong type", body = ErrorResponse),
        (status = 422, description = "null key, or a key twice (row and column given)", body = ErrorResponse),
        (status = 429, description = "over max_uncommitted_bytes or max_log_bytes; see Retry-After", body = ErrorResponse),
        (status = 504, description = "with ?wait=commit: durable, not yet committed", body = ErrorResponse),
        (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on this flow", body = ErrorResponse), (status = 404, description = "unknown flow", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)
    )
)]
pub(super) async fn post_snapshots(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    Query(q): Query<SnapshotQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    authorize(&service, &headers, Some(&flow))?;
    let rt = service.flow(&flow)?;
    let Some(version) = q.version else {
        return Err(ApiError::SnapshotVersionRequired("a snapshot needs its version: POST /v1/flows/{flow}/snapshots?version=V (versions must increase)".into()));
    };
    let (rt, batch, key) = decode_body(&service, rt, &headers, body).await?;
    let accepted = service.ingest_snapshot(&rt, batch, version, key).await?;
    let mut answer = SnapshotResponse {
        accepted: accepted.accepted,
        offset: accepted.offset,
        duplicate: accepted.duplicate,
        version,
        skipped: accepted.skipped_for_version.is_some(),
        current_version: accepted.skipped_for_version,
        snapshot_id: None,
    };
    if answer.skipped {
        return Ok((StatusCode::OK, Json(answer)).into_response());
    }
    if q.wait.as_deref() == Some("commit") {
        answer.snapshot_id = Some(wait_for_commit(&service, &rt, accepted.offset).await?);
        return Ok((StatusCode::OK, Json(answer)).into_response());
    }
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

/// Waits (up to the request timeout) until the flow has applied `offset`;
/// returns the snapshot that holds it.
pub(super) async fn wait_for_commit(
    service: &Service,
    rt: &crate::service::FlowRuntime,
    offset: i64,
) -> ApiResult<Option<i64>> {
    let mut rx = rt.subscribe();
    rt.commit_through(offset);
    let timeout = service
        .config
        .request_timeout()
        .unwrap_or(Duration::from_secs(60));
    let done = tokio::time::timeout(timeout, rx.wait_for(|c| c.offset >= offset))
        .await
        .map_err(|_| {
            ApiError::CommitTimeout(format!(
                "batch {offset} is durable but not committed within {timeout:?}; it will be"
            ))
        })?
        .map_err(|_| ApiError::from(Error::Unavailable("the flow stopped".into())))?;
    Ok(done.snapshot_id)
}

/// Commit what is pending now.
#[utoipa::path(
    post,
    path = "/v1/flows/{flow}/commit",
    params(("flow" = String, Path, description = "flow name")),
    responses(
        (status = 200, description = "committed (snapshot_id null when nothing was pending)", body = CommitResponse),
        (status = 504, description = "the commit did not finish in time", body = ErrorResponse),
        (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on this flow", body = ErrorResponse), (status = 404, description = "unknown flow", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)
    )
)]
pub(super) async fn post_commit(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<CommitResponse>> {
    authorize(&service, &headers, Some(&flow))?;
    let rt = service.flow(&flow)?;
    let status = rt.status();
    // Everything logged now, here or by another instance on a shared log
    // (whose end is asked of the broker: this instance's own view lags, and
    // a commit answered from it missed batches other instances had
    // acknowledged): wait until the committed offset passes it.
    let last = (status.applied_offset.max(0) + status.pending_batches as i64)
        .max(status.wal.next_offset - 1)
        .max(rt.log_end().await?);
    let mut rx = rt.subscribe();
    let before = rx.borrow().snapshot_id;
    if last <= rx.borrow().offset {
        return Ok(Json(CommitResponse {
            snapshot_id: None,
            offset: rx.borrow().offset.max(0),
        }));
    }
    rt.commit_through(last);
    let timeout = service
        .config
        .request_timeout()
        .unwrap_or(Duration::from_secs(60));
    let done = tokio::time::timeout(timeout, rx.wait_for(|c| c.offset >= last))
        .await
        .map_err(|_| {
            ApiError::CommitTimeout(format!(
                "the commit did not finish within {timeout:?}; see GET /v1/flows/{flow}"
            ))
        })?
        .map_err(|_| ApiError::from(Error::Unavailable("the flow stopped".into())))?;
    let snapshot = if done.snapshot_id != before {
        done.snapshot_id
    } else {
        None
    };
    Ok(Json(CommitResponse {
        snapshot_id: snapshot,
        offset: done.offset,
    }))
}
