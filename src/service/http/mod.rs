//! The HTTP API of `autocdc serve` (axum): decodes requests, checks tokens,
//! calls `service`, and turns `Error`s into `{"error": {...}}` responses with
//! a status and a stable code. No flow logic lives here.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::core::flow::{FlowConfig, SchemaEvolution};
use crate::error::{Error, codes};
use crate::service::Service;
use crate::service::input;

mod debezium;
mod requests;
pub use crate::service::traffic::{Connections, DURATION_BUCKETS, Durations, RequestStats};

pub const NDJSON: &str = "application/x-ndjson";
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// An error response: a library error, or a refusal of the HTTP layer
/// itself. The status comes from the code's entry in `error::REGISTRY`.
#[derive(Debug)]
pub enum ApiError {
    Library(Error),
    /// No bearer token, or an unknown one.
    Unauthorized(String),
    /// A token without this flow or namespace.
    Forbidden(String),
    UnsupportedMediaType(String),
    BodyTooLarge(String),
    /// Over `request_timeout`.
    RequestTimeout(String),
    /// A commit waited for (`/commit`, `?wait=commit`) did not finish in time.
    CommitTimeout(String),
    /// A maintenance run waited for (`/maintain`) did not finish in time.
    MaintenanceTimeout(String),
    BadIdempotencyKey(String),
    SnapshotVersionRequired(String),
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError::Library(e)
    }
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Library(e) => e.code(),
            ApiError::Unauthorized(_) => codes::UNAUTHORIZED,
            ApiError::Forbidden(_) => codes::FORBIDDEN,
            ApiError::UnsupportedMediaType(_) => codes::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTooLarge(_) => codes::BODY_TOO_LARGE,
            ApiError::RequestTimeout(_) => codes::REQUEST_TIMEOUT,
            ApiError::CommitTimeout(_) => codes::COMMIT_TIMEOUT,
            ApiError::MaintenanceTimeout(_) => codes::MAINTENANCE_TIMEOUT,
            ApiError::BadIdempotencyKey(_) => codes::BAD_IDEMPOTENCY_KEY,
            ApiError::SnapshotVersionRequired(_) => codes::SNAPSHOT_VERSION_REQUIRED,
        }
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(crate::error::status_of(self.code()))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn message(&self) -> String {
        match self {
            ApiError::Library(e) => e.to_string(),
            ApiError::Unauthorized(m)
            | ApiError::Forbidden(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::BodyTooLarge(m)
            | ApiError::RequestTimeout(m)
            | ApiError::CommitTimeout(m)
            | ApiError::MaintenanceTimeout(m)
            | ApiError::BadIdempotencyKey(m)
            | ApiError::SnapshotVersionRequired(m) => format!("[{}] {m}", self.code()),
        }
    }
}

/// Every error response: `{"error": {...}}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable code, e.g. `AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY`.
    pub code: String,
    pub message: String,
    /// The offending row of the batch (0-based), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row: Option<usize>,
    /// The offending column, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (row, column) = match &self {
            ApiError::Library(Error::Batch { row, column, .. }) => {
                (Some(*row), Some(column.clone()).filter(|c| !c.is_empty()))
            }
            _ => (None, None),
        };
        let body = ErrorResponse {
            error: ErrorBody {
                code: self.code().to_string(),
                message: self.message(),
                row,
                column,
            },
        };
        let mut resp = (status, Json(body)).into_response();
        if let ApiError::Library(Error::Overloaded {
            retry_after_secs, ..
        }) = &self
        {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        resp
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

pub fn router(service: Arc<Service>) -> Router {
    let limit = service.config.max_body_bytes;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi_json))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/flows", get(list_flows))
        .route(
            "/v1/flows/{flow}",
            get(get_flow).put(put_flow).delete(delete_flow),
        )
        .route("/v1/flows/{flow}/changes", post(post_changes))
        .route("/v1/debezium", post(debezium::post_debezium))
        .route("/v1/flows/{flow}/snapshots", post(post_snapshots))
        .route("/v1/flows/{flow}/commit", post(post_commit))
        .route("/v1/flows/{flow}/dead-letters", get(get_dead_letters))
        .route("/v1/flows/{flow}/maintain", post(post_maintain))
        .route_layer(axum::middleware::from_fn_with_state(
            service.clone(),
            requests::track,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            service.clone(),
            request_timeout,
        ))
        .layer(axum::middleware::from_fn_with_state(
            service.clone(),
            content_length_limit,
        ))
        .with_state(service)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
