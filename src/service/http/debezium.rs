//! `POST /v1/debezium`: Debezium change events of any table, routed to the
//! flows whose `source_table` each event's table is (Debezium Server's HTTP
//! sink sends every table to one URL). Decoding is `service::debezium`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::{ApiError, ApiResult, ChangesResponse, ErrorResponse, authorize, decode_body};
use crate::error::Error;
use crate::service::Service;
use crate::service::input;

/// What `POST /v1/debezium` did with a body.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DebeziumResponse {
    /// Per flow that took events of the body: as `changes` answers.
    pub flows: std::collections::BTreeMap<String, ChangesResponse>,
    /// What no flow took, by kind.
    pub skipped: crate::service::debezium::Skipped,
}

/// Push Debezium change events of any table (Debezium Server's HTTP sink
/// pointed here): each event goes to the flows whose `source_table` is its
/// table. Every flow's events are read and checked before any is logged.
#[utoipa::path(
    post,
    path = "/v1/debezium",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "a retry with the same key is applied once (`webhook-id` is taken when this is absent)"),
    ),
    request_body(description = "one event, a JSON array of events, or NDJSON; each wrapped ({schema, payload}) or bare", content(
        (Object = "application/json"),
        ("application/x-ndjson"),
    )),
    responses(
        (status = 202, description = "durable in each flow's log", body = DebeziumResponse),
        (status = 400, description = "a malformed event or a value that does not fit its column (event index and field given); nothing applied", body = ErrorResponse),
        (status = 422, description = "a delete without its key columns (REPLICA IDENTITY NOTHING)", body = ErrorResponse),
        (status = 413, description = "body over server.max_body_bytes"),
        (status = 429, description = "a flow is over max_uncommitted_bytes or max_log_bytes; see Retry-After", body = ErrorResponse),
        (status = 401, description = "missing or unknown token", body = ErrorResponse), (status = 403, description = "token not allowed on a flow the events go to", body = ErrorResponse), (status = 503, description = "recovering or stopping", body = ErrorResponse)
    )
)]
pub(super) async fn post_debezium(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    use crate::service::debezium;
    let json = matches!(
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        Some(t) if t.trim_start().to_ascii_lowercase().starts_with("application/json")
    );
    let format = if json {
        input::BodyFormat::JsonArray
    } else {
        input::BodyFormat::Ndjson
    };
    let limits = service.config.limits();
    let b = body.clone();
    let routed = tokio::task::spawn_blocking(move || {
        let elements = debezium::elements("(debezium)", format, &b, limits)?;
        let (changes, skipped) = debezium::parse("(debezium)", &elements)?;
        let tables: Vec<(String, Vec<crate::core::debezium::Op>)> = debezium::by_table(&changes)
            .into_iter()
            .map(|(t, cs)| (t.to_string(), cs.iter().map(|c| c.op).collect()))
            .collect();
        Ok::<_, Error>((tables, skipped))
    })
    .await
    .map_err(|e| ApiError::from(Error::Unavailable(e.to_string())))??;
    let (tables, mut skipped) = routed;
    let mut takers = Vec::new();
    for (table, ops) in &tables {
        let flows: Vec<_> = service
            .flows()
            .into_iter()
            .filter(|rt| {
                rt.flow.debezium
                    && rt
                        .flow
                        .config
                        .source_table
                        .as_deref()
                        .is_some_and(|t| t.eq_ignore_ascii_case(table))
            })
            .collect();
        if flows.is_empty() {
            skipped.other_tables += ops.len() as u64;
        }
        for rt in flows {
            if rt.flow.truncates.is_none() {
                skipped.truncates += ops
                    .iter()
                    .filter(|&&o| o == crate::core::debezium::Op::Truncate)
                    .count() as u64;
            }
            if !takers
                .iter()
                .any(|t: &Arc<crate::service::FlowRuntime>| t.flow.name == rt.flow.name)
            {
                takers.push(rt);
            }
        }
    }
    if takers.is_empty() {
        authorize(&service, &headers, None).or_else(|e| {
            if matches!(e, ApiError::Forbidden(_)) {
                Ok(None)
            } else {
                Err(e)
            }
        })?;
    }
    // Every flow's rows are read and checked before any is logged.
    let mut decoded = Vec::with_capacity(takers.len());
    for rt in takers {
        authorize(&service, &headers, Some(&rt.flow.name))?;
        let (rt, batch, key) = decode_body(&service, rt, &headers, body.clone()).await?;
        if let Err(e) = crate::core::resolve::validate(&rt.flow, &batch) {
            rt.count_rejected();
            return Err(e.into());
        }
        decoded.push((rt, batch, key));
    }
    let mut flows = std::collections::BTreeMap::new();
    for (rt, batch, key) in decoded {
        if batch.num_rows() == 0 {
            continue;
        }
        let a = service.ingest(&rt, batch, key).await?;
        flows.insert(rt.flow.name.clone(), ChangesResponse::from(&a));
    }
    service
        .debezium_skipped
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .add(&skipped);
    Ok((
        StatusCode::ACCEPTED,
        Json(DebeziumResponse { flows, skipped }),
    )
        .into_response())
}
