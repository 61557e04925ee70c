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

use super::errors::{ApiError, ApiResult, ErrorResponse};
use super::guards::authorize;
use super::ingest::{ChangesResponse, decode_body, idempotency_key};
use crate::core::flow::SchemaEvolution;
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
    body: axum::body::Body,
) -> ApiResult<Response> {
    use crate::service::debezium;
    let chunks = read_chunks(&service, body).await?;
    // Events are routed by the flows that exist: while they recover, an
    // event of a table whose flow is not back yet would look like one no
    // flow takes, and be acknowledged and skipped. Refuse (the sink
    // retries) until every flow is back.
    if !service.is_ready() {
        return Err(Error::Unavailable(
            "the service is recovering its flows; retry shortly".into(),
        )
        .into());
    }
    let json = matches!(
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        Some(t) if t.trim_start().to_ascii_lowercase().starts_with("application/json")
    );
    let format = if json {
        input::BodyFormat::JsonArray
    } else {
        input::BodyFormat::Ndjson
    };
    let limits = service.limits();
    // The body is read once, for every flow that takes some of its events.
    let candidates: Vec<Arc<crate::service::FlowRuntime>> = service
        .flows()
        .into_iter()
        .filter(|rt| rt.flow.debezium && rt.flow.config.source_table.is_some())
        .collect();
    let flows: Vec<crate::core::flow::Flow> = candidates.iter().map(|rt| rt.flow.clone()).collect();
    let c = chunks.clone();
    let (routed, skipped) = tokio::task::spawn_blocking(move || {
        let arena = bumpalo::Bump::new();
        let body = debezium::Body::Chunks(&c, &arena);
        input::catch_quietly(|| debezium::route(&flows, format, body, limits)).unwrap_or_else(
            |_| {
                Err(Error::Input {
                    code: crate::error::codes::MALFORMED_BODY,
                    flow: "(debezium)".into(),
                    message: "the body could not be decoded".into(),
                })
            },
        )
    })
    .await
    .map_err(|e| ApiError::from(Error::Unavailable(e.to_string())))??;
    if routed.is_empty() {
        authorize(&service, &headers, None).or_else(|e| {
            if matches!(e, ApiError::Forbidden(_)) {
                Ok(None)
            } else {
                Err(e)
            }
        })?;
    }
    let key = idempotency_key(&headers)?;
    // Every flow's rows are read and checked before any is logged.
    let mut decoded = Vec::with_capacity(routed.len());
    for (i, batch) in routed {
        let rt = candidates[i].clone();
        authorize(&service, &headers, Some(&rt.flow.name))?;
        let (rt, batch, key) = match batch {
            Ok(b) => (rt, b, key.clone()),
            // An `add_columns` flow whose events have new fields: the
            // push path adds them (one definition change) and reads again.
            Err(_) if rt.flow.config.schema_evolution == SchemaEvolution::AddColumns => {
                decode_body(&service, rt, &headers, Bytes::from(chunks.concat())).await?
            }
            Err(e) => {
                rt.count_rejected();
                return Err(e.into());
            }
        };
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

/// Below this a chunk is copied onto the one before it: a body trickled a
/// byte per packet is a few buffers, not millions.
const SMALL_CHUNK: usize = 16 * 1024;

/// The body as hyper received it, in its chunks (a Debezium event is ~2 KiB
/// with its schema, 20x its flat row: copying a body into one buffer was
/// ~7% of a push), bounded by `server.max_body_bytes` as it arrives.
async fn read_chunks(service: &Service, body: axum::body::Body) -> ApiResult<Vec<Bytes>> {
    use futures::StreamExt;
    let limit = service.config.max_body_bytes;
    let mut stream = body.into_data_stream();
    let (mut chunks, mut small, mut len) = (Vec::new(), Vec::new(), 0usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::from(Error::Input {
                code: crate::error::codes::MALFORMED_BODY,
                flow: "(debezium)".into(),
                message: format!("the body could not be read: {e}"),
            })
        })?;
        len += chunk.len();
        if len > limit {
            return Err(ApiError::BodyTooLarge(format!(
                "the body is over server.max_body_bytes = {limit} bytes; send smaller requests"
            )));
        }
        if chunk.len() >= SMALL_CHUNK {
            // Parts stay few: each small run ends at 16 KiB or at a big chunk.
            if !small.is_empty() {
                chunks.push(Bytes::from(std::mem::take(&mut small)));
            }
            chunks.push(chunk);
        } else {
            small.extend_from_slice(&chunk);
            if small.len() >= SMALL_CHUNK {
                chunks.push(Bytes::from(std::mem::take(&mut small)));
            }
        }
    }
    if !small.is_empty() {
        chunks.push(Bytes::from(small));
    }
    Ok(chunks)
}
