//! The fence table's operator routes (docs/leases.md, "Resetting a fence"):
//! `GET /v1/fences/{resource}` shows what a resource takes, and
//! `POST /v1/fences/{resource}/reset` lowers its highest token, compare-and-set on what the
//! operator read, logged with who and why before the answer.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use protocol::ErrorCode;
use protocol::auth::Caller;
use protocol::lease::{FenceReset, FenceResetBody, FenceStatus, check_lease_id};

use crate::api_error::{ApiError, json_body, path_param};
use crate::fence::FenceResetRequest;
use crate::resource::Resource;
use crate::service::Participant;

pub(crate) fn resource_param(
    path: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let resource = path_param(path)?;
    check_lease_id("fence resource", &resource)
        .map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()))?;
    Ok(resource)
}

pub(crate) async fn status<R: Resource>(
    State(participant): State<Participant<R>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<FenceStatus>, ApiError> {
    let resource = resource_param(path)?;
    let status = participant.with_engine(|engine| {
        let fences = engine.fences();
        FenceStatus {
            highest: fences.effective_highest(&resource),
            from_floor: fences.highest(&resource).is_none() && fences.floor() > 0,
            written_at_ms: fences.written_at_ms(&resource),
            resets: fences
                .resets()
                .iter()
                .filter(|r| r.resource == resource)
                .cloned()
                .collect(),
            resource: resource.clone(),
        }
    });
    if status.highest.is_none() && status.resets.is_empty() {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no token was ever accepted for {resource:?} here"),
        ));
    }
    Ok(axum::Json(status))
}

pub(crate) async fn reset<R: Resource>(
    State(participant): State<Participant<R>>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<FenceReset>, ApiError> {
    let resource = resource_param(path)?;
    let body: FenceResetBody = json_body(&headers, body)?;
    // With authentication on, the audit trail names the token's holder, whatever the body says.
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
