//! Per-route request counts and durations for `/metrics`
//! (`autocdc_http_requests_total`, `autocdc_http_request_duration_seconds`):
//! a layer on the matched routes. Routes are the router's templates
//! (`/v1/flows/{flow}/changes`), never a request's own path, and methods
//! outside the standard set are one `OTHER`: the label sets stay bounded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use crate::service::Service;

/// The upper bounds (seconds) of the duration histogram's buckets.
pub const DURATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One route's durations: per bucket (the last is +Inf), the sum, the count.
#[derive(Debug, Clone, Default)]
pub struct Durations {
    pub buckets: [u64; DURATION_BUCKETS.len() + 1],
    pub sum_seconds: f64,
    pub count: u64,
}

/// What `/metrics` reports of the requests served so far.
#[derive(Default)]
pub struct RequestStats {
    /// (route, method, status) → requests.
    counts: Mutex<BTreeMap<(&'static str, &'static str, u16), u64>>,
    /// route → durations.
    durations: Mutex<BTreeMap<&'static str, Durations>>,
}

impl RequestStats {
    fn record(&self, route: &'static str, method: &'static str, status: u16, seconds: f64) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((route, method, status))
            .or_default() += 1;
        let mut d = self.durations.lock().unwrap_or_else(|e| e.into_inner());
        let d = d.entry(route).or_default();
        let bucket = DURATION_BUCKETS
            .iter()
            .position(|&ub| seconds <= ub)
            .unwrap_or(DURATION_BUCKETS.len());
        d.buckets[bucket] += 1;
        d.sum_seconds += seconds;
        d.count += 1;
    }

    /// The counts so far, ordered by route, method and status.
    pub fn counts(&self) -> Vec<((&'static str, &'static str, u16), u64)> {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// The durations so far, by route.
    pub fn durations(&self) -> Vec<(&'static str, Durations)> {
        let d = self.durations.lock().unwrap_or_else(|e| e.into_inner());
        d.iter().map(|(k, v)| (*k, v.clone())).collect()
    }
}

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

    #[test]
    fn durations_fall_in_their_buckets() {
        let s = RequestStats::default();
        s.record("/metrics", "GET", 200, 0.001);
        s.record("/metrics", "GET", 200, 0.3);
        s.record("/metrics", "GET", 500, 60.0);
        let d = &s.durations()[0].1;
        assert_eq!(d.count, 3);
        assert_eq!(d.buckets[0], 1);
        assert_eq!(d.buckets[6], 1); // 0.3 <= 0.5
        assert_eq!(d.buckets[DURATION_BUCKETS.len()], 1);
        assert_eq!(
            s.counts(),
            vec![(("/metrics", "GET", 200), 2), (("/metrics", "GET", 500), 1)]
        );
    }
}
