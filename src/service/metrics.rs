//! `/metrics` in the Prometheus text format, by its conventions: every
//! family has `# HELP` and `# TYPE`, durations are in seconds, counters end
//! in `_total`. Per-flow counters and gauges from each flow's status (read
//! once per flow), the tables' figures, the commit-duration histogram, the
//! Debezium events skipped, readiness, HTTP connections and requests per
//! route, and the process's `process_*` family.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::{COMMIT_BUCKETS, FlowRuntime, FlowStatus, Service};

pub fn render(service: &Service) -> String {
    let mut out = String::new();
    let flows = service.flows();
    let statuses: Vec<_> = flows
        .iter()
        .map(|rt| (rt.flow.name.clone(), rt.status()))
        .collect();
    flow_families(&mut out, &statuses);
    table_families(&mut out, &statuses);
    commit_histogram(&mut out, &flows, &statuses);
    service_families(&mut out, service);
    request_families(&mut out, service);
    process_families(&mut out);
    out
}

/// `# HELP` and `# TYPE` of one family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A family read from each flow's status: name, type, help, the reading.
type Metric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&FlowStatus) -> f64,
);

/// The families read from each flow's status, one sample per flow.
const FLOW_METRICS: [Metric; 45] = [
    (
        "autocdc_rows_in_total",
        "counter",
        "Changes read from the flow's committed batches.",
        |s| s.counters.rows_in as f64,
    ),
    (
        "autocdc_upserts_total",
        "counter",
        "Changes applied as upserts.",
        |s| s.counters.upserts as f64,
    ),
    (
        "autocdc_deletes_total",
        "counter",
        "Changes applied as deletes.",
        |s| s.counters.deletes as f64,
    ),
    (
        "autocdc_stale_total",
        "counter",
        "Changes older than the key's latest, not applied.",
        |s| s.counters.stale as f64,
    ),
    (
        "autocdc_duplicates_total",
        "counter",
        "Changes equal to one already applied at their sequence.",
        |s| s.counters.duplicates as f64,
    ),
    (
        "autocdc_ties_total",
        "counter",
        "Two different changes of one key met at one sequence.",
        |s| s.counters.ties as f64,
    ),
    (
        "autocdc_placeholders_unfilled_total",
        "counter",
        "Rows written with a Debezium placeholder that had no earlier value (written as null).",
        |s| s.counters.placeholders_unfilled as f64,
    ),
    (
        "autocdc_accepted_batches_total",
        "counter",
        "Pushed batches made durable and acknowledged.",
        |s| s.accepted_batches as f64,
    ),
    (
        "autocdc_rejected_batches_total",
        "counter",
        "Pushed batches refused (nothing of them applied).",
        |s| s.rejected_batches as f64,
    ),
    (
        "autocdc_commits_total",
        "counter",
        "Commits to the target that landed.",
        |s| s.commits as f64,
    ),
    (
        "autocdc_pending_rows",
        "gauge",
        "Acknowledged rows not committed yet.",
        |s| s.pending_rows as f64,
    ),
    (
        "autocdc_pending_bytes",
        "gauge",
        "Acknowledged bytes not committed yet.",
        |s| s.pending_bytes as f64,
    ),
    (
        "autocdc_wal_bytes",
        "gauge",
        "Bytes in the flow's local log.",
        |s| s.wal.bytes as f64,
    ),
    (
        "autocdc_wal_max_bytes",
        "gauge",
        "The local log's limit (max_log_bytes).",
        |s| s.wal.max_bytes as f64,
    ),
    (
        "autocdc_wal_segments",
        "gauge",
        "Segment files of the flow's local log.",
        |s| s.wal.segments as f64,
    ),
    (
        "autocdc_wal_oldest_record_age_seconds",
        "gauge",
        "Age of the oldest record the log retains.",
        |s| s.log_oldest_age_ms.unwrap_or(0) as f64 / 1e3,
    ),
    (
        "autocdc_wal_early_released_segments_total",
        "counter",
        "Log segments released early, their records committed.",
        |s| s.wal.early_released_segments as f64,
    ),
    (
        "autocdc_wal_write_failures_total",
        "counter",
        "Local log writes that failed.",
        |s| s.wal.write_failures as f64,
    ),
    (
        "autocdc_wal_failing",
        "gauge",
        "1 while the local log cannot be written.",
        |s| s.wal.failing as u8 as f64,
    ),
    (
        "autocdc_dead_letters",
        "gauge",
        "Acknowledged records that can never be applied.",
        |s| s.dead_letters as f64,
    ),
    (
        "autocdc_schema_id",
        "gauge",
        "The target's current schema id.",
        |s| s.schema_id as f64,
    ),
    (
        "autocdc_partition_spec_id",
        "gauge",
        "The target's current partition spec id.",
        |s| s.partition_spec_id as f64,
    ),
    (
        "autocdc_schema_evolutions_total",
        "counter",
        "Schema changes made to the target.",
        |s| s.schema_evolutions as f64,
    ),
    (
        "autocdc_idempotency_window_seconds",
        "gauge",
        "How long an Idempotency-Key is remembered.",
        |s| s.idempotency_window_ms as f64 / 1e3,
    ),
    (
        "autocdc_commit_duration_recent_p50_seconds",
        "gauge",
        "Median duration of the recent commits.",
        |s| s.recent_commit_ms_p50.unwrap_or(0.0) / 1e3,
    ),
    (
        "autocdc_log_append_duration_recent_p50_seconds",
        "gauge",
        "Median duration of the recent log appends.",
        |s| s.recent_append_ms_p50.unwrap_or(0.0) / 1e3,
    ),
    (
        "autocdc_log_append_duration_recent_p99_seconds",
        "gauge",
        "99th percentile duration of the recent log appends.",
        |s| s.recent_append_ms_p99.unwrap_or(0.0) / 1e3,
    ),
    (
        "autocdc_log_lag_batches",
        "gauge",
        "Batches in the shared log this instance has not read yet.",
        |s| s.log_lag_batches as f64,
    ),
    // On a shared log: 1 while this instance holds the flow's lease.
    (
        "autocdc_lease_held",
        "gauge",
        "On a shared log: 1 while this instance holds the flow's lease.",
        |s| s.lease.as_ref().is_some_and(|l| l.held_here) as u8 as f64,
    ),
    (
        "autocdc_lease_changes_total",
        "counter",
        "Times the flow's lease changed hands.",
        |s| s.lease.as_ref().map_or(0, |l| l.changes) as f64,
    ),
    (
        "autocdc_state_keys",
        "gauge",
        "Keys in the flow's sequence state (live and tombstones).",
        |s| s.state_keys as f64,
    ),
    (
        "autocdc_committed_offset",
        "gauge",
        "Offset of the log recorded in the target's latest snapshot.",
        |s| s.committed_offset as f64,
    ),
    (
        "autocdc_maintenance_runs_total",
        "counter",
        "Maintenance runs.",
        |s| s.maintenance.runs as f64,
    ),
    (
        "autocdc_maintenance_failures_total",
        "counter",
        "Maintenance runs that failed.",
        |s| s.maintenance.failures as f64,
    ),
    // 1 when the last run succeeded, 0 when it failed (or none ran yet).
    (
        "autocdc_maintenance_last_ok",
        "gauge",
        "1 when the last maintenance run succeeded, 0 when it failed or none ran.",
        |s| (s.maintenance.runs > 0 && s.maintenance.last_error.is_none()) as u8 as f64,
    ),
    (
        "autocdc_maintenance_last_run_timestamp_seconds",
        "gauge",
        "Unix time of the last maintenance run.",
        |s| s.maintenance.last_run_ms.unwrap_or(0) as f64 / 1e3,
    ),
    (
        "autocdc_maintenance_snapshots_expired_total",
        "counter",
        "Snapshots expired by maintenance.",
        |s| s.maintenance.snapshots_expired_total as f64,
    ),
    (
        "autocdc_maintenance_files_deleted_total",
        "counter",
        "Files deleted by maintenance.",
        |s| s.maintenance.files_deleted_total as f64,
    ),
    (
        "autocdc_maintenance_bytes_deleted_total",
        "counter",
        "Bytes of the files deleted by maintenance.",
        |s| s.maintenance.bytes_deleted_total as f64,
    ),
    (
        "autocdc_compactions_total",
        "counter",
        "Compaction runs that rewrote files.",
        |s| s.maintenance.compactions as f64,
    ),
    (
        "autocdc_compaction_files_rewritten_total",
        "counter",
        "Data files rewritten by compaction.",
        |s| s.maintenance.compaction_files_rewritten_total as f64,
    ),
    (
        "autocdc_compaction_bytes_read_total",
        "counter",
        "Bytes read by compaction.",
        |s| s.maintenance.compaction_bytes_read_total as f64,
    ),
    (
        "autocdc_compaction_bytes_written_total",
        "counter",
        "Bytes written by compaction.",
        |s| s.maintenance.compaction_bytes_written_total as f64,
    ),
    (
        "autocdc_compaction_rows_moved_total",
        "counter",
        "Rows rewritten by compaction.",
        |s| s.maintenance.compaction_rows_moved_total as f64,
    ),
    (
        "autocdc_compaction_seconds_total",
        "counter",
        "Time spent compacting.",
        |s| s.maintenance.compaction_seconds_total,
    ),
];

