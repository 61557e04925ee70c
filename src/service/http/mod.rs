//! The HTTP API of `autocdc serve` (axum): decodes requests, checks tokens,
//! calls `service`, and turns `Error`s into `{"error": {...}}` responses with
//! a status and a stable code. No flow logic lives here, and no log: the
//! process that serves it is wired in `service::run`.
//!
//! This file holds the routes and the OpenAPI document; `errors`, `guards`,
//! `ingest`, `flows`, `debezium` the handlers and what they share;
//! `requests` the per-route counts; `listener` the accept loop.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::core::flow::FlowConfig;
use crate::service::Service;

mod debezium;
mod errors;
mod flows;
mod guards;
mod ingest;
pub(crate) mod listener;
mod requests;

pub use errors::{ApiError, ErrorBody, ErrorResponse};
pub use flows::{DeadLetterList, FlowList, FlowView};
pub use ingest::{ChangesResponse, CommitResponse, SnapshotResponse};

use flows::{delete_flow, get_dead_letters, get_flow, list_flows, post_maintain, put_flow};
use guards::{content_length_limit, request_timeout};
use ingest::{post_changes, post_commit, post_snapshots};

pub const NDJSON: &str = "application/x-ndjson";
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

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
        flows::get_dead_letters,
        ingest::post_changes,
        debezium::post_debezium,
        ingest::post_snapshots,
        ingest::post_commit,
        flows::list_flows,
        flows::get_flow,
        flows::put_flow,
        flows::delete_flow,
        healthz,
        readyz,
        flows::post_maintain,
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