struct MaintainQuery {
    /// Report what would be done; change nothing.
    #[serde(default)]
    dry_run: bool,
}

/// Runs the flow's maintenance now, between its commits: snapshot expiry and
/// the cleanup of the files only expired snapshots referenced, then orphan
/// cleanup (`[maintenance] orphan_older_than`). Answers with what was done.
#[utoipa::path(
    post,
    path = "/v1/flows/{flow}/maintain",
    params(("flow" = String, Path, description = "flow name"), MaintainQuery),
    responses(
        (status = 200, description = "what the run did (or, dry, would do)", body = crate::table::engine::MaintenanceReport),
        (status = 504, description = "the run did not finish in time (it goes on)", body = ErrorResponse),
        (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on this flow", body = ErrorResponse), (status = 404, description = "unknown flow", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)
    )
)]
async fn post_maintain(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    Query(q): Query<MaintainQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<crate::table::engine::MaintenanceReport>> {
    authorize(&service, &headers, Some(&flow))?;
    let rt = service.flow(&flow)?;
    let timeout = service
        .config
        .request_timeout()
        .unwrap_or(Duration::from_secs(60));
    match rt.maintain(q.dry_run, timeout).await? {
        Some(report) => Ok(Json(report)),
        None => Err(ApiError::MaintenanceTimeout(format!(
            "maintenance of `{flow}` did not finish within {timeout:?}; it goes on, see GET /v1/flows/{flow}"
        ))),
    }
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "up", content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "the OpenAPI document", content_type = "application/json")))]
async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi())
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "autocdc",
        description = "Push change batches; autocdc keeps Iceberg tables equal to the latest change per key, by sequence."
    ),
    paths(
        get_dead_letters,
        post_changes,
        debezium::post_debezium,
        post_snapshots,
        post_commit,
        list_flows,
        get_flow,
        put_flow,
        delete_flow,
        healthz,
        readyz,
        post_maintain,
        metrics,
        openapi_json
    ),
    components(schemas(
        DeadLetterList,
        crate::service::dead_letter::DeadLetter,
        SnapshotResponse,
        ChangesResponse,
        debezium::DebeziumResponse,
        crate::service::debezium::Skipped,
        CommitResponse,
        crate::table::engine::MaintenanceReport,
        crate::table::maintain::TableReport,
        crate::table::maintain::TableStats,
        ErrorResponse,
        ErrorBody,
        FlowView,
        FlowList,
        FlowConfig
    ))
)]
struct ApiDoc;

