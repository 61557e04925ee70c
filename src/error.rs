//! The one error type of the library. Every variant carries a stable code
//! (`Error::code`), says what was wrong and, where there is one, the fix.
//! Only `main` (and later the HTTP layer) turns these into exit codes or responses.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flow definition that cannot be used as written.
    #[error("[{code}] flow `{flow}`: {message}")]
    Definition {
        code: &'static str,
        flow: String,
        message: String,
    },

    /// A micro-batch that is rejected whole; nothing of it is applied.
    #[error(
        "[{code}] flow `{flow}`: row {row}{}: {message}; nothing of this batch was applied",
        column_part(.column)
    )]
    Batch {
        code: &'static str,
        flow: String,
        row: usize,
        column: String,
        message: String,
    },

    /// A batch whose columns cannot be read as the flow's declared schema.
    #[error("[{code}] flow `{flow}`: {message}")]
    Input {
        code: &'static str,
        flow: String,
        message: String,
    },

    /// The stored tables disagree with what this flow expects.
    #[error("[{code}] {message}")]
    State { code: &'static str, message: String },

    /// Another writer committed first and our retries ran out.
    #[error("[AUTOCDC_COMMIT_CONFLICT] {0}")]
    CommitConflict(String),

    /// A simulated crash from a fault-injection point (tests only).
    #[error("[AUTOCDC_INJECTED_FAULT] injected fault at {0:?}")]
    InjectedFault(crate::fault::FaultPoint),

    #[error("[AUTOCDC_CONFIG] {0}")]
    Config(String),

    /// The flow named does not exist.
    #[error("[AUTOCDC_FLOW_NOT_FOUND] {0}")]
    FlowNotFound(String),

    /// Too much is pending; retry after the given seconds.
    #[error("[AUTOCDC_OVERLOADED] {message}")]
    Overloaded {
        message: String,
        retry_after_secs: u64,
    },

    /// The service cannot take this now (shutting down, log failed).
    #[error("[AUTOCDC_UNAVAILABLE] {0}")]
    Unavailable(String),

    #[error("[AUTOCDC_ICEBERG] {0}")]
    Iceberg(#[from] iceberg::Error),

    #[error("[AUTOCDC_STORAGE] {0}")]
    Storage(#[from] object_store::Error),

    #[error("[AUTOCDC_ARROW] {0}")]
    Arrow(#[from] arrow_schema::ArrowError),

    #[error("[AUTOCDC_PARQUET] {0}")]
    Parquet(#[from] parquet::errors::ParquetError),

    /// The process ran out of open files or memory (`From<io::Error>`
    /// tells them from other I/O errors): the message names the limit.
    #[error("[AUTOCDC_RESOURCE_EXHAUSTED] {0}")]
    Exhausted(String),

    #[error("[AUTOCDC_IO] {0}")]
    Io(std::io::Error),

    #[error("[AUTOCDC_JSON] {0}")]
    Json(#[from] serde_json::Error),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        match exhausted(&e) {
            Some(message) => Error::Exhausted(message),
            None => Error::Io(e),
        }
    }
}

/// What the process ran out of, with the limit and the fix, when `e` says
/// it ran out of open files or memory.
fn exhausted(e: &std::io::Error) -> Option<String> {
    let (what, fix) = match e.raw_os_error()? {
        libc::EMFILE => {
            // The soft limit as the kernel states it (no unsafe getrlimit).
            let soft = std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|l| {
                    let line = l.lines().find(|l| l.starts_with("Max open files"))?;
                    Some(line.split_whitespace().nth(3)?.to_string())
                })
                .unwrap_or_else(|| "unknown".into());
            (
                "open files".to_string(),
                format!("its limit (`ulimit -n`) is {soft}: raise it, or run fewer flows"),
            )
        }
        libc::ENFILE => (
            "open files of the whole system".to_string(),
            "raise fs.file-max, or run fewer processes".to_string(),
        ),
        libc::ENOMEM => (
            "memory".to_string(),
            "give it more memory, or run fewer flows".to_string(),
        ),
        _ => return None,
    };
    Some(format!(
        "the process ran out of {what} ({e}); {fix}; the other flows go on"
    ))
}

fn column_part(column: &str) -> String {
    if column.is_empty() {
        String::new()
    } else {
        format!(", column `{column}`")
    }
}

impl Error {
    /// The stable, documented code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Definition { code, .. }
            | Error::Batch { code, .. }
            | Error::Input { code, .. }
            | Error::State { code, .. } => code,
            Error::FlowNotFound(_) => codes::FLOW_NOT_FOUND,
            Error::Overloaded { .. } => codes::OVERLOADED,
            Error::Unavailable(_) => codes::UNAVAILABLE,
            Error::CommitConflict(_) => codes::COMMIT_CONFLICT,
            Error::InjectedFault(_) => codes::INJECTED_FAULT,
            Error::Config(_) => codes::CONFIG,
            Error::Iceberg(_) => codes::ICEBERG,
            Error::Storage(_) => codes::STORAGE,
            Error::Arrow(_) => codes::ARROW_LIBRARY,
            Error::Parquet(_) => codes::PARQUET,
            Error::Exhausted(_) => codes::RESOURCE_EXHAUSTED,
            Error::Io(_) => codes::IO,
            Error::Json(_) => codes::JSON,
        }
    }

    /// The HTTP status this error is answered with (from `REGISTRY`).
    pub fn status(&self) -> u16 {
        status_of(self.code())
    }

    pub(crate) fn definition(flow: &str, code: &'static str, message: impl Into<String>) -> Self {
        Error::Definition {
            code,
            flow: flow.to_string(),
            message: message.into(),
        }
    }

    /// A definition error from an error that carries its own stable code
    /// (a sequence or predicate expression's).
    pub(crate) fn from_predicate(flow: &str, e: impl Coded) -> Self {
        Error::Definition {
            code: e.code(),
            flow: flow.to_string(),
            message: e.to_string(),
        }
    }
}