/// `FLOW_METRICS`, one sample per flow.
fn flow_families(out: &mut String, statuses: &[(String, FlowStatus)]) {
    for (name, kind, help, f) in FLOW_METRICS {
        family(out, name, kind, help);
        for (flow, s) in statuses {
            let _ = writeln!(out, "{name}{{flow=\"{flow}\"}} {}", f(s));
        }
    }
}

/// The target's and the state table's figures (refreshed between commits).
fn table_families(out: &mut String, statuses: &[(String, FlowStatus)]) {
    type TableMetric = (
        &'static str,
        &'static str,
        fn(&crate::table::maintain::TableStats) -> f64,
    );
    let tables: [TableMetric; 6] = [
        (
            "autocdc_table_snapshots",
            "Snapshots the table keeps.",
            |t| t.snapshots as f64,
        ),
        (
            "autocdc_table_manifests",
            "Manifests of the table's current snapshot.",
            |t| t.manifests as f64,
        ),
        (
            "autocdc_table_data_files",
            "Data files of the table's current snapshot.",
            |t| t.data_files as f64,
        ),
        (
            "autocdc_table_delete_files",
            "Delete files of the table's current snapshot.",
            |t| t.delete_files as f64,
        ),
        (
            "autocdc_table_metadata_bytes",
            "Bytes of the table's current metadata.json.",
            |t| t.metadata_bytes as f64,
        ),
        (
            "autocdc_table_bytes",
            "Bytes of the files the table's current snapshot reads.",
            |t| t.table_bytes as f64,
        ),
    ];
    for (name, help, f) in tables {
        family(out, name, "gauge", help);
        for (flow, s) in statuses {
            for (table, t) in [
                ("target", &s.maintenance.target),
                ("state", &s.maintenance.state),
            ] {
                let _ = writeln!(out, "{name}{{flow=\"{flow}\",table=\"{table}\"}} {}", f(t));
            }
        }
    }
}

