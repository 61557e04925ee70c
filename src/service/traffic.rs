//! What `/metrics` reports of the HTTP traffic: client connections open
//! and refused, and per route the requests answered and their durations.
//! The HTTP layer records; the metrics page reads. (A leaf of the service,
//! so neither the service's state nor the metrics page imports HTTP.)

use std::collections::BTreeMap;
use std::sync::Mutex;

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
    pub(crate) fn record(
        &self,
        route: &'static str,
        method: &'static str,
        status: u16,
        seconds: f64,
    ) {
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

/// Open and refused client connections, for `/metrics`.
#[derive(Default)]
pub struct Connections {
    pub open: std::sync::atomic::AtomicUsize,
    pub refused: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

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
