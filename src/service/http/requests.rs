//! Per-route request counts and durations for `/metrics`
//! (`autocdc_http_requests_total`, `autocdc_http_request_duration_seconds`):
//! a layer on the matched routes. Routes are the router's templates
//! (`/v1/flows/{flow}/changes`), never a request's own path, and methods
//! outside the standard set are one `OTHER`: the label sets stay bounded.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use crate::service::Service;

/// The router's route templates, interned once: a label is a `&'static str`
/// from this fixed set.
const ROUTES: &[&str] = &[
    "/healthz",
    "/openapi.json",
    "/readyz",
    "/metrics",
    "/v1/flows",
    "/v1/flows/{flow}",
    "/v1/flows/{flow}/changes",
    "/v1/debezium",
    "/v1/flows/{flow}/snapshots",
    "/v1/flows/{flow}/commit",
    "/v1/flows/{flow}/dead-letters",
    "/v1/flows/{flow}/maintain",
];

fn route_label(matched: Option<&MatchedPath>) -> &'static str {
    matched
        .and_then(|m| ROUTES.iter().find(|r| **r == m.as_str()))
        .copied()
        .unwrap_or("other")
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "OTHER",
    }
}

/// The layer: times the request through its handler and counts it.
pub(super) async fn track(
    State(service): State<Arc<Service>>,
    req: Request,
    next: Next,
) -> Response {
    let route = route_label(req.extensions().get::<MatchedPath>());
    let method = method_label(req.method());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    service.requests.record(
        route,
        method,
        resp.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_router_has_its_label() {
        // The router's routes, as `router` declares them.
        let src = include_str!("mod.rs");
        let declared: Vec<&str> = src
            .split(".route(")
            .skip(1)
            .filter_map(|s| s.trim_start().strip_prefix('"')?.split('"').next())
            .collect();
        assert!(declared.len() >= 10, "{declared:?}");
        for r in &declared {
            assert!(ROUTES.contains(r), "route {r} has no label in ROUTES");
        }
    }
}
