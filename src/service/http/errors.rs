//! `Error` → HTTP: each error's status and stable code, and the JSON body
//! (`ErrorResponse`) every refusal answers with.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::{Error, codes};

/// An error response: a library error, or a refusal of the HTTP layer
/// itself. The status comes from the code's entry in `error::REGISTRY`.
#[derive(Debug)]
pub enum ApiError {
    Library(Error),
    /// No bearer token, or an unknown one.
    Unauthorized(String),
    /// A token without this flow or namespace.
    Forbidden(String),
    UnsupportedMediaType(String),
    BodyTooLarge(String),
    /// Over `request_timeout`.
    RequestTimeout(String),
    /// A commit waited for (`/commit`, `?wait=commit`) did not finish in time.
    CommitTimeout(String),
    /// A maintenance run waited for (`/maintain`) did not finish in time.
    MaintenanceTimeout(String),
    BadIdempotencyKey(String),
    SnapshotVersionRequired(String),
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError::Library(e)
    }
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Library(e) => e.code(),
            ApiError::Unauthorized(_) => codes::UNAUTHORIZED,
            ApiError::Forbidden(_) => codes::FORBIDDEN,
            ApiError::UnsupportedMediaType(_) => codes::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTooLarge(_) => codes::BODY_TOO_LARGE,
            ApiError::RequestTimeout(_) => codes::REQUEST_TIMEOUT,
            ApiError::CommitTimeout(_) => codes::COMMIT_TIMEOUT,
            ApiError::MaintenanceTimeout(_) => codes::MAINTENANCE_TIMEOUT,
            ApiError::BadIdempotencyKey(_) => codes::BAD_IDEMPOTENCY_KEY,
            ApiError::SnapshotVersionRequired(_) => codes::SNAPSHOT_VERSION_REQUIRED,
        }
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(crate::error::status_of(self.code()))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn message(&self) -> String {
        match self {
            ApiError::Library(e) => e.to_string(),
            ApiError::Unauthorized(m)
            | ApiError::Forbidden(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::BodyTooLarge(m)
            | ApiError::RequestTimeout(m)
            | ApiError::CommitTimeout(m)
            | ApiError::MaintenanceTimeout(m)
            | ApiError::BadIdempotencyKey(m)
            | ApiError::SnapshotVersionRequired(m) => format!("[{}] {m}", self.code()),
        }
    }
}

/// Every error response: `{"error": {...}}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable code, e.g. `AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY`.
    pub code: String,
    pub message: String,
    /// The offending row of the batch (0-based), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row: Option<usize>,
    /// The offending column, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // What the server failed at is in its log too, not only in the answer.
        if status == StatusCode::INTERNAL_SERVER_ERROR || self.code() == codes::RESOURCE_EXHAUSTED {
            tracing::error!(code = self.code(), error = %self.message(), "request_failed");
        }
        let (row, column) = match &self {
            ApiError::Library(Error::Batch { row, column, .. }) => {
                (Some(*row), Some(column.clone()).filter(|c| !c.is_empty()))
            }
            _ => (None, None),
        };
        let body = ErrorResponse {
            error: ErrorBody {
                code: self.code().to_string(),
                message: self.message(),
                row,
                column,
            },
        };
        let mut resp = (status, Json(body)).into_response();
        if let ApiError::Library(Error::Overloaded {
            retry_after_secs, ..
        }) = &self
        {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        resp
    }
}

pub(super) type ApiResult<T> = std::result::Result<T, ApiError>;