/// One histogram's samples: `label` (`flow="x"`) on each, cumulative
/// bucket counts at the upper bounds `bounds` (seconds) then `+Inf` (the
/// last of `counts`), the sum of the observations in seconds.
fn histogram(out: &mut String, name: &str, label: &str, bounds: &[f64], counts: &[u64], sum: f64) {
    let mut cum = 0;
    for (ub, n) in bounds.iter().zip(counts) {
        cum += n;
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"{ub}\"}} {cum}");
    }
    cum += counts.get(bounds.len()).copied().unwrap_or(0);
    let _ = writeln!(
        out,
        "{name}_bucket{{{label},le=\"+Inf\"}} {cum}\n{name}_sum{{{label}}} {sum}\n{name}_count{{{label}}} {cum}"
    );
}

/// The histogram of commit durations, per flow.
fn commit_histogram(
    out: &mut String,
    flows: &[std::sync::Arc<FlowRuntime>],
    statuses: &[(String, FlowStatus)],
) {
    let name = "autocdc_commit_duration_seconds";
    family(out, name, "histogram", "Duration of the flow's commits.");
    let bounds: Vec<f64> = COMMIT_BUCKETS.iter().map(|ms| ms / 1e3).collect();
    for (rt, (flow, status)) in flows.iter().zip(statuses) {
        let h = *rt.commit_hist.lock().unwrap_or_else(|e| e.into_inner());
        let label = format!("flow=\"{flow}\"");
        histogram(out, name, &label, &bounds, &h, status.commit_ms_total / 1e3);
    }
}

