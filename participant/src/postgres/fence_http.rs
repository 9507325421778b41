//! The PostgreSQL participant's fence routes, with the KV participant's paths and shapes
//! (`protocol::lease`): `GET /v1/fences/{resource}` (peers, operators) and
//! `POST /v1/fences/{resource}/reset` (operators, audited). It decodes and answers;
//! `super::fence` does the work.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use protocol::ErrorCode;
use protocol::auth::Caller;
use protocol::lease::{FenceReset, FenceResetBody, FenceStatus};

use super::backend::PgParticipant;
use super::fence::FenceOpError;
use super::work::PgWork;
use crate::api_error::{ApiError, json_body};
use crate::fence::{FenceRefusal, FenceResetRequest, ResetRefused};
use crate::fence_http::resource_param;

impl From<FenceOpError> for ApiError {
    fn from(error: FenceOpError) -> Self {
        let code = match &error {
            FenceOpError::NotFound(_) => ErrorCode::NotFound,
            FenceOpError::Refused(ResetRefused::Unknown { .. }) => ErrorCode::NotFound,
            FenceOpError::Refused(ResetRefused::Changed { .. }) => ErrorCode::FenceChanged,
            FenceOpError::Refused(ResetRefused::NotLower { .. }) => ErrorCode::InvalidReset,
            FenceOpError::Database(_) => ErrorCode::NotReady,
        };
        ApiError::new(code, error.to_string())
    }
}

/// The error code of a token the policy refuses (a stale one is answered with its highest).
pub(super) fn refusal_code(refusal: &FenceRefusal) -> ErrorCode {
    match refusal {
        FenceRefusal::Stale(_) => ErrorCode::StaleToken,
        FenceRefusal::Unproven { .. } => ErrorCode::InvalidFenceProof,
        FenceRefusal::TooHigh { .. } => ErrorCode::TokenTooHigh,
    }
}

pub(super) async fn status<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<FenceStatus>, ApiError> {
    let resource = resource_param(path)?;
    Ok(axum::Json(participant.fence_status(&resource).await?))
}

pub(super) async fn reset<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<FenceReset>, ApiError> {
    let resource = resource_param(path)?;
    let body: FenceResetBody = json_body(&headers, body)?;
    // With authentication on, the audit row names the token's holder, whatever the body says.
    let operator = caller
        .and_then(|Extension(c)| c.name)
        .unwrap_or(body.operator);
    if let Some(problem) = protocol::operator::operator_fields_problem(&operator, &body.reason) {
        return Err(ApiError::new(ErrorCode::InvalidOperator, problem));
    }
    let request = FenceResetRequest {
        resource,
        from: body.from,
        to: body.to,
        operator,
        reason: body.reason,
    };
    Ok(axum::Json(participant.reset_fence(request).await?))
}
