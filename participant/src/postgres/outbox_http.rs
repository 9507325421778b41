//! The PostgreSQL participant's outbox routes: the local write (`POST /v1/pg/write`) and the
//! outbox routes with the same paths and shapes as the KV participant's (`GET /v1/outbox`,
//! `GET /v1/outbox/{event_id}`, `POST .../delivered`, `.../attempt`, `.../retry`, `.../mark`),
//! so one relay serves both backends. It decodes and answers; `super::write` and
//! `super::outbox` do the work.
//! The listing's query is parsed by the KV participant's parser (`crate::outbox_http`).

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use protocol::ErrorCode;
use protocol::auth::Caller;
use protocol::ids::check_id;
use protocol::outbox::{
    AttemptReport, DeliveredReport, IntentActionRequest, IntentState, OUTBOX_ID_LEN_MAX,
    OutboxEntry, OutboxList, PgWriteRequest, PgWriteResponse,
};

use super::backend::PgParticipant;
use super::outbox::{Action, OutboxError};
use super::work::PgWork;
use super::write::WriteError;
use crate::api_error::{ApiError, json_body, path_param};
use crate::outbox_http::{RawListQuery, parse_list_query};

impl From<WriteError> for ApiError {
    fn from(error: WriteError) -> Self {
        let code = match &error {
            WriteError::InvalidId(_) => ErrorCode::InvalidId,
            WriteError::Invalid(_) => ErrorCode::InvalidPayload,
            WriteError::ConditionFailed(_) => ErrorCode::ConditionFailed,
            WriteError::IdConflict(_) => ErrorCode::IdConflict,
            WriteError::OpIdConflict(_) => ErrorCode::OpIdConflict,
            WriteError::Stale(_) => ErrorCode::StaleToken,
            WriteError::Fence(refusal) => super::fence_http::refusal_code(refusal),
            WriteError::Database(_) => ErrorCode::NotReady,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<OutboxError> for ApiError {
    fn from(error: OutboxError) -> Self {
        let code = match &error {
            OutboxError::NotFound(_) => ErrorCode::NotFound,
            OutboxError::OutOfOrder(_) => ErrorCode::IntentOutOfOrder,
            OutboxError::Settled(_) => ErrorCode::NotPending,
            OutboxError::Invalid(_) => ErrorCode::InvalidPayload,
            OutboxError::Database(_) => ErrorCode::NotReady,
        };
        ApiError::new(code, error.to_string())
    }
}

fn event_id_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let event_id = path_param(path)?;
    check_id("event_id", &event_id, OUTBOX_ID_LEN_MAX)
        .map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()))?;
    Ok(event_id)
}

/// A stale token is answered as the KV participant's: 409 `stale_token` with the highest
/// token accepted (`protocol::lease::StaleTokenBody`).
pub(crate) async fn write<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<PgWriteResponse>, Response> {
    let request: PgWriteRequest = json_body(&headers, body).map_err(|e| e.into_response())?;
    match participant.write(request).await {
        Ok(response) => Ok(axum::Json(response)),
        Err(WriteError::Stale(stale)) => Err(stale.into_response()),
        Err(error) => Err(ApiError::from(error).into_response()),
    }
}

/// The query is parsed as the KV participant's (`crate::outbox_http`), so both answer one
/// query the same.
pub(crate) async fn list<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    query: Result<Query<RawListQuery>, QueryRejection>,
) -> Result<axum::Json<OutboxList>, ApiError> {
    let Query(raw) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let query =
        parse_list_query(raw).map_err(|problem| ApiError::new(ErrorCode::InvalidQuery, problem))?;
    Ok(axum::Json(
        participant
            .outbox(query.filter, query.aggregate.as_deref(), query.limit)
            .await?,
    ))
}

pub(crate) async fn entry<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    Ok(axum::Json(participant.outbox_entry(&event_id).await?))
}

pub(crate) async fn delivered<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let report: DeliveredReport = json_body(&headers, body)?;
    let action = Action::Delivered {
        answer: report.answer,
    };
    Ok(axum::Json(participant.outbox_act(&event_id, action).await?))
}

pub(crate) async fn attempt<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let report: AttemptReport = json_body(&headers, body)?;
    let action = Action::Attempt {
        error: report.error,
        permanent: report.permanent,
    };
    Ok(axum::Json(participant.outbox_act(&event_id, action).await?))
}

/// The operator and reason of an audited action: with authentication on, the token's holder,
/// whatever the body says (as a fence reset).
fn operator_action(
    caller: Option<Extension<Caller>>,
    request: &IntentActionRequest,
) -> Result<(String, String), ApiError> {
    let operator = caller
        .and_then(|Extension(c)| c.name)
        .unwrap_or_else(|| request.operator.clone());
    if let Some(problem) = protocol::operator::operator_fields_problem(&operator, &request.reason) {
        return Err(ApiError::new(ErrorCode::InvalidOperator, problem));
    }
    Ok((operator, request.reason.clone()))
}

pub(crate) async fn retry<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let request: IntentActionRequest = json_body(&headers, body)?;
    if request.state.is_some() {
        return Err(ApiError::new(
            ErrorCode::InvalidPayload,
            "retry takes no state (mark does)",
        ));
    }
    let (operator, reason) = operator_action(caller, &request)?;
    let action = Action::Retry { operator, reason };
    Ok(axum::Json(participant.outbox_act(&event_id, action).await?))
}

pub(crate) async fn mark<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let request: IntentActionRequest = json_body(&headers, body)?;
    let (operator, reason) = operator_action(caller, &request)?;
    // As the KV participant: a mark without a state abandons.
    let state = request.state.unwrap_or(IntentState::Abandoned);
    let action = Action::Mark {
        operator,
        reason,
        state,
    };
    Ok(axum::Json(participant.outbox_act(&event_id, action).await?))
}