/// An error of a lower part that carries its stable code (one of `codes`).
pub trait Coded: std::fmt::Display {
    fn code(&self) -> &'static str;
}

impl From<crate::fault::FaultPoint> for Error {
    fn from(point: crate::fault::FaultPoint) -> Self {
        Error::InjectedFault(point)
    }
}

/// Stable codes, each once. `REGISTRY` gives each its HTTP status and
/// meaning; the error table of docs/errors.md is checked against it.
pub mod codes {
    // A flow definition that cannot be used (400).
    pub const EMPTY_KEYS: &str = "AUTOCDC_EMPTY_KEYS";
    pub const COLUMNS_NOT_FOUND: &str = "AUTOCDC_COLUMNS_NOT_FOUND_IN_SCHEMA";
    pub const MULTIPART_IDENTIFIER: &str = "AUTOCDC_MULTIPART_COLUMN_IDENTIFIER";
    pub const RESERVED_COLUMN: &str = "AUTOCDC_RESERVED_COLUMN_NAME_CONFLICT";
    pub const INVALID_SELECTION: &str = "AUTOCDC_INVALID_COLUMN_SELECTION";
    pub const NON_ORDERABLE_SEQUENCE: &str = "AUTOCDC_NON_ORDERABLE_SEQUENCE";
    pub const INVALID_DEFINITION: &str = "AUTOCDC_INVALID_DEFINITION";
    pub const UNSUPPORTED: &str = "AUTOCDC_UNSUPPORTED";
    pub const TRUNCATE_SCD2: &str = "AUTOCDC_TRUNCATE_SCD2_NOT_SUPPORTED";
    pub const NOT_A_SNAPSHOT_FLOW: &str = "AUTOCDC_SNAPSHOT_FLOW_MISMATCH";
    pub const TARGET_IN_USE: &str = "AUTOCDC_TARGET_IN_USE";
    pub const EXPRESSION_PARSE: &str = "AUTOCDC_INVALID_EXPRESSION.PARSE";
    pub const EXPRESSION_UNSUPPORTED: &str = "AUTOCDC_INVALID_EXPRESSION.UNSUPPORTED";
    pub const EXPRESSION_TYPE: &str = "AUTOCDC_INVALID_EXPRESSION.TYPE";
    pub const EXPRESSION_TOO_LARGE: &str = "AUTOCDC_INVALID_EXPRESSION.TOO_LARGE";
    pub const EXPRESSION_EVAL: &str = "AUTOCDC_INVALID_EXPRESSION.EVAL";
    pub const CONFIG: &str = "AUTOCDC_CONFIG";