/// The OpenAPI document of this API, generated from the handlers.
pub fn openapi() -> utoipa::openapi::OpenApi {
    use utoipa::OpenApi;
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// Bounds every request by `server.request_timeout` (plus a margin, so
/// `?wait=commit`, which waits that long itself, answers first).
async fn request_timeout(
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
/// of the body is read (the body limit alone would wait for it).
async fn content_length_limit(
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
        _ => next.run(req).await,
    }
}

/// Checks the bearer token when tokens are configured.
/// Checks the bearer token against `[server] tokens`; returns the token's
/// entry (None when no tokens are configured).
fn authorize<'a>(
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

#[derive(Deserialize)]
struct ChangesQuery {
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
struct SnapshotQuery {
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

#[derive(Serialize, utoipa::ToSchema)]
pub struct FlowView {
    pub name: String,
    pub target: String,
    pub definition: FlowConfig,
    pub status: crate::service::FlowStatus,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct FlowList {
    pub flows: Vec<FlowView>,
}

fn view(rt: &crate::service::FlowRuntime) -> FlowView {
    FlowView {
        name: rt.flow.name.clone(),
        target: rt.flow.target.to_string(),
        definition: rt.flow.config.clone(),
        status: rt.status(),
    }
}

/// The body of a push in the flow's source schema, and its Idempotency-Key.
async fn decode_body(
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
async fn decode_with(
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
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
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
async fn post_changes(
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
async fn post_snapshots(
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
async fn wait_for_commit(
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
async fn post_commit(
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

/// Every flow with its definition and status.
#[utoipa::path(get, path = "/v1/flows", responses(
    (status = 200, description = "the flows", body = FlowList),
    (status = 401, description = "missing or unknown token", body = ErrorResponse),
    (status = 403, description = "token limited to some flows", body = ErrorResponse),
))]
async fn list_flows(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
) -> ApiResult<Json<FlowList>> {
    authorize(&service, &headers, None)?;
    Ok(Json(FlowList {
        flows: service.flows().iter().map(|rt| view(rt)).collect(),
    }))
}

/// A flow's definition and status: offsets, pending work, counters, state size.
#[utoipa::path(get, path = "/v1/flows/{flow}",
    params(("flow" = String, Path, description = "flow name")),
    responses((status = 200, description = "the flow", body = FlowView), (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on this flow", body = ErrorResponse), (status = 404, description = "unknown flow", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)))]
async fn get_flow(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<FlowView>> {
    authorize(&service, &headers, Some(&flow))?;
    let rt = service.flow(&flow)?;
    Ok(Json(view(&rt)))
}

#[derive(Deserialize)]
struct DeadLetterQuery {
    limit: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct DeadLetterList {
    /// Letters kept (at most `server.max_dead_letters`).
    pub count: usize,
    /// The newest first, at most `limit` (default 100, at most 1000).
    pub dead_letters: Vec<crate::service::dead_letter::DeadLetter>,
}

/// The flow's dead letters: acknowledged records that can never be applied,
/// each with its offset, error and record file (in the flow's directory
/// under `data_dir`).
#[utoipa::path(get, path = "/v1/flows/{flow}/dead-letters",
    params(("flow" = String, Path, description = "flow name"), ("limit" = Option<usize>, Query, description = "at most this many, newest first (default 100, at most 1000)")),
    responses((status = 200, description = "the dead letters", body = DeadLetterList), (status = 404, description = "unknown flow", body = ErrorResponse)))]
async fn get_dead_letters(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    Query(q): Query<DeadLetterQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<DeadLetterList>> {
    authorize(&service, &headers, Some(&flow))?;
    let rt = service.flow(&flow)?;
    let limit = q.limit.unwrap_or(100).min(1000);
    let (count, dead_letters) = tokio::task::spawn_blocking(move || rt.dead.list(limit))
        .await
        .map_err(|e| ApiError::from(Error::Unavailable(e.to_string())))??;
    Ok(Json(DeadLetterList {
        count,
        dead_letters,
    }))
}

/// Create or replace a flow (fields as in a `[[flow]]` table); persisted in `data_dir`.
#[utoipa::path(put, path = "/v1/flows/{flow}",
    params(("flow" = String, Path, description = "flow name")),
    request_body(content = FlowConfig, description = "the definition; `name` may be left out"),
    responses(
        (status = 201, description = "created", body = FlowView),
        (status = 200, description = "replaced", body = FlowView),
        (status = 400, description = "invalid definition (stable code names the problem)", body = ErrorResponse),
        (status = 409, description = "the definition conflicts with the existing target (drift)", body = ErrorResponse),
        (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on this flow", body = ErrorResponse), (status = 404, description = "unknown flow", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)
    ))]
async fn put_flow(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let token = authorize(&service, &headers, Some(&flow))?;
    let mut value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::Library(Error::definition(
            &flow,
            codes::INVALID_DEFINITION,
            format!("the body is not a JSON flow definition: {e}"),
        ))
    })?;
    if let Some(obj) = value.as_object_mut() {
        obj.entry("name").or_insert_with(|| json!(flow));
    }
    let cfg: FlowConfig = serde_json::from_value(value).map_err(|e| {
        ApiError::Library(Error::definition(
            &flow,
            codes::INVALID_DEFINITION,
            format!("invalid flow definition: {e}"),
        ))
    })?;
    if cfg.name != flow {
        return Err(ApiError::Library(Error::definition(
            &flow,
            codes::INVALID_DEFINITION,
            format!("the body names flow `{}` but the path `{flow}`", cfg.name),
        )));
    }
    // A token with `namespaces` may only point flows at tables there (a
    // target that another flow writes is refused whatever the token).
    if let Some(t) = token
        && !t.namespaces.is_empty()
    {
        let ns = cfg.target.rsplit_once('.').map_or("", |(ns, _)| ns);
        if !t.namespaces.iter().any(|n| n == ns) {
            return Err(ApiError::Forbidden(format!(
                "this token may only define flows whose target is in namespace {}; `{}` is in `{ns}`",
                t.namespaces.join(", "),
                cfg.target
            )));
        }
    }
    let existed = service.flow(&flow).is_ok();
    let rt = service.put_flow(cfg).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(view(&rt))).into_response())
}

/// Stop a flow (committing what is pending) and forget its definition; the table stays.
#[utoipa::path(delete, path = "/v1/flows/{flow}",
    params(("flow" = String, Path, description = "flow name")),
    responses((status = 204, description = "stopped"), (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on this flow", body = ErrorResponse), (status = 404, description = "unknown flow", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)))]
async fn delete_flow(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    authorize(&service, &headers, Some(&flow))?;
    service.delete_flow(&flow).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Ready: recovery done and commits succeeding (503 `starting` or `degraded` otherwise).
#[utoipa::path(get, path = "/readyz", responses(
    (status = 200, description = "ready"),
    (status = 503, description = "starting, or degraded: commits or log writes are failing (flows listed)"),
))]
async fn readyz(State(service): State<Arc<Service>>) -> Response {
    let flows = service.flows();
    let degraded: Vec<_> = flows
        .iter()
        .map(|rt| (rt.flow.name.clone(), rt.status()))
        .filter(|(_, s)| s.degraded || s.wal.failing)
        .map(|(name, s)| {
            let error = match (&s.last_error, s.wal.failing) {
                (_, true) => Some(
                    "the flow's log cannot be written (see stderr, event=log_write_failed); pushes get 503 until it can".to_string(),
                ),
                (e, false) => e.clone(),
            };
            json!({ "flow": name, "last_error": error })
        })
        .collect();
    if !service.is_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "starting" })),
        )
            .into_response();
    }
    if !degraded.is_empty() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "degraded", "flows": degraded })),
        )
            .into_response();
    }
    // Maintenance failures do not stop ingest: shown, not made unready.
    let warnings: Vec<_> = flows
        .iter()
        .filter_map(|rt| {
            let m = rt.status().maintenance;
            m.last_error
                .map(|e| json!({ "flow": rt.flow.name, "maintenance_error": e }))
        })
        .collect();
    if warnings.is_empty() {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        Json(json!({ "status": "ready", "warnings": warnings })).into_response()
    }
}

