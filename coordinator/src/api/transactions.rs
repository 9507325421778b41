//! The transaction routes: create (with idempotency by id), status, listing, and the decision
//! for participants in doubt.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};

use protocol::limits::{BODY_BYTES_MAX, LIST_LIMIT_MAX};
use protocol::{
    DecisionQueryResponse, ErrorCode, TransactionList, TransactionRequest, TransactionResponse,
    TransactionState, TransactionStatus, TxId,
};

use crate::api::{ApiError, AppState};
use crate::digest::Digest;
use crate::engine::{Reply, WaitFor};
use crate::runtime::{NewTransaction, QueryError};

/// Listing size when `limit` is not given.
pub const LIST_LIMIT_DEFAULT: usize = 100;

type QueryPairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

fn query_pairs(query: QueryPairs) -> Result<Vec<(String, String)>, ApiError> {
    query
        .map(|Query(pairs)| pairs)
        .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))
}

fn txid(path: Result<Path<String>, PathRejection>) -> Result<TxId, ApiError> {
    let Path(raw) = path.map_err(|e| ApiError::new(ErrorCode::InvalidId, e.body_text()))?;
    TxId::new(raw).map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// `POST /v1/transactions[?wait=acked]`.
pub async fn create(
    State(state): State<AppState>,
    query: QueryPairs,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TransactionResponse>, ApiError> {
    let core = state.core()?;
    if core.is_poisoned() {
        return Err(ApiError::log_failed());
    }
    let mut wait = WaitFor::Decision;
    for (key, value) in query_pairs(query)? {
        match (key.as_str(), value.as_str()) {
            ("wait", "acked") => wait = WaitFor::Acked,
            ("wait", "decision") => wait = WaitFor::Decision,
            ("wait", other) => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!("wait={other:?}: expected \"acked\" or \"decision\""),
                ));
            }
            (other, _) => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!("unknown query parameter {other:?}; only \"wait\" is accepted"),
                ));
            }
        }
    }
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::BodyTooLarge,
                format!("the body is over the limit of {BODY_BYTES_MAX} bytes"),
            )
        } else {
            ApiError::new(ErrorCode::MalformedJson, e.body_text())
        }
    })?;
    if !is_json(&headers) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "send the body as Content-Type: application/json",
        ));
    }
    let request: TransactionRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("the body is not a transaction request: {e}"),
        )
    })?;
    let valid = request
        .validate()
        .map_err(|e| ApiError::new(e.code, e.message))?;
    if let Some((name, _)) = valid
        .participants
        .iter()
        .find(|(name, _)| !core.knows_participant(name))
    {
        return Err(ApiError::new(
            ErrorCode::UnknownParticipant,
            format!("participant \"{name}\" is not in this coordinator's configuration"),
        ));
    }
    let digest = Digest::of_request(&valid);
    let txid = match &valid.id {
        Some(id) => id.clone(),
        None => TxId::new(format!("tx-{:016x}", fastrand::u64(..)))
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?,
    };
    let timeout_ms = valid.timeout_ms.unwrap_or(core.config().prepare_timeout_ms);
    let reply = core
        .submit(NewTransaction {
            txid,
            digest,
            participants: valid.participants,
            timeout_ms,
            wait,
        })
        .await
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotReady,
                "the coordinator is shutting down; the outcome will be recorded, retry with the same id",
            )
        })?;
    match reply {
        Reply::Outcome(response) => Ok(Json(response)),
        Reply::Conflict { txid } => Err(ApiError::new(
            ErrorCode::IdConflict,
            format!("transaction {txid} exists with a different request body"),
        )),
        Reply::LogFailed { error } => Err(ApiError::new(
            ErrorCode::LogFailed,
            format!(
                "the decision could not be logged ({error}); the outcome is unknown until the coordinator restarts"
            ),
        )),
    }
}

/// `GET /v1/transactions/{id}`.
pub async fn status(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TransactionStatus>, ApiError> {
    let core = state.core()?;
    let txid = txid(path)?;
    core.status(&txid).map(Json).ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            format!(
                "no transaction {txid} (never seen, or ended longer ago than the retention window)"
            ),
        )
    })
}

/// `GET /v1/transactions?state=...&limit=...`.
pub async fn list(
    State(state): State<AppState>,
    query: QueryPairs,
) -> Result<Json<TransactionList>, ApiError> {
    let core = state.core()?;
    let mut wanted = None;
    let mut limit = LIST_LIMIT_DEFAULT;
    for (key, value) in query_pairs(query)? {
        match key.as_str() {
            "state" => {
                wanted = Some(
                    value
                        .parse::<TransactionState>()
                        .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e))?,
                )
            }
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=LIST_LIMIT_MAX).contains(n))
                    .ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::InvalidQuery,
                            format!(
                                "limit={value:?}: expected a number from 1 to {LIST_LIMIT_MAX}"
                            ),
                        )
                    })?
            }
            other => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!("unknown query parameter {other:?}; expected state or limit"),
                ));
            }
        }
    }
    Ok(Json(TransactionList {
        transactions: core.list(wanted, limit),
    }))
}

/// `GET /v1/transactions/{id}/decision`: for an id with no record, a presumed abort, made
/// durable before it is answered.
pub async fn decision(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<DecisionQueryResponse>, ApiError> {
    let core = state.core()?;
    let txid = txid(path)?;
    let decision = core.decision_query(&txid).await.map_err(|e| match e {
        QueryError::LogFailed(error) => ApiError::new(
            ErrorCode::LogFailed,
            format!(
                "no decision is recorded for {txid} and a presumed abort cannot be logged \
                 ({error}); ask again after the coordinator restarts"
            ),
        ),
        QueryError::ShuttingDown => ApiError::new(
            ErrorCode::NotReady,
            "the coordinator is shutting down; ask again",
        ),
    })?;
    Ok(Json(DecisionQueryResponse {
        decision,
        coordinator_id: Some(core.identity().coordinator_id.clone()),
    }))
}
