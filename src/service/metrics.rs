//! `/metrics` in the Prometheus text format: per-flow counters and gauges
//! from each flow's status (read once per flow), the commit-latency
//! histogram, readiness and the HTTP connection counts.

use std::sync::atomic::Ordering;

use super::{COMMIT_BUCKETS, FlowStatus, Service};

pub fn render(service: &Service) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    type Metric = (&'static str, &'static str, fn(&FlowStatus) -> f64);
    let counters: [Metric; 44] = [
        ("autocdc_rows_in_total", "counter", |s| {
            s.counters.rows_in as f64
        }),
        ("autocdc_upserts_total", "counter", |s| {
            s.counters.upserts as f64
        }),
        ("autocdc_deletes_total", "counter", |s| {
            s.counters.deletes as f64
        }),
        ("autocdc_stale_total", "counter", |s| {
            s.counters.stale as f64
        }),
        ("autocdc_duplicates_total", "counter", |s| {
            s.counters.duplicates as f64
        }),
        ("autocdc_ties_total", "counter", |s| s.counters.ties as f64),
        ("autocdc_accepted_batches_total", "counter", |s| {
            s.accepted_batches as f64
        }),
        ("autocdc_rejected_batches_total", "counter", |s| {
            s.rejected_batches as f64
        }),
        ("autocdc_commits_total", "counter", |s| s.commits as f64),
        ("autocdc_pending_rows", "gauge", |s| s.pending_rows as f64),
        ("autocdc_pending_bytes", "gauge", |s| s.pending_bytes as f64),
        ("autocdc_wal_bytes", "gauge", |s| s.wal.bytes as f64),
        ("autocdc_wal_max_bytes", "gauge", |s| s.wal.max_bytes as f64),
        ("autocdc_wal_segments", "gauge", |s| s.wal.segments as f64),
        ("autocdc_wal_oldest_record_age_seconds", "gauge", |s| {
            s.log_oldest_age_ms.unwrap_or(0) as f64 / 1e3
        }),
        (
            "autocdc_wal_early_released_segments_total",
            "counter",
            |s| s.wal.early_released_segments as f64,
        ),
        ("autocdc_wal_write_failures_total", "counter", |s| {
            s.wal.write_failures as f64
        }),
        ("autocdc_wal_failing", "gauge", |s| {
            s.wal.failing as u8 as f64
        }),
        ("autocdc_dead_letters", "gauge", |s| s.dead_letters as f64),
        ("autocdc_schema_id", "gauge", |s| s.schema_id as f64),
        ("autocdc_partition_spec_id", "gauge", |s| {
            s.partition_spec_id as f64
        }),
        ("autocdc_schema_evolutions_total", "counter", |s| {
            s.schema_evolutions as f64
        }),
        ("autocdc_idempotency_window_seconds", "gauge", |s| {
            s.idempotency_window_ms as f64 / 1e3
        }),
        ("autocdc_commit_latency_recent_p50_ms", "gauge", |s| {
            s.recent_commit_ms_p50.unwrap_or(0.0)
        }),
        ("autocdc_log_append_latency_recent_p50_ms", "gauge", |s| {
            s.recent_append_ms_p50.unwrap_or(0.0)
        }),
        ("autocdc_log_append_latency_recent_p99_ms", "gauge", |s| {
            s.recent_append_ms_p99.unwrap_or(0.0)
        }),
        ("autocdc_log_lag_batches", "gauge", |s| {
            s.log_lag_batches as f64
        }),
        // On a shared log: 1 while this instance holds the flow's lease.
        ("autocdc_lease_held", "gauge", |s| {
            s.lease.as_ref().is_some_and(|l| l.held_here) as u8 as f64
        }),
        ("autocdc_lease_changes_total", "counter", |s| {
            s.lease.as_ref().map_or(0, |l| l.changes) as f64
        }),
        ("autocdc_state_keys", "gauge", |s| s.state_keys as f64),
        ("autocdc_committed_offset", "gauge", |s| {
            s.committed_offset as f64
        }),
        ("autocdc_maintenance_runs_total", "counter", |s| {
            s.maintenance.runs as f64
        }),
        ("autocdc_maintenance_failures_total", "counter", |s| {
            s.maintenance.failures as f64
        }),
        // 1 when the last run succeeded, 0 when it failed (or none ran yet).
        ("autocdc_maintenance_last_ok", "gauge", |s| {
            (s.maintenance.runs > 0 && s.maintenance.last_error.is_none()) as u8 as f64
        }),
        (
            "autocdc_maintenance_last_run_timestamp_seconds",
            "gauge",
            |s| s.maintenance.last_run_ms.unwrap_or(0) as f64 / 1e3,
        ),
        (
            "autocdc_maintenance_snapshots_expired_total",
            "counter",
            |s| s.maintenance.snapshots_expired_total as f64,
        ),
        ("autocdc_maintenance_files_deleted_total", "counter", |s| {
            s.maintenance.files_deleted_total as f64
        }),
        ("autocdc_maintenance_bytes_deleted_total", "counter", |s| {
            s.maintenance.bytes_deleted_total as f64
        }),
        ("autocdc_compactions_total", "counter", |s| {
            s.maintenance.compactions as f64
        }),
        ("autocdc_compaction_files_rewritten_total", "counter", |s| {
            s.maintenance.compaction_files_rewritten_total as f64
        }),
        ("autocdc_compaction_bytes_read_total", "counter", |s| {
            s.maintenance.compaction_bytes_read_total as f64
        }),
        ("autocdc_compaction_bytes_written_total", "counter", |s| {
            s.maintenance.compaction_bytes_written_total as f64
        }),
        ("autocdc_compaction_rows_moved_total", "counter", |s| {
            s.maintenance.compaction_rows_moved_total as f64
        }),
        ("autocdc_compaction_seconds_total", "counter", |s| {
            s.maintenance.compaction_seconds_total
        }),
    ];
    let flows = service.flows();
    let statuses: Vec<_> = flows
        .iter()
        .map(|rt| (rt.flow.name.clone(), rt.status()))
        .collect();
    for (name, kind, f) in counters {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (flow, s) in &statuses {
            let _ = writeln!(out, "{name}{{flow=\"{flow}\"}} {}", f(s));
        }
    }
    // The target's and the state table's figures (refreshed between commits).
    type TableMetric = (&'static str, fn(&crate::table::maintain::TableStats) -> f64);
    let tables: [TableMetric; 6] = [
        ("autocdc_table_snapshots", |t| t.snapshots as f64),
        ("autocdc_table_manifests", |t| t.manifests as f64),
        ("autocdc_table_data_files", |t| t.data_files as f64),
        ("autocdc_table_delete_files", |t| t.delete_files as f64),
        ("autocdc_table_metadata_bytes", |t| t.metadata_bytes as f64),
        ("autocdc_table_bytes", |t| t.table_bytes as f64),
    ];
    for (name, f) in tables {
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (flow, s) in &statuses {
            for (table, t) in [
                ("target", &s.maintenance.target),
                ("state", &s.maintenance.state),
            ] {
                let _ = writeln!(out, "{name}{{flow=\"{flow}\",table=\"{table}\"}} {}", f(t));
            }
        }
    }
    let _ = writeln!(out, "# TYPE autocdc_commit_latency_ms histogram");
    for (rt, (_, status)) in flows.iter().zip(&statuses) {
        let h = *rt.commit_hist.lock().unwrap_or_else(|e| e.into_inner());
        let mut cum = 0;
        for (i, ub) in COMMIT_BUCKETS.iter().enumerate() {
            cum += h[i];
            let _ = writeln!(
                out,
                "autocdc_commit_latency_ms_bucket{{flow=\"{}\",le=\"{ub}\"}} {cum}",
                rt.flow.name
            );
        }
        cum += h[COMMIT_BUCKETS.len()];
        let _ = writeln!(
            out,
            "autocdc_commit_latency_ms_bucket{{flow=\"{0}\",le=\"+Inf\"}} {cum}\nautocdc_commit_latency_ms_sum{{flow=\"{0}\"}} {1}\nautocdc_commit_latency_ms_count{{flow=\"{0}\"}} {cum}",
            rt.flow.name, status.commit_ms_total
        );
    }
    let skipped = service
        .debezium_skipped
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let _ = writeln!(out, "# TYPE autocdc_debezium_skipped_total counter");
    for (reason, n) in [
        ("tombstone", skipped.tombstones),
        ("not_a_change", skipped.not_changes),
        ("message", skipped.messages),
        ("other_table", skipped.other_tables),
        ("truncate", skipped.truncates),
    ] {
        let _ = writeln!(
            out,
            "autocdc_debezium_skipped_total{{reason=\"{reason}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# TYPE autocdc_ready gauge\nautocdc_ready {}",
        service.is_ready() as u8
    );
    let c = &service.connections;
    let _ = writeln!(
        out,
        "# TYPE autocdc_http_connections gauge\nautocdc_http_connections {}\n# TYPE autocdc_http_connections_refused_total counter\nautocdc_http_connections_refused_total {}",
        c.open.load(Ordering::Relaxed),
        c.refused.load(Ordering::Relaxed)
    );
    out
}
