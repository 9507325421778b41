//! The one error type of the HTTP API: every failure is `protocol::ErrorBody` with the status
//! its code carries.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use protocol::{ErrorBody, ErrorCode};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn not_ready() -> ApiError {
        ApiError::new(
            ErrorCode::NotReady,
            "the coordinator is recovering its log; retry shortly",
        )
    }

    pub fn log_failed() -> ApiError {
        ApiError::new(
            ErrorCode::LogFailed,
            "the coordinator's log failed (write or fsync error); it takes no more transactions until restarted",
        )
    }

    pub fn log_behind(evidence: &str) -> ApiError {
        ApiError::new(
            ErrorCode::LogBehind,
            format!(
                "this coordinator's log is behind what participants have seen ({evidence}); it \
                 takes no new transactions. Was its data directory restored from a backup? See \
                 docs/operations.md, \"Restores and rolled-back logs\""
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(ErrorBody::new(self.code, self.message))).into_response()
    }
}