/// Prometheus text format: per-flow counters, commit latency histogram, WAL bytes, state keys.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text", content_type = "text/plain")))]
async fn metrics(State(service): State<Arc<Service>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        super::metrics::render(&service),
    )
        .into_response()
}

/// A started service: its address, the service and the HTTP task.
pub struct Running {
    pub addr: std::net::SocketAddr,
    pub service: Arc<Service>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    stop: tokio::sync::watch::Sender<bool>,
    /// On a shared log: the task that keeps the flows' leases.
    lease_task: Option<tokio::task::JoinHandle<()>>,
    /// Applies the definitions other instances write (ends at once on the
    /// local store).
    definitions_task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting, waits for in-flight requests, commits what is pending.
    pub async fn stop(self) -> crate::Result<()> {
        self.stop.send_replace(true);
        let res = self.server.await;
        if let Some(t) = self.lease_task {
            let _ = t.await;
        }
        let _ = self.definitions_task.await;
        self.service.shutdown().await;
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(Error::Unavailable(e.to_string())),
        }
    }

    /// Waits for SIGTERM / SIGINT, then stops.
    pub async fn until_signal(self) -> crate::Result<()> {
        shutdown_signal().await;
        tracing::info!("stopping: committing what is pending");
        self.stop().await
    }
}

/// Binds `server.listen`, serves HTTP, and recovers every flow from its log;
/// returns once the service is ready.
pub async fn start(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
) -> crate::Result<Running> {
    match &config.ingest {
        crate::config::IngestConfig::Local => {
            let logs = Arc::new(crate::service::wal::LocalLogs::new(
                std::path::Path::new(&config.server.data_dir).join("flows"),
                faults.clone(),
            ));
            start_inner(config, faults, logs, None).await
        }
        crate::config::IngestConfig::Nats(nats) => {
            let logs = crate::service::nats_log::NatsLogs::connect(
                nats,
                config.server.idempotency_window()?,
            )
            .await?;
            let leases = Arc::new(logs.leases().await?);
            let definitions = Arc::new(logs.definitions().await?);
            start_inner(config, faults, Arc::new(logs), Some((leases, definitions))).await
        }
    }
}

/// `start` with each flow's ingest log opened by `logs` (the seam for logs
/// other than the local one).
pub async fn start_with_logs(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
    logs: Arc<dyn crate::service::wal::LogFactory>,
) -> crate::Result<Running> {
    start_inner(config, faults, logs, None).await
}