    // A batch refused whole.
    pub const NULL_KEY: &str = "AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY";
    pub const NULL_SEQUENCE: &str = "AUTOCDC_MICROBATCH_VALIDATION.NULL_SEQUENCE";
    pub const SEQUENCE_EXPRESSION: &str = "AUTOCDC_MICROBATCH_VALIDATION.SEQUENCE_EXPRESSION";
    pub const SEQUENCE_TIE: &str = "AUTOCDC_MICROBATCH_VALIDATION.SEQUENCE_TIE";
    pub const SNAPSHOT_DUPLICATE_KEY: &str = "AUTOCDC_SNAPSHOT_DUPLICATE_KEY";
    pub const BAD_COLUMN: &str = "AUTOCDC_MICROBATCH_VALIDATION.COLUMN";
    pub const MISSING_COLUMN: &str = "AUTOCDC_MICROBATCH_VALIDATION.MISSING_COLUMN";
    pub const MALFORMED_BODY: &str = "AUTOCDC_MICROBATCH_VALIDATION.MALFORMED";
    pub const KEY_TOO_LONG: &str = "AUTOCDC_MICROBATCH_VALIDATION.KEY_TOO_LONG";
    pub const BATCH_TOO_LARGE: &str = "AUTOCDC_MICROBATCH_VALIDATION.TOO_LARGE";
    pub const ARROW: &str = "AUTOCDC_MICROBATCH_VALIDATION.ARROW";
    pub const TOO_MANY_COLUMNS: &str = "AUTOCDC_MICROBATCH_VALIDATION.TOO_MANY_COLUMNS";
    pub const DEBEZIUM_EVENT: &str = "AUTOCDC_DEBEZIUM.EVENT";
    pub const DEBEZIUM_NO_KEY: &str = "AUTOCDC_DEBEZIUM.NO_KEY";

    // Requests the HTTP layer refuses before a flow sees them.
    pub const BODY_TOO_LARGE: &str = "AUTOCDC_BODY_TOO_LARGE";
    pub const BAD_IDEMPOTENCY_KEY: &str = "AUTOCDC_BAD_IDEMPOTENCY_KEY";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "AUTOCDC_UNSUPPORTED_MEDIA_TYPE";
    pub const UNAUTHORIZED: &str = "AUTOCDC_UNAUTHORIZED";
    pub const FORBIDDEN: &str = "AUTOCDC_FORBIDDEN";
    pub const REQUEST_TIMEOUT: &str = "AUTOCDC_REQUEST_TIMEOUT";
    pub const COMMIT_TIMEOUT: &str = "AUTOCDC_COMMIT_TIMEOUT";
    pub const MAINTENANCE_TIMEOUT: &str = "AUTOCDC_MAINTENANCE_TIMEOUT";
    pub const SNAPSHOT_VERSION_REQUIRED: &str = "AUTOCDC_SNAPSHOT_VERSION_REQUIRED";

