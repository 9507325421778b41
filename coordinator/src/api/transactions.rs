//! The transaction routes: create (with idempotency by id), status, listing, and the decision
//! for participants in doubt.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};

use protocol::auth::Caller;
use protocol::limits::{BODY_BYTES_MAX, LIST_LIMIT_MAX};
use protocol::{
    DecisionQuery, DecisionQueryResponse, Epoch, ErrorCode, GlobalTxId, Incarnation,
    TransactionList, TransactionRequest, TransactionResponse, TransactionState, TransactionStatus,
    TxId,
};

use crate::api::{ApiError, AppState, json_body};
use crate::digest::Digest;
use crate::engine::{Reply, WaitFor};
use crate::runtime::NewTransaction;

/// Listing size when `limit` is not given.
pub const LIST_LIMIT_DEFAULT: usize = 100;

pub(super) type QueryPairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

pub(super) fn query_pairs(query: QueryPairs) -> Result<Vec<(String, String)>, ApiError> {
    query
        .map(|Query(pairs)| pairs)
        .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e.body_text()))
}

/// A whole number in a query parameter: ASCII digits only, as the OpenAPI document's
/// `integer` says (Rust's `parse` would also take a leading `+`), within `u64`.
pub(super) fn whole_number(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// A listing's `limit` query parameter: 1 ..= `LIST_LIMIT_MAX`, else 400 `invalid_query`.
pub(super) fn list_limit(value: &str) -> Result<usize, ApiError> {
    whole_number(value)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=LIST_LIMIT_MAX).contains(n))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidQuery,
                format!("limit={value:?}: expected a number from 1 to {LIST_LIMIT_MAX}"),
            )
        })
}

pub(super) fn txid(path: Result<Path<String>, PathRejection>) -> Result<TxId, ApiError> {
    let Path(raw) = path.map_err(|e| ApiError::new(ErrorCode::InvalidId, e.body_text()))?;
    TxId::new(raw).map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()))
}

pub(super) fn is_json(headers: &HeaderMap) -> bool {
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
    caller: Option<Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TransactionResponse>, ApiError> {
    let client = crate::api::auth::caller_name(&caller);
    let core = state.core()?;
    if core.is_poisoned() {
        return Err(ApiError::log_failed());
    }
    if let Some(evidence) = core.log_behind() {
        // Even a retry of a known id: its recorded outcome may be one the lost part of the
        // log superseded.
        return Err(ApiError::log_behind(&evidence));
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
    let request: TransactionRequest = json_body::decode(&body, &["participants"]).map_err(|e| {
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
        None => generated_txid()?,
    };
    let timeout_ms = valid.timeout_ms.unwrap_or(core.config().prepare_timeout_ms);
    let reply = core
        .submit(NewTransaction {
            txid,
            digest,
            participants: valid.participants,
            timeout_ms,
            wait,
            client,
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
        Reply::Overloaded {
            participant,
            message,
        } => {
            core.metrics()
                .overloaded
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(%participant, %message, "refused: overloaded");
            Err(ApiError::overloaded(
                message,
                core.config().overload_retry_after_ms,
            ))
        }
        Reply::Busy { staged } => Err(ApiError::new(
            ErrorCode::NotReady,
            format!(
                "the outcome archiver is behind ({staged} ended outcomes not yet in the index); \
                 nothing was started, retry with the same id shortly"
            ),
        )),
        Reply::IndexUnavailable { error } => Err(ApiError::new(
            ErrorCode::NotReady,
            format!(
                "the outcome index cannot be read ({error}), so whether this id already has an \
                 outcome is unknown; nothing was started, retry with the same id"
            ),
        )),
        // `Core::submit` looks again on this one; it never reaches here.
        Reply::LookAgain => Err(ApiError::new(
            ErrorCode::Internal,
            "the outcome lookup raced with the archiver; retry with the same id",
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
    let status = core.status(&txid).map_err(index_unavailable)?;
    status.map(Json).ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            format!(
                "no transaction {txid} (never seen, or ended longer ago than the retention window)"
            ),
        )
    })
}

fn index_unavailable(e: crate::outcomes::OutcomeError) -> ApiError {
    ApiError::new(
        ErrorCode::NotReady,
        format!("the outcome index cannot be read: {e}"),
    )
}

/// `GET /v1/transactions?state=...&limit=...&after=...`.
pub async fn list(
    State(state): State<AppState>,
    query: QueryPairs,
) -> Result<Json<TransactionList>, ApiError> {
    let core = state.core()?;
    let mut wanted = None;
    let mut limit = LIST_LIMIT_DEFAULT;
    let mut after = None;
    for (key, value) in query_pairs(query)? {
        match key.as_str() {
            "after" => after = Some(cursor(&value)?),
            "state" => {
                wanted = Some(
                    value
                        .parse::<TransactionState>()
                        .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e))?,
                )
            }
            "limit" => limit = list_limit(&value)?,
            other => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!("unknown query parameter {other:?}; expected state, limit or after"),
                ));
            }
        }
    }
    let (transactions, next) = core.list(wanted, limit, after).map_err(index_unavailable)?;
    Ok(Json(TransactionList {
        transactions,
        next: next.map(|c| c.to_string()),
    }))
}

