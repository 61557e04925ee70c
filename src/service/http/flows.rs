//! The flow handlers: list, get, put (define or change), delete, dead
//! letters, maintain.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::errors::{ApiError, ApiResult, ErrorResponse};
use super::guards::authorize;
use crate::core::flow::FlowConfig;
use crate::error::{Error, codes};
use crate::service::Service;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct MaintainQuery {
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
pub(super) async fn post_maintain(
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

pub(super) fn view(rt: &crate::service::FlowRuntime) -> FlowView {
    FlowView {
        name: rt.flow.name.clone(),
        target: rt.flow.target.to_string(),
        definition: rt.flow.config.clone(),
        status: rt.status(),
    }
}

/// Every flow with its definition and status.
#[utoipa::path(get, path = "/v1/flows", responses(
    (status = 200, description = "the flows", body = FlowList),
    (status = 401, description = "missing or unknown token", body = ErrorResponse),
    (status = 403, description = "token limited to some flows", body = ErrorResponse),
))]
pub(super) async fn list_flows(
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
pub(super) async fn get_flow(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<FlowView>> {
    authorize(&service, &headers, Some(&flow))?;
    let rt = service.flow(&flow)?;
    Ok(Json(view(&rt)))
}

#[derive(Deserialize)]
pub(super) struct DeadLetterQuery {
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
pub(super) async fn get_dead_letters(
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
pub(super) async fn put_flow(
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
    // A token with `namespaces` may only point flows at tables there.
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
    // A token limited to some flows may not join a target that a flow it
    // may not use writes (flows sharing a target write each other's rows).
    if let Some(t) = token
        && !t.flows.is_empty()
        && let Ok(target) = crate::core::flow::parse_table_ident(&cfg.name, &cfg.target)
        && let Some(other) = service
            .flows()
            .into_iter()
            .find(|rt| rt.flow.target == target && !t.flows.contains(&rt.flow.name))
    {
        return Err(ApiError::Forbidden(format!(
            "`{}` is the target of flow `{}`, which this token may not use; a token limited to flows {} may only share a target with those flows",
            cfg.target,
            other.flow.name,
            t.flows.join(", ")
        )));
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
pub(super) async fn delete_flow(
    State(service): State<Arc<Service>>,
    Path(flow): Path<String>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    authorize(&service, &headers, Some(&flow))?;
    service.delete_flow(&flow).await?;
    Ok(StatusCode::NO_CONTENT)
}
