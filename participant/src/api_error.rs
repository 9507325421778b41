//! The JSON error body every route answers with, and the decoding of request bodies and path
//! parameters into it: the floor under the router, its guards (tokens, cross-site checks) and
//! every service's own routes, so that each answers a failure the same way.

use axum::body::Bytes;
use axum::extract::Path;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::limits::BODY_BYTES_MAX;
use protocol::{ErrorBody, ErrorCode};
use serde::de::DeserializeOwned;

use crate::service::RequestError;

/// An error answer: `{"error": code, "message": ...}` with the code's status, and
/// `highest_epoch` on a fencing refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub highest_epoch: Option<protocol::Epoch>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            highest_epoch: None,
        }
    }

    /// The refusal's own answer, naming the highest epoch when it is a fencing refusal.
    pub fn rejected(rejection: &crate::rejection::Rejection) -> Self {
        Self {
            highest_epoch: rejection.highest_epoch(),
            ..Self::new(rejection.code(), rejection.to_string())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody::new(self.code, self.message);
        let body = match self.highest_epoch {
            Some(epoch) => body.with_highest_epoch(epoch),
            None => body,
        };
        (status, axum::Json(body)).into_response()
    }
}

impl From<RequestError> for ApiError {
    fn from(error: RequestError) -> Self {
        match &error {
            RequestError::Rejected(rejection) => ApiError::rejected(rejection),
            RequestError::LogFailed(_) => ApiError::new(ErrorCode::LogFailed, error.to_string()),
            RequestError::Internal(_) => ApiError::new(ErrorCode::Internal, error.to_string()),
        }
    }
}

/// 409 `stale_token` with the highest token accepted (`protocol::lease::StaleTokenBody`).
impl IntoResponse for crate::fence::StaleToken {
    fn into_response(self) -> Response {
        let body = protocol::lease::StaleTokenBody {
            error: ErrorCode::StaleToken,
            message: self.to_string(),
            resource: self.resource,
            highest: self.highest,
        };
        (StatusCode::CONFLICT, axum::Json(body)).into_response()
    }
}

/// Decodes a JSON body: 413 over the body limit, 415 for a non-JSON content type, 400 for
/// malformed JSON or the wrong shape.
pub fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::BodyTooLarge,
                format!("the body is larger than {BODY_BYTES_MAX} bytes"),
            )
        } else {
            ApiError::new(ErrorCode::MalformedJson, rejection.body_text())
        }
    })?;
    if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
        let json = content_type.to_str().is_ok_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
        if !json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be application/json",
            ));
        }
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(ErrorCode::MalformedJson, format!("malformed request: {e}")))
}

/// A path parameter as text: 422 `invalid_id` with the JSON error body when it does not
/// decode (say, percent-encoded bytes that are not UTF-8), never axum's plain-text 400.
pub fn path_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(value)| value)
        .map_err(|rejection| ApiError::new(ErrorCode::InvalidId, rejection.body_text()))
}