/// The `after` cursor of a listing: two numbers of at most 19 digits joined by `-`, as the
/// server makes them (`{ended_at_ms}-{seq}`) and as the OpenAPI document's pattern says.
fn cursor(value: &str) -> Result<crate::outcomes::Cursor, ApiError> {
    let part_ok = |part: &str| (1..=19).contains(&part.len()) && whole_number(part).is_some();
    match value.split_once('-') {
        Some((at, seq)) if part_ok(at) && part_ok(seq) => value
            .parse::<crate::outcomes::Cursor>()
            .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, e)),
        _ => Err(ApiError::new(
            ErrorCode::InvalidQuery,
            format!("after={value:?}: expected the \"next\" value of a previous page"),
        )),
    }
}

/// `GET /v1/transactions/{id}/decision?gtid=..&incarnation=..&epoch=..&position=..`: what a
/// participant in doubt about one attempt of `id` is told. Answered from the table without
/// writing anything; `unknown` where the log cannot prove the outcome.
///
/// A caller that is not an authenticated peer gets a budget of answers about attempts this
/// coordinator has no record of (`query_limit`); past it, 429 `rate_limited`. Nothing is
/// written for such a query whatever the answer (the reason presumed abort needs no record).
pub async fn decision(
    State(state): State<AppState>,
    extensions: axum::http::Extensions,
    path: Result<Path<String>, PathRejection>,
    query: QueryPairs,
) -> Result<Json<DecisionQueryResponse>, ApiError> {
    let core = state.core()?;
    let txid = txid(path)?;
    let query = decision_query(query_pairs(query)?)?;
    let caller = caller_address(&extensions);
    let answer = core.decision_query(&txid, query.as_ref());
    // Known attempts are never charged nor refused: a participant catching up after an
    // outage asks about many, and each answer is what it needs.
    let charged = !core.peers_authenticate() && !answered_from_a_record(&answer);
    if charged
        && !state
            .decision_limiter()
            .charge(caller, crate::runtime::now_ms())
    {
        return Err(rate_limited(&state, caller));
    }
    Ok(Json(answer))
}

/// The address a request came from; one shared bucket when the server did not record it.
fn caller_address(extensions: &axum::http::Extensions) -> std::net::IpAddr {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |info| info.0.ip())
}

/// A recorded commit or abort, or a pending attempt: an answer about an attempt this
/// coordinator knows. Presumed aborts and unknowns come with a reason.
fn answered_from_a_record(answer: &DecisionQueryResponse) -> bool {
    use protocol::DecisionStatus;
    match answer.decision {
        DecisionStatus::Commit | DecisionStatus::Abort => answer.reason.is_none(),
        DecisionStatus::Pending => true,
        DecisionStatus::Unknown => false,
    }
}

