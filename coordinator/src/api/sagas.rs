//! The saga routes (issue 13): create (idempotent by id), status, and the operators' listing
//! (stuck sagas first, with their age).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use protocol::auth::Caller;
use protocol::limits::BODY_BYTES_MAX;
use protocol::saga::{SagaList, SagaRequest, SagaState};
use protocol::{ErrorCode, digest::Fnv128};

use crate::api::transactions::{
    LIST_LIMIT_DEFAULT, QueryPairs, is_json, list_limit, query_pairs, txid,
};
use crate::api::{ApiError, AppState, json_body};
use crate::digest::Digest;
use crate::saga::engine::{SagaReply, SagaWait};

/// The idempotency digest: the whole request as compact JSON (object keys sorted).
fn digest_of(request: &SagaRequest) -> Digest {
    Digest(
        Fnv128::default()
            .field(b"saga")
            .field(&serde_json::to_vec(request).unwrap_or_default())
            .finish(),
    )
}

/// `POST /v1/sagas[?wait=none]`.
pub async fn create(
    State(state): State<AppState>,
    query: QueryPairs,
    headers: HeaderMap,
    caller: Option<Extension<Caller>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let client = crate::api::auth::caller_name(&caller);
    let core = state.core()?;
    if core.is_poisoned() {
        return Err(ApiError::log_failed());
    }
    if let Some(evidence) = core.log_behind() {
        return Err(ApiError::log_behind(&evidence));
    }
    let mut wait = SagaWait::Terminal;
    for (key, value) in query_pairs(query)? {
        match (key.as_str(), value.as_str()) {
            ("wait", "none") => wait = SagaWait::Accepted,
            ("wait", "terminal") => wait = SagaWait::Terminal,
            ("wait", other) => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!("wait={other:?}: expected \"none\" or \"terminal\""),
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
    let request: SagaRequest = json_body::decode(&body, &["steps"]).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("the body is not a saga request: {e}"),
        )
    })?;
    request
        .validate()
        .map_err(|e| ApiError::new(e.code, e.message))?;
    if let Some(step) = request
        .steps
        .iter()
        .find(|s| !core.knows_participant(&s.participant))
    {
        return Err(ApiError::new(
            ErrorCode::UnknownParticipant,
            format!(
                "step {:?}: participant \"{}\" is not in this coordinator's configuration",
                step.name, step.participant
            ),
        ));
    }
    let digest = digest_of(&request);
    let outcome = core
        .submit_saga(request, digest, wait, client)
        .await
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotReady,
                "the coordinator is shutting down; the saga resumes at the next start, ask \
                 again with the same id",
            )
        })?;
    match outcome {
        Ok(SagaReply::Saga(view)) => Ok((StatusCode::OK, Json(view)).into_response()),
        Ok(SagaReply::Accepted(view)) => Ok((StatusCode::ACCEPTED, Json(view)).into_response()),
        Ok(SagaReply::Conflict(id)) => Err(ApiError::new(
            ErrorCode::IdConflict,
            format!("saga {id} exists with a different request body"),
        )),
        Err(error) => Err(ApiError::new(
            ErrorCode::LogFailed,
            format!("the saga's record could not be logged ({error})"),
        )),
    }
}

/// `GET /v1/sagas/{id}`.
pub async fn status(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let core = state.core()?;
    let id = txid(path)?;
    match core.saga_status(&id) {
        Some(view) => Ok(Json(view).into_response()),
        None => Err(ApiError::new(ErrorCode::NotFound, format!("no saga {id}"))),
    }
}

/// `GET /v1/sagas?state=...&limit=...`.
pub async fn list(
    State(state): State<AppState>,
    query: QueryPairs,
) -> Result<Json<SagaList>, ApiError> {
    let core = state.core()?;
    let mut wanted = None;
    let mut limit = LIST_LIMIT_DEFAULT;
    for (key, value) in query_pairs(query)? {
        match key.as_str() {
            "state" => {
                wanted = Some(SagaState::parse(&value).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidQuery,
                        format!(
                            "state={value:?}: expected running, compensating, completed, \
                             compensated or needs_attention"
                        ),
                    )
                })?)
            }
            "limit" => limit = list_limit(&value)?,
            other => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!("unknown query parameter {other:?}; expected state or limit"),
                ));
            }
        }
    }
    Ok(Json(SagaList {
        sagas: core.list_sagas(wanted, limit),
    }))
}