async fn start_inner(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
    logs: Arc<dyn crate::service::wal::LogFactory>,
    shared: Option<(
        Arc<crate::service::lease::Leases>,
        Arc<crate::service::definitions::NatsDefinitions>,
    )>,
) -> crate::Result<Running> {
    let catalog = crate::table::catalog::open(&config.catalog, faults.clone())?;
    let flows = config.flows()?;
    config.maintenance.schedule()?;
    let mut server = config.server.clone();
    server.maintenance = config.maintenance.clone();
    let service = Service::with_logs(server, catalog, faults, logs)?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .map_err(|e| Error::Config(format!("server.listen = {}: {e}", config.server.listen)))?;
    let addr = listener.local_addr()?;
    let app = router(service.clone());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let limits = ConnLimits {
        max_connections: config.server.max_connections.max(1),
        header_read_timeout: config.server.header_read_timeout()?,
        shutdown_grace: config.server.shutdown_grace()?,
    };
    let lease_task = shared.map(|(l, d)| {
        service.set_leases(l.clone());
        service.set_definitions(d);
        tokio::spawn(lease_loop(service.clone(), l, stopped.clone()))
    });
    let definitions_stop = stopped.clone();
    let server = tokio::spawn(accept_loop(listener, app, service.clone(), limits, stopped));
    tracing::info!(
        data_dir = %config.server.data_dir,
        flows = flows.len(),
        "listening on http://{addr}; recovering the flows"
    );
    if let Err(e) = service.start(flows).await {
        server.abort();
        if let Some(t) = lease_task {
            t.abort();
        }
        return Err(e);
    }
    let definitions_task = tokio::spawn(service.clone().follow_definitions(definitions_stop));
    tracing::info!("ready");
    Ok(Running {
        addr,
        service,
        server,
        stop,
        lease_task,
        definitions_task,
    })
}

/// Renews, takes and gives back the flows' leases every quarter of their
/// TTL, and wakes a flow's committer when its lease changed hands.
async fn lease_loop(
    service: Arc<Service>,
    leases: Arc<crate::service::lease::Leases>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // The flows are recovered first: the first round then covers them all.
    while !service.is_ready() {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
    loop {
        let flows = service.flows();
        let names: Vec<String> = flows.iter().map(|rt| rt.flow.name.clone()).collect();
        let before: Vec<Option<u64>> = names.iter().map(|n| leases.holds(n)).collect();
        tokio::select! {
            _ = leases.tick(&names) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        for ((rt, name), was) in flows.iter().zip(&names).zip(before) {
            if leases.holds(name) != was {
                rt.wake();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(leases.period()) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

struct ConnLimits {
    max_connections: usize,
    header_read_timeout: std::time::Duration,
    shutdown_grace: std::time::Duration,
}

/// Accepts connections and serves each with hyper's HTTP/1.1 server, with
/// what `axum::serve` lacks for untrusted clients:
/// - a client must send each request head within `header_read_timeout`
///   (an idle keep-alive connection is closed after it, too);
/// - at most `max_connections` are open; one more is closed at once and
///   counted, so idle sockets cannot use up the process's files;
/// - at stop, connections get `shutdown_grace` to finish what they are
///   doing; whatever still holds one open (a half-sent head) is then cut,
///   so shutdown, and the commit of what is pending, cannot be held up.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    service: Arc<Service>,
    limits: ConnLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let (closing, closing_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of files or similar: do not spin; the connections
                // that end free what is needed.
                tracing::warn!(error = %e, "accept_failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            service.connections.refused.fetch_add(1, Relaxed);
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut closing = closing_rx.clone();
        let open = service.clone();
        let timeout = limits.header_read_timeout;
        tasks.spawn(async move {
            let _permit = permit;
            open.connections.open.fetch_add(1, Relaxed);
            let _open = OpenConnection(&open.connections);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(timeout);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
            let mut conn = std::pin::pin!(conn);
            let closed = tokio::select! {
                _ = conn.as_mut() => true,
                _ = closing.wait_for(|c| *c) => false,
            };
            if !closed {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        });
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = tasks.len(),
            "connections_cut: still open after server.shutdown_grace"
        );
        tasks.shutdown().await;
    }
    Ok(())
}

struct OpenConnection<'a>(&'a Connections);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `autocdc serve`: runs until SIGTERM or SIGINT, then commits what is pending.
pub async fn serve(
    config: crate::config::Config,
    faults: Arc<crate::fault::Faults>,
) -> crate::Result<()> {
    start(config, faults).await?.until_signal().await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
