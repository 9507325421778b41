//! The participant's HTTP surface: the protocol routes (`/2pc/prepare`, `/2pc/commit`,
//! `/2pc/abort`, and batched: `crate::batch_http`), the saga ops, `/v1/prepared`, `/v1/attempts`,
//! the fence routes, the outbox's (`crate::outbox_http`), `/healthz`,
//! `/readyz` and `/metrics`, behind the guard of `crate::auth`. The error body every failure
//! uses is `crate::api_error`'s (re-exported here).

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use protocol::kv::PreparedList;
use protocol::limits::{BATCH_BODY_BYTES_MAX, BODY_BYTES_MAX};
use protocol::operator::AttemptStatus;
use protocol::saga::{OpKind, OpQuery, OpStatusResponse, SagaOpAnswer, SagaOpRequest};
use protocol::{AckResponse, DecisionRequest, ErrorCode, GlobalTxId, PrepareRequest, Vote, routes};

pub use crate::api_error::{ApiError, json_body, path_param};
use crate::engine::saga::OpQueryRefused;
use crate::metrics::{FenceNumbers, Gauges, OutboxNumbers};
use crate::resource::Resource;
use crate::saga_service::{OpQueryError, SagaOpError};
use crate::service::Participant;

impl<R: Resource> Participant<R> {
    /// The routes every participant serves: the protocol, `/v1/prepared`, health, readiness
    /// and metrics. Merge a service's own routes into it, then pass it through [`finish`].
    pub fn router(&self) -> Router {
        let routes = Router::new()
            .route(routes::PREPARE, post(prepare::<R>))
            .route(routes::COMMIT, post(commit::<R>))
            .route(routes::ABORT, post(abort::<R>))
            .route(routes::CAPABILITIES, get(crate::batch_http::capabilities))
            .route(
                routes::BATCH_PREPARE,
                post(crate::batch_http::batch_prepare::<R>)
                    .layer(DefaultBodyLimit::max(BATCH_BODY_BYTES_MAX)),
            )
            .route(
                routes::BATCH_DECIDE,
                post(crate::batch_http::batch_decide::<R>)
                    .layer(DefaultBodyLimit::max(BATCH_BODY_BYTES_MAX)),
            )
            .route(routes::PREPARED, get(prepared::<R>))
            .route(routes::ATTEMPT, get(attempt::<R>))
            .route(routes::SAGA_ACTION, post(saga_action::<R>))
            .route(routes::SAGA_COMPENSATE, post(saga_compensate::<R>))
            .route(routes::SAGA_OP, get(saga_op_status::<R>))
            .route(routes::FENCE, get(crate::fence_http::status::<R>))
            .route(routes::FENCE_RESET, post(crate::fence_http::reset::<R>))
            .route(routes::OUTBOX, get(crate::outbox_http::list::<R>))
            .route(routes::OUTBOX_INTENT, get(crate::outbox_http::entry::<R>))
            .route(
                routes::OUTBOX_DELIVERED,
                post(crate::outbox_http::delivered::<R>),
            )
            .route(
                routes::OUTBOX_ATTEMPT,
                post(crate::outbox_http::attempt::<R>),
            )
            .route(routes::OUTBOX_RETRY, post(crate::outbox_http::retry::<R>))
            .route(routes::OUTBOX_MARK, post(crate::outbox_http::mark::<R>))
            .route(routes::HEALTHZ, get(healthz))
            .route(routes::READYZ, get(readyz::<R>))
            .route(routes::METRICS, get(metrics::<R>))
            .with_state(self.clone());
        crate::auth::protect(
            routes,
            self.config().keys.clone(),
            self.config().loopback_listen,
        )
    }

    /// The `/metrics` text of this participant.
    pub fn metrics_text(&self) -> String {
        let now_ms = crate::service::now_ms();
        let gauges = self.with_engine(|engine| {
            let fences = engine.fences();
            let outbox = engine.outbox();
            let (pending, failed, oldest) = outbox.open_numbers();
            let counts = outbox.counts();
            let pruned = fences.pruned();
            Gauges {
                prepared: engine.prepared_len(),
                locks: engine.locks_len(),
                tombstones: engine.tombstones_len(),
                lock_waiters: engine.waiting_len(),
                oldest_prepared_age_ms: engine
                    .oldest_prepared_at_ms()
                    .map_or(0, |at| now_ms.saturating_sub(at)),
                fences: FenceNumbers {
                    entries: fences.len(),
                    floor: fences.floor(),
                    pruned_highest_tokens: pruned.highest,
                    pruned_op_answers: pruned.answers,
                    resets: fences.resets().len(),
                },
                outbox: OutboxNumbers {
                    written: counts.written,
                    delivered: counts.delivered,
                    attempts_failed: counts.attempts_failed,
                    pending,
                    failed,
                    oldest_pending_age_ms: oldest.map_or(0, |at| now_ms.saturating_sub(at)),
                },
                ..Gauges::default()
            }
        });
        let gauges = Gauges {
            log_failed: self.is_failed(),
            wal: self.wal().stats(),
            ..gauges
        };
        self.metrics().render(&gauges)
    }
}