    // The service.
    pub const FLOW_NOT_FOUND: &str = "AUTOCDC_FLOW_NOT_FOUND";
    pub const OVERLOADED: &str = "AUTOCDC_OVERLOADED";
    pub const UNAVAILABLE: &str = "AUTOCDC_UNAVAILABLE";
    pub const WAL_WRITE_FAILED: &str = "AUTOCDC_WAL.WRITE_FAILED";
    pub const WAL_CLOSED: &str = "AUTOCDC_WAL.CLOSED";
    pub const WAL_CORRUPT: &str = "AUTOCDC_WAL.CORRUPT";
    pub const COMMITTER_PANIC: &str = "AUTOCDC_COMMITTER_PANIC";
    pub const LEASE_LOST: &str = "AUTOCDC_LEASE_LOST";

    // The stored tables disagree with the flow, or with each other.
    pub const KEY_SCHEMA_DRIFT: &str = "AUTOCDC_INVALID_STATE.KEY_SCHEMA_DRIFT";
    pub const PARTITION_DRIFT: &str = "AUTOCDC_INVALID_STATE.PARTITION_DRIFT";
    pub const SCHEMA_DRIFT: &str = "AUTOCDC_INVALID_STATE.SCHEMA_DRIFT";
    pub const SEQUENCING_TYPE_DRIFT: &str = "AUTOCDC_INVALID_STATE.SEQUENCING_TYPE_DRIFT";
    pub const STATE_SCHEMA: &str = "AUTOCDC_INVALID_STATE.STATE_SCHEMA";
    pub const STATE_SNAPSHOT_MISSING: &str = "AUTOCDC_INVALID_STATE.STATE_SNAPSHOT_MISSING";
    pub const METADATA_MISSING: &str = "AUTOCDC_INVALID_STATE.METADATA_MISSING";
    pub const METADATA_LOCATION: &str = "AUTOCDC_INVALID_STATE.METADATA_LOCATION";
    pub const INPUT_OFFSETS: &str = "AUTOCDC_INVALID_STATE.INPUT_OFFSETS";
    pub const FOREIGN_LOG: &str = "AUTOCDC_INVALID_STATE.FOREIGN_LOG";
    pub const POSITION: &str = "AUTOCDC_INVALID_STATE.POSITION";
    pub const UNKNOWN_FILE: &str = "AUTOCDC_INVALID_STATE.UNKNOWN_FILE";
    pub const TRUNCATE_FLOOR: &str = "AUTOCDC_INVALID_STATE.TRUNCATE_FLOOR";
    pub const REOPEN: &str = "AUTOCDC_INVALID_STATE.REOPEN";

    // Commits, files and the libraries underneath.
    pub const COMMIT_CONFLICT: &str = "AUTOCDC_COMMIT_CONFLICT";
    pub const WRITE_EMPTY_FILE: &str = "AUTOCDC_WRITE.EMPTY_FILE";
    pub const DEMO_MISMATCH: &str = "AUTOCDC_DEMO_MISMATCH";
    pub const INJECTED_FAULT: &str = "AUTOCDC_INJECTED_FAULT";
    pub const ICEBERG: &str = "AUTOCDC_ICEBERG";
    pub const STORAGE: &str = "AUTOCDC_STORAGE";
    pub const ARROW_LIBRARY: &str = "AUTOCDC_ARROW";
    pub const PARQUET: &str = "AUTOCDC_PARQUET";
    pub const IO: &str = "AUTOCDC_IO";
    pub const RESOURCE_EXHAUSTED: &str = "AUTOCDC_RESOURCE_EXHAUSTED";
    pub const JSON: &str = "AUTOCDC_JSON";
}

/// One stable code: the HTTP status it is answered with and what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeInfo {
    pub code: &'static str,
    pub status: u16,
    pub meaning: &'static str,
}

const fn info(code: &'static str, status: u16, meaning: &'static str) -> CodeInfo {
    CodeInfo {
        code,
        status,
        meaning,
    }
}

