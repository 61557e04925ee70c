//! The one error type of the library. Every variant carries a stable code
//! (`Error::code`), says what was wrong and, where there is one, the fix.
//! Only `main` (and later the HTTP layer) turns these into exit codes or responses.

use crate::core::predicate::PredicateError;

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

    /// A named thing (a flow) does not exist.
    #[error("[{code}] {message}")]
    NotFound { code: &'static str, message: String },

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

    #[error("[AUTOCDC_IO] {0}")]
    Io(#[from] std::io::Error),

    #[error("[AUTOCDC_JSON] {0}")]
    Json(#[from] serde_json::Error),
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
            | Error::State { code, .. }
            | Error::NotFound { code, .. } => code,
            Error::Overloaded { .. } => codes::OVERLOADED,
            Error::Unavailable(_) => codes::UNAVAILABLE,
            Error::CommitConflict(_) => "AUTOCDC_COMMIT_CONFLICT",
            Error::InjectedFault(_) => "AUTOCDC_INJECTED_FAULT",
            Error::Config(_) => "AUTOCDC_CONFIG",
            Error::Iceberg(_) => "AUTOCDC_ICEBERG",
            Error::Storage(_) => "AUTOCDC_STORAGE",
            Error::Arrow(_) => "AUTOCDC_ARROW",
            Error::Parquet(_) => "AUTOCDC_PARQUET",
            Error::Io(_) => "AUTOCDC_IO",
            Error::Json(_) => "AUTOCDC_JSON",
        }
    }

    pub(crate) fn definition(flow: &str, code: &'static str, message: impl Into<String>) -> Self {
        Error::Definition {
            code,
            flow: flow.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn from_predicate(flow: &str, e: PredicateError) -> Self {
        Error::Definition {
            code: e.code(),
            flow: flow.to_string(),
            message: e.to_string(),
        }
    }
}

/// Stable codes, in one place so docs and tests name the same strings.
pub mod codes {
    pub const EMPTY_KEYS: &str = "AUTOCDC_EMPTY_KEYS";
    pub const COLUMNS_NOT_FOUND: &str = "AUTOCDC_COLUMNS_NOT_FOUND_IN_SCHEMA";
    pub const MULTIPART_IDENTIFIER: &str = "AUTOCDC_MULTIPART_COLUMN_IDENTIFIER";
    pub const RESERVED_COLUMN: &str = "AUTOCDC_RESERVED_COLUMN_NAME_CONFLICT";
    pub const INVALID_SELECTION: &str = "AUTOCDC_INVALID_COLUMN_SELECTION";
    pub const NON_ORDERABLE_SEQUENCE: &str = "AUTOCDC_NON_ORDERABLE_SEQUENCE";
    pub const KEY_SCHEMA_DRIFT: &str = "AUTOCDC_INVALID_STATE.KEY_SCHEMA_DRIFT";
    pub const INVALID_DEFINITION: &str = "AUTOCDC_INVALID_DEFINITION";
    pub const UNSUPPORTED: &str = "AUTOCDC_UNSUPPORTED";
    pub const TRUNCATE_SCD2: &str = "AUTOCDC_TRUNCATE_SCD2_NOT_SUPPORTED";
    pub const NOT_A_SNAPSHOT_FLOW: &str = "AUTOCDC_SNAPSHOT_FLOW_MISMATCH";
    pub const NULL_KEY: &str = "AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY";
    pub const NULL_SEQUENCE: &str = "AUTOCDC_MICROBATCH_VALIDATION.NULL_SEQUENCE";
    pub const SEQUENCE_TIE: &str = "AUTOCDC_MICROBATCH_VALIDATION.SEQUENCE_TIE";
    pub const BAD_COLUMN: &str = "AUTOCDC_MICROBATCH_VALIDATION.COLUMN";
    pub const MISSING_COLUMN: &str = "AUTOCDC_MICROBATCH_VALIDATION.MISSING_COLUMN";
    pub const MALFORMED_BODY: &str = "AUTOCDC_MICROBATCH_VALIDATION.MALFORMED";
    pub const TARGET_IN_USE: &str = "AUTOCDC_TARGET_IN_USE";
    pub const KEY_TOO_LONG: &str = "AUTOCDC_MICROBATCH_VALIDATION.KEY_TOO_LONG";
    pub const COMMITTER_PANIC: &str = "AUTOCDC_COMMITTER_PANIC";
    pub const BATCH_TOO_LARGE: &str = "AUTOCDC_MICROBATCH_VALIDATION.TOO_LARGE";
    pub const ARROW: &str = "AUTOCDC_MICROBATCH_VALIDATION.ARROW";
    pub const FLOW_NOT_FOUND: &str = "AUTOCDC_FLOW_NOT_FOUND";
    pub const OVERLOADED: &str = "AUTOCDC_OVERLOADED";
    pub const UNAVAILABLE: &str = "AUTOCDC_UNAVAILABLE";
}