/// Adds what every service answers the same way: 404 `unknown_route`, 405
/// `method_not_allowed`, and the body limit (413 `body_too_large`).
pub fn finish(router: Router) -> Router {
    router
        .fallback(|| async { ApiError::new(ErrorCode::UnknownRoute, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "this route does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
}

async fn prepare<R: Resource>(
    State(participant): State<Participant<R>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Vote>, ApiError> {
    let request: PrepareRequest = json_body(&headers, body)?;
    Ok(axum::Json(participant.prepare(request).await?))
}

async fn commit<R: Resource>(
    State(participant): State<Participant<R>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<AckResponse>, ApiError> {
    let request: DecisionRequest = json_body(&headers, body)?;
    participant.commit(request).await?;
    Ok(axum::Json(AckResponse { ack: true }))
}

async fn abort<R: Resource>(
    State(participant): State<Participant<R>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<AckResponse>, ApiError> {
    let request: DecisionRequest = json_body(&headers, body)?;
    participant.abort(request).await?;
    Ok(axum::Json(AckResponse { ack: true }))
}

async fn saga_action<R: Resource>(
    State(participant): State<Participant<R>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<SagaOpAnswer>, ApiError> {
    saga_op(participant, OpKind::Action, headers, body).await
}

async fn saga_compensate<R: Resource>(
    State(participant): State<Participant<R>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<SagaOpAnswer>, ApiError> {
    saga_op(participant, OpKind::Compensation, headers, body).await
}

/// A busy answer is 503 `not_ready` (the coordinator counts it as unknown and asks again).
async fn saga_op<R: Resource>(
    participant: Participant<R>,
    kind: OpKind,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<SagaOpAnswer>, ApiError> {
    let request: SagaOpRequest = json_body(&headers, body)?;
    match participant.saga_op(kind, request).await {
        Ok(answer) => Ok(axum::Json(answer)),
        Err(SagaOpError::Busy(why)) => Err(ApiError::new(ErrorCode::NotReady, why)),
        Err(SagaOpError::OpIdConflict(why)) => Err(ApiError::new(ErrorCode::OpIdConflict, why)),
        Err(SagaOpError::Request(e)) => Err(e.into()),
    }
}

/// `?coordinator_id=..&payload_digest=..` (both optional: `protocol::saga::OpQuery`); an
/// unknown parameter or a bad value is 400 `invalid_query`.
async fn saga_op_status<R: Resource>(
    State(participant): State<Participant<R>>,
    op_id: Result<Path<String>, PathRejection>,
    query: Result<Query<OpQuery>, QueryRejection>,
) -> Result<axum::Json<OpStatusResponse>, ApiError> {
    let op_id = path_param(op_id)?;
    let Query(query) =
        query.map_err(|rejection| ApiError::new(ErrorCode::InvalidQuery, rejection.body_text()))?;
    match participant.saga_op_status(&op_id, &query).await {
        Ok(status) => Ok(axum::Json(status)),
        Err(OpQueryError::Refused(refused)) => Err(refused.into()),
        Err(OpQueryError::Request(e)) => Err(e.into()),
    }
}

/// 422 `coordinator_id_required` or 409 `op_id_conflict`.
impl From<OpQueryRefused> for ApiError {
    fn from(refused: OpQueryRefused) -> Self {
        let code = match refused {
            OpQueryRefused::CoordinatorIdRequired { .. } => ErrorCode::CoordinatorIdRequired,
            OpQueryRefused::Conflict { .. } => ErrorCode::OpIdConflict,
        };
        ApiError::new(code, refused.to_string())
    }
}

async fn prepared<R: Resource>(
    State(participant): State<Participant<R>>,
) -> axum::Json<PreparedList> {
    axum::Json(PreparedList {
        prepared: participant.prepared_list(),
    })
}

/// What this participant holds of one attempt: operators' evidence for a resolve.
async fn attempt<R: Resource>(
    State(participant): State<Participant<R>>,
    gtid: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<AttemptStatus>, ApiError> {
    let gtid = GlobalTxId::new(path_param(gtid)?)
        .map_err(|e| ApiError::new(ErrorCode::InvalidId, format!("gtid: {e}")))?;
    Ok(axum::Json(
        participant.with_engine(|engine| engine.attempt_status(&gtid)),
    ))
}

async fn healthz() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"status": "ok"}))
}

async fn readyz<R: Resource>(
    State(participant): State<Participant<R>>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    if participant.is_failed() {
        return Err(ApiError::new(
            ErrorCode::LogFailed,
            "the log failed; this participant takes no more writes",
        ));
    }
    Ok(axum::Json(serde_json::json!({"status": "ready"})))
}

async fn metrics<R: Resource>(State(participant): State<Participant<R>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, net::exposition::CONTENT_TYPE)],
        participant.metrics_text(),
    )
}
