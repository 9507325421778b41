//! The outbox's routes (docs/participants.md, "The outbox"), served by every participant built
//! on the library: `GET /v1/outbox` and `GET /v1/outbox/{event_id}` (relays and operators),
//! a relay's `POST .../delivered` and `POST .../attempt`, an operator's `POST .../retry` and
//! `POST .../mark` (audited: the token's holder, or the body's operator, with a reason).

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use protocol::ErrorCode;
use protocol::auth::Caller;
use protocol::outbox::{
    AttemptReport, DeliveredReport, IntentActionRequest, OUTBOX_ID_LEN_MAX, OUTBOX_LIST_LIMIT_MAX,
    OutboxEntry, OutboxList,
};

use crate::api_error::{ApiError, json_body, path_param};
use crate::outbox::{IntentRequest, StateFilter};
use crate::resource::Resource;
use crate::service::Participant;

/// `?state=&aggregate=&limit=` of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub filter: StateFilter,
    pub aggregate: Option<String>,
    pub limit: usize,
}

/// A listing's query as given (unknown parameters and repeated ones are refused by the
/// extractor: 400 `invalid_query`).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListQuery {
    pub state: Option<String>,
    pub aggregate: Option<String>,
    pub limit: Option<String>,
}

/// Checks a listing's query: `state` one of `pending|failed|delivered|abandoned|open|heads`
/// (absent: all), `aggregate` an id, `limit` 1..=1000 (absent: 1000).
pub fn parse_list_query(raw: RawListQuery) -> Result<ListQuery, String> {
    let filter = match raw.state.as_deref() {
        None => StateFilter::All,
        Some(state) => StateFilter::parse(state).ok_or_else(|| {
            format!("state {state:?} is not pending, failed, delivered, abandoned, open or heads")
        })?,
    };
    if let Some(aggregate) = &raw.aggregate {
        protocol::ids::check_id("aggregate", aggregate, OUTBOX_ID_LEN_MAX)
            .map_err(|e| e.to_string())?;
    }
    let limit = match raw.limit.as_deref() {
        None => OUTBOX_LIST_LIMIT_MAX,
        Some(limit) => limit
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=OUTBOX_LIST_LIMIT_MAX).contains(n))
            .ok_or_else(|| {
                format!("limit {limit:?} is not a number from 1 to {OUTBOX_LIST_LIMIT_MAX}")
            })?,
    };
    Ok(ListQuery {
        filter,
        aggregate: raw.aggregate,
        limit,
    })
}

fn event_id_param(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let event_id = path_param(path)?;
    protocol::ids::check_id("event_id", &event_id, OUTBOX_ID_LEN_MAX)
        .map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()))?;
    Ok(event_id)
}

pub(crate) async fn list<R: Resource>(
    State(participant): State<Participant<R>>,
    query: Result<Query<RawListQuery>, QueryRejection>,
) -> Result<axum::Json<OutboxList>, ApiError> {
    let Query(raw) =
        query.map_err(|rejection| ApiError::new(ErrorCode::InvalidQuery, rejection.body_text()))?;
    let query =
        parse_list_query(raw).map_err(|problem| ApiError::new(ErrorCode::InvalidQuery, problem))?;
    let list = participant
        .outbox_list(query.filter, query.aggregate.as_deref(), query.limit)
        .await?;
    Ok(axum::Json(list))
}

pub(crate) async fn entry<R: Resource>(
    State(participant): State<Participant<R>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    participant
        .outbox_entry(&event_id)
        .await?
        .map(axum::Json)
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("no intent {event_id:?} here (never written, or settled past retention)"),
            )
        })
}

async fn answer<R: Resource>(
    participant: &Participant<R>,
    event_id: String,
    request: IntentRequest,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    Ok(axum::Json(participant.intent(event_id, request).await?))
}

pub(crate) async fn delivered<R: Resource>(
    State(participant): State<Participant<R>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let report: DeliveredReport = json_body(&headers, body)?;
    let request = IntentRequest::Delivered {
        answer: report.answer,
    };
    answer(&participant, event_id, request).await
}

pub(crate) async fn attempt<R: Resource>(
    State(participant): State<Participant<R>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let report: AttemptReport = json_body(&headers, body)?;
    let request = IntentRequest::Attempt {
        error: report.error,
        permanent: report.permanent,
    };
    answer(&participant, event_id, request).await
}

/// The operator's name: with authentication on, the token's holder, whatever the body says.
fn operator_of(caller: Option<Extension<Caller>>, body: &IntentActionRequest) -> String {
    caller
        .and_then(|Extension(c)| c.name)
        .unwrap_or_else(|| body.operator.clone())
}

pub(crate) async fn retry<R: Resource>(
    State(participant): State<Participant<R>>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let body: IntentActionRequest = json_body(&headers, body)?;
    if body.state.is_some() {
        return Err(ApiError::new(
            ErrorCode::InvalidPayload,
            "a retry takes no \"state\" (it puts a failed intent back to pending)",
        ));
    }
    let request = IntentRequest::Retry {
        operator: operator_of(caller, &body),
        reason: body.reason,
    };
    answer(&participant, event_id, request).await
}

pub(crate) async fn mark<R: Resource>(
    State(participant): State<Participant<R>>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<OutboxEntry>, ApiError> {
    let event_id = event_id_param(path)?;
    let body: IntentActionRequest = json_body(&headers, body)?;
    let request = IntentRequest::Mark {
        operator: operator_of(caller, &body),
        state: body.state,
        reason: body.reason,
    };
    answer(&participant, event_id, request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::outbox::IntentState;

    fn raw(state: Option<&str>, aggregate: Option<&str>, limit: Option<&str>) -> RawListQuery {
        RawListQuery {
            state: state.map(Into::into),
            aggregate: aggregate.map(Into::into),
            limit: limit.map(Into::into),
        }
    }

    #[test]
    fn list_queries_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_list_query(raw(Some("open"), Some("checkout:c-1"), Some("5"))),
            Ok(ListQuery {
                filter: StateFilter::Open,
                aggregate: Some("checkout:c-1".into()),
                limit: 5,
            })
        );
        assert_eq!(
            parse_list_query(RawListQuery::default()).map(|q| (q.filter, q.limit)),
            Ok((StateFilter::All, OUTBOX_LIST_LIMIT_MAX))
        );
        assert_eq!(
            parse_list_query(raw(Some("failed"), None, None)).map(|q| q.filter),
            Ok(StateFilter::One(IntentState::Failed))
        );
        for bad in [
            raw(Some("lost"), None, None),
            raw(None, None, Some("0")),
            raw(None, None, Some("1001")),
            raw(None, None, Some("x")),
            raw(None, Some("a b"), None),
        ] {
            assert!(parse_list_query(bad).is_err());
        }
    }
}