/// Every code autocdc emits, once, with its HTTP status and a one-line
/// meaning. The HTTP layer takes the status from here; `tests/it/errors.rs`
/// checks that every code in `src/` is here and that the table of docs/errors.md
/// says the same.
#[rustfmt::skip]
pub const REGISTRY: &[CodeInfo] = {
    use codes::*;
    &[
        info(MALFORMED_BODY, 400, "the body is not valid NDJSON / JSON / Arrow (row given)"),
        info(BAD_COLUMN, 400, "a value cannot be read as its column's type, an unknown column, or an upsert without a required column (row and column given)"),
        info(ARROW, 400, "an Arrow IPC stream whose declared lengths do not fit the body, or that is damaged"),
        info(BATCH_TOO_LARGE, 400, "more rows than `max_rows_per_request`, or a batch over half of `max_log_bytes`"),
        info(KEY_TOO_LONG, 400, "a key or sequence value over `max_key_bytes`"),
        info(MISSING_COLUMN, 400, "a key or sequence column is missing from the batch"),
        info(TOO_MANY_COLUMNS, 400, "`schema_evolution = \"add_columns\"`: a body that would add over 64 columns, or grow the flow over 1000"),
        info(DEBEZIUM_EVENT, 400, "a Debezium flow's element that is not a change event, or whose source position cannot be read (event index given)"),
        info(DEBEZIUM_NO_KEY, 422, "a Debezium delete without its key columns (the source table's REPLICA IDENTITY is NOTHING)"),
        info(NULL_KEY, 422, "a null key"),
        info(NULL_SEQUENCE, 422, "a null sequence"),
        info(SEQUENCE_EXPRESSION, 422, "a `sequence_by` expression that fails on a row: an overflow, a division by zero, a CAST that does not hold"),
        info(SEQUENCE_TIE, 422, "two changes of one key with the same sequence, under `on_sequence_tie = \"error\"`"),
        info(SNAPSHOT_DUPLICATE_KEY, 422, "a snapshot with a key twice"),
        info(SNAPSHOT_VERSION_REQUIRED, 400, "a snapshot push without `?version=`"),
        info(NOT_A_SNAPSHOT_FLOW, 400, "a snapshot pushed to a change flow, or changes to a snapshot flow"),
        info(BODY_TOO_LARGE, 413, "a body over `max_body_bytes`"),
        info(BAD_IDEMPOTENCY_KEY, 400, "an empty, over-long or non-ASCII `Idempotency-Key`"),
        info(UNSUPPORTED_MEDIA_TYPE, 415, "a content type other than the three accepted"),
        info(UNAUTHORIZED, 401, "no token, or an unknown one"),
        info(FORBIDDEN, 403, "a token without this flow, or defining a target outside its namespaces"),
        info(FLOW_NOT_FOUND, 404, "no such flow"),
        info(OVERLOADED, 429, "too much is pending (`max_uncommitted_bytes`, `max_log_bytes`); retry after `Retry-After`"),
        info(UNAVAILABLE, 503, "starting or stopping"),
        info(REQUEST_TIMEOUT, 503, "the request took longer than `request_timeout`; retry it with its `Idempotency-Key`"),
        info(COMMIT_TIMEOUT, 504, "a commit waited for did not finish in time (the batch is safe in the log)"),
        info(MAINTENANCE_TIMEOUT, 504, "a maintenance run waited for did not finish in time (it goes on; see the flow's status)"),
        info(WAL_WRITE_FAILED, 503, "the flow's log could not be written or synced; nothing was kept, retry"),
        info(WAL_CLOSED, 503, "the flow's log is closed (the flow is stopping)"),
        info(WAL_CORRUPT, 500, "a log segment cannot be read at start"),
        info(TARGET_IN_USE, 400, "another flow already writes this target"),
        info(INVALID_DEFINITION, 400, "a definition that cannot be used as written (the message says which setting)"),
        info(EMPTY_KEYS, 400, "`keys` is empty"),
        info(COLUMNS_NOT_FOUND, 400, "a key, sequence, selected or expression column is not a column"),
        info(MULTIPART_IDENTIFIER, 400, "`a.b` where a column name is expected"),
        info(RESERVED_COLUMN, 400, "a column named like autocdc's own (`__START_AT`, ...)"),
        info(INVALID_SELECTION, 400, "`column_list` / `except_column_list` that leave out a key or name nothing"),
        info(NON_ORDERABLE_SEQUENCE, 400, "a sequence column of a type without an order (boolean, binary)"),
        info(UNSUPPORTED, 400, "a combination autocdc does not support (the message says which)"),
        info(TRUNCATE_SCD2, 400, "`apply_as_truncates` on an SCD2 flow"),
        info(EXPRESSION_PARSE, 400, "an SQL expression that does not parse"),
        info(EXPRESSION_UNSUPPORTED, 400, "an SQL construct outside the supported set"),
        info(EXPRESSION_TYPE, 400, "an expression that is not boolean, or compares incomparable types"),
        info(EXPRESSION_TOO_LARGE, 400, "an expression over 64 KiB or 10,000 operators"),
        info(EXPRESSION_EVAL, 500, "an expression failed on a batch (a bug: report it)"),
        info(KEY_SCHEMA_DRIFT, 409, "the target's keys differ from the definition's"),
        info(PARTITION_DRIFT, 409, "the definition's `partition_by` cannot partition the existing target"),
        info(SCHEMA_DRIFT, 409, "the target's columns differ from the definition's"),
        info(
            SEQUENCING_TYPE_DRIFT,
            409,
            "the sequence columns or their types differ from those the state was written with"
        ),
        info(STATE_SCHEMA, 500, "the state table's schema is not autocdc's"),
        info(STATE_SNAPSHOT_MISSING, 500, "the state snapshot the target points to is gone"),
        info(METADATA_MISSING, 500, "a table's metadata file is missing"),
        info(METADATA_LOCATION, 500, "a table's metadata file is misnamed"),
        info(INPUT_OFFSETS, 500, "the target's `autocdc.input-offsets` property is unreadable"),
        info(FOREIGN_LOG, 409, "a flow's NATS stream holds messages its target has no record of (written for another table); `autocdc log adopt` or `reset`"),
        info(POSITION, 500, "the state names a row position the target does not have"),
        info(UNKNOWN_FILE, 500, "the state names a data file the target does not have"),
        info(TRUNCATE_FLOOR, 500, "the state and target disagree after a truncate"),
        info(REOPEN, 500, "the state and target disagree after a reopen"),
        info(COMMIT_CONFLICT, 500, "another writer kept committing first and the retries ran out"),
        info(COMMITTER_PANIC, 500, "a commit (or a maintenance run) panicked; the flow is degraded and retries (the run is reported failed)"),
        info(LEASE_LOST, 409, "on a shared log: another instance committed the flow under a newer lease; this one stops committing it (the new holder replays the batch)"),
        info(WRITE_EMPTY_FILE, 500, "a data file came out empty (a bug: report it)"),
        info(CONFIG, 400, "a config file or setting that cannot be used"),
        info(DEMO_MISMATCH, 500, "`autocdc demo`'s table differs from its oracle (CLI only)"),
        info(INJECTED_FAULT, 500, "a fault injected by a test"),
        info(ICEBERG, 500, "an error from the catalog or the Iceberg library, with its message"),
        info(STORAGE, 500, "an error from the object store, with its message"),
        info(ARROW_LIBRARY, 500, "an error from Arrow, with its message"),
        info(PARQUET, 500, "an error from Parquet, with its message"),
        info(IO, 500, "an error from the file system, with its message"),
        info(
            RESOURCE_EXHAUSTED,
            503,
            "the process ran out of open files or memory: the limit and the fix in the message; retry later",
        ),
        info(JSON, 400, "a JSON document that does not parse, with its message"),
    ]
};

/// The registry entry of a code; `None` for a code not registered (a bug
/// the registry test catches).
pub fn lookup(code: &str) -> Option<&'static CodeInfo> {
    REGISTRY.iter().find(|c| c.code == code)
}

/// The HTTP status of a code: its registry entry's, else 500.
pub fn status_of(code: &str) -> u16 {
    lookup(code).map_or(500, |c| c.status)
}