fn rate_limited(state: &AppState, caller: std::net::IpAddr) -> ApiError {
    state
        .metrics
        .decision_queries_rate_limited
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let retry_after_s = state.decision_limiter().retry_after_s(caller);
    ApiError {
        retry_after_s: Some(retry_after_s),
        ..ApiError::new(
            ErrorCode::RateLimited,
            format!(
                "too many decision queries from {caller} about attempts this coordinator has no \
                 record of; retry in {retry_after_s} s, or authenticate as a peer \
                 (docs/security.md)"
            ),
        )
    }
}

/// The attempt a decision query names: all four parameters, or none (a legacy query, answered
/// `unknown`).
fn decision_query(pairs: Vec<(String, String)>) -> Result<Option<DecisionQuery>, ApiError> {
    let bad = |key: &str, value: &str, why: String| {
        ApiError::new(ErrorCode::InvalidQuery, format!("{key}={value:?}: {why}"))
    };
    let (mut gtid, mut incarnation, mut epoch, mut position) = (None, None, None, None);
    for (key, value) in pairs {
        match key.as_str() {
            "gtid" => {
                gtid = Some(
                    GlobalTxId::new(value.as_str())
                        .map_err(|e| bad(&key, &value, e.to_string()))?,
                )
            }
            "incarnation" => {
                incarnation = Some(
                    value
                        .parse::<Incarnation>()
                        .map_err(|e| bad(&key, &value, e.to_string()))?,
                )
            }
            "epoch" => {
                epoch = Some(Epoch(whole_number(&value).ok_or_else(|| {
                    bad(&key, &value, "expected a whole number".to_string())
                })?))
            }
            "position" => {
                position = Some(
                    whole_number(&value)
                        .ok_or_else(|| bad(&key, &value, "expected a whole number".to_string()))?,
                )
            }
            other => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!(
                        "unknown query parameter {other:?}; expected gtid, incarnation, epoch \
                         and position"
                    ),
                ));
            }
        }
    }
    match (gtid, incarnation, epoch, position) {
        (Some(gtid), Some(incarnation), Some(epoch), Some(position)) => Ok(Some(DecisionQuery {
            gtid,
            incarnation,
            epoch,
            position,
        })),
        (None, None, None, None) => Ok(None),
        _ => Err(ApiError::new(
            ErrorCode::InvalidQuery,
            "a decision query names the attempt with all of gtid, incarnation, epoch and \
             position (from the prepare), or none of them",
        )),
    }
}

/// The id of a transaction the client did not name: `tx-` and 128 bits from the operating
/// system's generator, as 32 hex digits. It is the idempotency key: whoever submits under an id
/// first owns its answer. 64 bits from a fast, non-cryptographic generator (as before) could be
/// predicted from ids already handed out, so another client could submit under the next one
/// first and have its outcome reported to the client that id was meant for; and among a
/// billion transactions two would likely collide.
fn generated_txid() -> Result<TxId, ApiError> {
    use ring::rand::SecureRandom;
    let mut bits = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bits)
        .map_err(|_| {
            ApiError::new(
                ErrorCode::Internal,
                "the operating system's random generator failed; name the transaction (\"id\")",
            )
        })?;
    TxId::new(format!("tx-{:032x}", u128::from_be_bytes(bits)))
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
}

#[cfg(test)]
mod generated_ids {
    use super::generated_txid;

    #[test]
    fn a_generated_id_is_tx_and_32_hex_digits_and_never_repeats() {
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| generated_txid().map(|id| id.as_str().to_string()))
            .collect::<Result<_, _>>()
            .expect("the OS generator works here");
        assert_eq!(ids.len(), 1000, "1000 generated ids, all different");
        for id in &ids {
            let digits = id.strip_prefix("tx-").expect("tx- prefix");
            assert_eq!(digits.len(), 32, "{id}");
            assert!(digits.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        }
    }
}
