//! The one error type of the HTTP API: every failure is `protocol::ErrorBody` with the status
//! its code carries.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use protocol::{ErrorBody, ErrorCode};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds for a `Retry-After` header (503 `overloaded`).
    pub retry_after_s: Option<u64>,
    /// With 503 `not_leader`: the group leader's base URL, when known.
    pub leader: Option<String>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            retry_after_s: None,
            leader: None,
        }
    }

    /// 503 `not_leader`: this node of an HA group does not lead it now; `leader` names the
    /// one that does, when known (docs/ha.md). No redirect: participants follow none.
    pub fn not_leader(leader: Option<String>, why: &str) -> ApiError {
        ApiError {
            leader,
            ..ApiError::new(ErrorCode::NotLeader, why)
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

    /// 503 `overloaded` with `Retry-After` (whole seconds, at least 1).
    pub fn overloaded(message: impl Into<String>, retry_after_ms: u64) -> ApiError {
        ApiError {
            retry_after_s: Some(retry_after_ms.div_ceil(1000).max(1)),
            ..ApiError::new(ErrorCode::Overloaded, message)
        }
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
        let mut body = ErrorBody::new(self.code, self.message);
        body.leader = self.leader;
        let mut response = (status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