/// The families of the service as a whole: Debezium events skipped,
/// readiness, connections.
fn service_families(out: &mut String, service: &Service) {
    let skipped = service
        .debezium_skipped
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    family(
        out,
        "autocdc_debezium_skipped_total",
        "counter",
        "Debezium events no flow took, by why.",
    );
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
    family(
        out,
        "autocdc_ready",
        "gauge",
        "1 once every flow is recovered.",
    );
    let _ = writeln!(out, "autocdc_ready {}", service.is_ready() as u8);
    let (open, threads) = crate::service::wal::writer_usage();
    family(
        out,
        "autocdc_log_open_segments",
        "gauge",
        "Segment files the local logs hold open (at most 256 plus one per writer thread, however many flows).",
    );
    let _ = writeln!(out, "autocdc_log_open_segments {open}");
    family(
        out,
        "autocdc_log_writer_threads",
        "gauge",
        "Threads writing the local logs, shared by every flow.",
    );
    let _ = writeln!(out, "autocdc_log_writer_threads {threads}");
    let c = &service.connections;
    family(
        out,
        "autocdc_http_connections",
        "gauge",
        "Open client connections.",
    );
    let _ = writeln!(
        out,
        "autocdc_http_connections {}",
        c.open.load(Ordering::Relaxed)
    );
    family(
        out,
        "autocdc_http_connections_refused_total",
        "counter",
        "Connections closed at once, over server.max_connections.",
    );
    let _ = writeln!(
        out,
        "autocdc_http_connections_refused_total {}",
        c.refused.load(Ordering::Relaxed)
    );
}

/// Requests per route (the router's templates), method and status, and
/// their durations per route.
fn request_families(out: &mut String, service: &Service) {
    use crate::service::traffic::DURATION_BUCKETS;
    family(
        out,
        "autocdc_http_requests_total",
        "counter",
        "Requests answered, by route, method and status.",
    );
    for ((route, method, status), n) in service.requests.counts() {
        let _ = writeln!(
            out,
            "autocdc_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {n}"
        );
    }
    let name = "autocdc_http_request_duration_seconds";
    family(
        out,
        name,
        "histogram",
        "Time to answer a request, by route.",
    );
    for (route, d) in service.requests.durations() {
        let label = format!("route=\"{route}\"");
        histogram(
            out,
            name,
            &label,
            &DURATION_BUCKETS,
            &d.buckets,
            d.sum_seconds,
        );
    }
}

/// Prometheus's standard `process_*` family (Linux; absent elsewhere).
fn process_families(out: &mut String) {
    let Some(p) = crate::service::process::of("self") else {
        return;
    };
    let mut one = |name: &str, kind: &str, help: &str, v: f64| {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    };
    one(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        p.cpu_seconds,
    );
    one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        p.resident_bytes as f64,
    );
    one(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        p.virtual_bytes as f64,
    );
    one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        p.start_time_seconds,
    );
    one(
        "process_threads",
        "gauge",
        "Number of OS threads in the process.",
        p.threads as f64,
    );
    if let Some(n) = p.open_fds {
        one(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            n as f64,
        );
    }
    if let Some(n) = p.max_fds {
        one(
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            n as f64,
        );
    }
}
