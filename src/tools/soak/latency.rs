//! Commit latency per soak window, from the service's own histogram
//! (`autocdc_commit_duration_seconds`): the counts at a window's end minus
//! those at its start, summed over flows, and a quantile of that difference
//! read the way Prometheus' `histogram_quantile` reads it. This is what a
//! dashboard shows for the window: every commit in it counts once, unlike a
//! peak of the flows' recent percentiles (the last 256 commits, of which one
//! or two carry a compaction).

use std::collections::BTreeMap;

/// The histogram's family.
const FAMILY: &str = "autocdc_commit_duration_seconds_bucket";

/// Cumulative counts by upper bound (seconds, `+Inf` last), summed over
/// every flow's series.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Buckets(Vec<(f64, f64)>);

impl Buckets {
    /// The commit histogram of a `/metrics` text; empty when it has none.
    pub(super) fn parse(metrics: &str) -> Buckets {
        let mut by_bound: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix(FAMILY) else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once(' ') else {
                continue;
            };
            let Some(le) = labels
                .split(',')
                .find_map(|l| l.trim_matches(['{', '}']).strip_prefix("le=\""))
                .map(|l| l.trim_end_matches('"'))
            else {
                continue;
            };
            let bound = match le {
                "+Inf" => f64::INFINITY,
                b => match b.parse::<f64>() {
                    Ok(b) => b,
                    Err(_) => continue,
                },
            };
            let Ok(n) = value.trim().parse::<f64>() else {
                continue;
            };
            // Bounds are positive, so their bits sort as they do.
            by_bound.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += n;
        }
        Buckets(by_bound.into_values().collect())
    }

    /// The commits between `before` and this (both cumulative).
    pub(super) fn since(&self, before: &Buckets) -> Buckets {
        Buckets(
            self.0
                .iter()
                .map(|&(b, n)| {
                    let was = before.0.iter().find(|(o, _)| *o == b).map_or(0.0, |o| o.1);
                    (b, (n - was).max(0.0))
                })
                .collect(),
        )
    }

    /// Commits counted.
    pub(super) fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |b| b.1)
    }

    /// The `q` quantile in milliseconds, interpolated linearly within its
    /// bucket (from 0 for the first); one in the `+Inf` bucket is the
    /// largest finite bound. NaN when nothing was counted.
    pub(super) fn quantile_ms(&self, q: f64) -> f64 {
        let total = self.count();
        if total <= 0.0 {
            return f64::NAN;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(bound, n) in &self.0 {
            if n >= rank {
                if bound.is_infinite() {
                    return lower.0 * 1e3;
                }
                let within = if n > lower.1 {
                    (rank - lower.1) / (n - lower.1)
                } else {
                    0.0
                };
                return (lower.0 + (bound - lower.0) * within) * 1e3;
            }
            lower = (bound, n);
        }
        lower.0 * 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::Buckets;

    fn text(flow: &str, counts: &[(&str, u64)]) -> String {
        counts
            .iter()
            .map(|(le, n)| {
                format!(
                    "autocdc_commit_duration_seconds_bucket{{flow=\"{flow}\",le=\"{le}\"}} {n}\n"
                )
            })
            .collect()
    }

    #[test]
    fn a_window_reads_its_own_commits_summed_over_flows() {
        let start = format!(
            "# HELP autocdc_commit_duration_seconds Duration of the flow's commits.\n{}{}autocdc_commit_duration_seconds_sum{{flow=\"a\"}} 9\nautocdc_commit_duration_seconds_count{{flow=\"a\"}} 100\n",
            text(
                "a",
                &[("0.01", 0), ("0.025", 100), ("0.05", 100), ("+Inf", 100)]
            ),
            text("b", &[("0.01", 0), ("0.025", 0), ("0.05", 0), ("+Inf", 0)]),
        );
        let end = format!(
            "{}{}",
            text(
                "a",
                &[("0.01", 0), ("0.025", 100), ("0.05", 150), ("+Inf", 150)]
            ),
            text(
                "b",
                &[("0.01", 0), ("0.025", 0), ("0.05", 50), ("+Inf", 50)]
            ),
        );
        let (a, b) = (Buckets::parse(&start), Buckets::parse(&end));
        assert_eq!(a.count(), 100.0);
        let w = b.since(&a);
        // The window's 100 commits all took 25-50 ms: the 100 before it do
        // not count.
        assert_eq!(w.count(), 100.0);
        assert!(
            (w.quantile_ms(0.5) - 37.5).abs() < 1e-9,
            "{}",
            w.quantile_ms(0.5)
        );
        assert!((w.quantile_ms(0.99) - 49.75).abs() < 1e-9);
        // The whole run's median is in the 10-25 ms bucket's top.
        assert!((b.quantile_ms(0.5) - 25.0).abs() < 1e-9);
    }

    #[test]
    fn quantiles_at_the_edges() {
        let h = Buckets::parse(&text("a", &[("0.01", 10), ("0.1", 10), ("+Inf", 20)]));
        // Half the commits in the first bucket: from 0 to 10 ms.
        assert!((h.quantile_ms(0.25) - 5.0).abs() < 1e-9);
        // Above the last finite bound: that bound, as Prometheus answers.
        assert_eq!(h.quantile_ms(0.99), 100.0);
        assert!(Buckets::default().quantile_ms(0.5).is_nan());
        assert!(Buckets::parse("autocdc_other_bucket{le=\"1\"} 5\n").count() == 0.0);
    }
}
