//! The PostgreSQL participant's outbox routes: the local write (`POST /v1/pg/write`) and the
//! outbox routes with the same paths and shapes as the KV participant's (`GET /v1/outbox`,
//! `GET /v1/outbox/{event_id}`, `POST .../delivered`, `.../attempt`, `.../retry`, `.../mark`),
//! so one relay serves both backends. It decodes and answers; `super::write` and
//! `super::outbox` do the work.
//!
//! The query of `GET /v1/outbox` is parsed here (`state`, `aggregate`, `limit`); the KV side
//! parses the same query, to be shared once both are merged.

use std::collections::HashMap;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use protocol::ErrorCode;
use protocol::auth::Caller;
use protocol::ids::check_id;
use protocol::outbox::{
    AttemptReport, DeliveredReport, IntentActionRequest, IntentState, OUTBOX_ID_LEN_MAX,
    OUTBOX_LIST_LIMIT_MAX, OutboxEntry, OutboxList, PgWriteRequest, PgWriteResponse,
};

use super::backend::PgParticipant;
use super::outbox::{Action, OutboxError, StateFilter};
use super::work::PgWork;
use super::write::WriteError;
use crate::api_error::{ApiError, json_body, path_param};

impl From<WriteError> for ApiError {
    fn from(error: WriteError) -> Self {
        let code = match &error {
            WriteError::InvalidId(_) => ErrorCode::InvalidId,
            WriteError::Invalid(_) => ErrorCode::InvalidPayload,
            WriteError::ConditionFailed(_) => ErrorCode::ConditionFailed,
            WriteError::IdConflict(_) => ErrorCode::IdConflict,
            WriteError::OpIdConflict(_) => ErrorCode::OpIdConflict,
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

/// `GET /v1/outbox`'s query, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub(crate) filter: StateFilter,
    pub(crate) aggregate: Option<String>,
    pub(crate) limit: usize,
}

/// `state` (pending, failed, delivered, abandoned, open; all when absent), `aggregate`,
/// `limit` (1 to [`OUTBOX_LIST_LIMIT_MAX`], which is also the default). Anything else is 400
/// `invalid_query` naming it.
pub(crate) fn list_query(query: &HashMap<String, String>) -> Result<ListQuery, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidQuery, message);
    if let Some(unknown) = query
        .keys()
        .find(|k| !["state", "aggregate", "limit"].contains(&k.as_str()))
    {
        return Err(invalid(format!(
            "unknown query parameter {unknown:?}; the outbox takes state, aggregate and limit"
        )));
    }
    let filter = match query.get("state") {
        None => StateFilter::All,
        Some(state) => StateFilter::parse(state).ok_or_else(|| {
            invalid(format!(
                "state {state:?} is not one of pending, failed, delivered, abandoned, open"
            ))
        })?,
    };
    let aggregate = match query.get("aggregate") {
        Some(aggregate) => {
            check_id("aggregate", aggregate, OUTBOX_ID_LEN_MAX)
                .map_err(|e| invalid(e.to_string()))?;
            Some(aggregate.clone())
        }
        None => None,
    };
    let limit = match query.get("limit") {
        None => OUTBOX_LIST_LIMIT_MAX,
        Some(text) => match text.parse::<usize>() {
            Ok(limit) if (1..=OUTBOX_LIST_LIMIT_MAX).contains(&limit) => limit,
            _ => {
                return Err(invalid(format!(
                    "limit {text:?} is not a number from 1 to {OUTBOX_LIST_LIMIT_MAX}"
                )));
            }
        },
    };
    Ok(ListQuery {
        filter,
        aggregate,
        limit,
    })
}

fn event_id_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let event_id = path_param(path)?;
    check_id("event_id", &event_id, OUTBOX_ID_LEN_MAX)
        .map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()))?;
    Ok(event_id)
}

pub(crate) async fn write<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<PgWriteResponse>, ApiError> {
    let request: PgWriteRequest = json_body(&headers, body)?;
    Ok(axum::Json(participant.write(request).await?))
}

pub(crate) async fn list<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<axum::Json<OutboxList>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))?;
    let query = list_query(&query)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_listing_query_is_checked() {
        let all = list_query(&query(&[])).unwrap();
        assert_eq!(all.filter, StateFilter::All);
        assert_eq!(all.limit, OUTBOX_LIST_LIMIT_MAX);
        let open = list_query(&query(&[
            ("state", "open"),
            ("aggregate", "c:1"),
            ("limit", "5"),
        ]))
        .unwrap();
        assert_eq!(open.filter, StateFilter::Open);
        assert_eq!(open.aggregate.as_deref(), Some("c:1"));
        assert_eq!(open.limit, 5);
        let failed = list_query(&query(&[("state", "failed")])).unwrap();
        assert_eq!(failed.filter, StateFilter::One(IntentState::Failed));
        for bad in [
            query(&[("state", "stuck")]),
            query(&[("limit", "0")]),
            query(&[("limit", "1001")]),
            query(&[("limit", "x")]),
            query(&[("aggregate", "a b")]),
            query(&[("sort", "seq")]),
        ] {
            let error = list_query(&bad).unwrap_err();
            assert_eq!(error.code, ErrorCode::InvalidQuery, "{bad:?}");
        }
    }
}
