//! The operator routes: resolve an attempt in doubt, retry deliveries now, the audit trail.
//! Each action is judged and logged by the runtime (`runtime::operator`); this maps HTTP.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use protocol::auth::Caller;
use protocol::limits::BODY_BYTES_MAX;
use protocol::operator::{
    AuditList, ClearBehindRequest, ResolveRequest, RetryRequest, SagaResolveRequest,
};
use protocol::{ErrorCode, GlobalTxId, ParticipantName};

use super::transactions::{QueryPairs, is_json, list_limit, query_pairs, txid, whole_number};
use crate::api::{ApiError, AppState, json_body};
use crate::runtime::{OperatorError, RetryTarget, check_operator};

fn operator_error(error: OperatorError) -> Response {
    match error {
        OperatorError::Refused(body) => {
            let status = StatusCode::from_u16(body.error.status()).unwrap_or(StatusCode::CONFLICT);
            (status, Json(*body)).into_response()
        }
        OperatorError::Rejected { code, message } => ApiError::new(code, message).into_response(),
        OperatorError::LogFailed(e) => ApiError::new(
            ErrorCode::LogFailed,
            format!("the audit record could not be made durable ({e}); nothing was done"),
        )
        .into_response(),
    }
}

/// The operator's name from the token file, when a token authenticated the request: it wins
/// over the body's `operator` field, which is only a claim.
fn token_operator(caller: &Option<Extension<Caller>>) -> Option<String> {
    crate::api::auth::caller_name(caller)
}

/// Checks the body's `operator` and `reason` as given (an absent one is fine), by the audit
/// trail's rule, before the token's name replaces `operator`: the OpenAPI document states one
/// rule for the body, whoever sends it, so the server keeps it even when it ignores the claim.
fn check_claim(operator: Option<&str>, reason: Option<&str>) -> Result<(), ApiError> {
    const ABSENT: &str = "-";
    check_operator(operator.unwrap_or(ABSENT), reason.unwrap_or(ABSENT)).map_err(|e| match e {
        OperatorError::Rejected { code, message } => ApiError::new(code, message),
        other => ApiError::new(ErrorCode::Internal, other.to_string()),
    })
}

/// Answers an operator action: the request's parts, checked first (their error answers at
/// once), then the action; a refusal answers with the evidence it was judged on.
async fn act<P, T, Fut>(prepared: Result<P, ApiError>, action: impl FnOnce(P) -> Fut) -> Response
where
    Fut: std::future::Future<Output = Result<T, OperatorError>>,
    T: serde::Serialize,
{
    let parts = match prepared {
        Ok(parts) => parts,
        Err(e) => return e.into_response(),
    };
    match action(parts).await {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => operator_error(e),
    }
}

/// A JSON body; `empty_ok` lets an empty body stand for the type's default.
fn body_of<T: DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    empty_ok: bool,
) -> Result<T, ApiError> {
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
    if body.is_empty() && empty_ok {
        return Ok(T::default());
    }
    if !is_json(headers) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "send the body as Content-Type: application/json",
        ));
    }
    json_body::decode(&body, &[])
        .map_err(|e| ApiError::new(ErrorCode::MalformedJson, format!("malformed body: {e}")))
}

/// The resolve body has no sensible default; this wrapper makes an empty body an error.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(transparent)]
struct ResolveBody(Option<ResolveRequest>);

/// `POST /v1/transactions/{id}/resolve`.
pub async fn resolve(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let core = state.core()?;
        let txid = txid(path)?;
        let ResolveBody(request) = body_of(&headers, body, false)?;
        let mut request = request.ok_or_else(|| {
            ApiError::new(
                ErrorCode::MalformedJson,
                "expected {\"decision\",\"operator\",\"reason\"}",
            )
        })?;
        check_claim(Some(&request.operator), Some(&request.reason))?;
        if let Some(name) = token_operator(&caller) {
            request.operator = name;
        }
        Ok::<_, ApiError>((core.clone(), txid, request))
    }
    .await;
    act(result, |(core, txid, request)| async move {
        core.resolve(txid, request).await
    })
    .await
}

/// `POST /v1/transactions/{id}/retry`.
pub async fn retry_transaction(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let core = state.core()?.clone();
        let txid = txid(path)?;
        let mut request: RetryRequest = body_of(&headers, body, true)?;
        check_claim(request.operator.as_deref(), request.reason.as_deref())?;
        if let Some(name) = token_operator(&caller) {
            request.operator = Some(name);
        }
        Ok::<_, ApiError>((core, RetryTarget::Transaction(txid), request))
    })();
    retry(prepared).await
}

/// `POST /v1/participants/{name}/retry`.
pub async fn retry_participant(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let core = state.core()?.clone();
        let Path(raw) = path.map_err(|e| ApiError::new(ErrorCode::InvalidId, e.body_text()))?;
        let name = ParticipantName::new(raw)
            .map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()))?;
        let mut request: RetryRequest = body_of(&headers, body, true)?;
        check_claim(request.operator.as_deref(), request.reason.as_deref())?;
        if let Some(name) = token_operator(&caller) {
            request.operator = Some(name);
        }
        Ok::<_, ApiError>((core, RetryTarget::Participant(name), request))
    })();
    retry(prepared).await
}

/// `GET /v1/sagas/{id}/evidence`.
pub async fn saga_evidence(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let prepared = (|| {
        let core = state.core()?.clone();
        Ok::<_, ApiError>((core, txid(path)?))
    })();
    act(prepared, |(core, id)| async move {
        core.saga_evidence(id).await
    })
    .await
}

/// `POST /v1/sagas/{id}/retry`.
pub async fn retry_saga(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let core = state.core()?.clone();
        let id = txid(path)?;
        let mut request: RetryRequest = body_of(&headers, body, true)?;
        check_claim(request.operator.as_deref(), request.reason.as_deref())?;
        if let Some(name) = token_operator(&caller) {
            request.operator = Some(name);
        }
        Ok::<_, ApiError>((core, id, request))
    })();
    act(prepared, |(core, id, request)| async move {
        core.retry_saga(id, request).await
    })
    .await
}

/// The saga hand-resolution body has no sensible default; an empty body is an error.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(transparent)]
struct SagaResolveBody(Option<SagaResolveRequest>);

/// `POST /v1/sagas/{id}/resolve`: a `needs_attention` saga settled by hand.
pub async fn resolve_saga(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let core = state.core()?.clone();
        let id = txid(path)?;
        let SagaResolveBody(request) = body_of(&headers, body, false)?;
        let mut request = request.ok_or_else(|| {
            ApiError::new(
                ErrorCode::MalformedJson,
                "expected {\"operator\",\"reason\"}",
            )
        })?;
        check_claim(Some(&request.operator), Some(&request.reason))?;
        if let Some(name) = token_operator(&caller) {
            request.operator = name;
        }
        Ok::<_, ApiError>((core, id, request))
    })();
    act(prepared, |(core, id, request)| async move {
        core.resolve_saga_by_hand(id, request).await
    })
    .await
}

/// The clear body has no sensible default; an empty body is an error.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(transparent)]
struct ClearBehindBody(Option<ClearBehindRequest>);

/// `POST /v1/log-behind/clear`: an operator clears the "log behind" mark (audited).
pub async fn clear_behind(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let core = state.core()?.clone();
        let ClearBehindBody(request) = body_of(&headers, body, false)?;
        let mut request = request.ok_or_else(|| {
            ApiError::new(
                ErrorCode::MalformedJson,
                "expected {\"operator\",\"reason\"}",
            )
        })?;
        check_claim(Some(&request.operator), Some(&request.reason))?;
        if let Some(name) = token_operator(&caller) {
            request.operator = name;
        }
        Ok::<_, ApiError>((core, request))
    })();
    act(prepared, |(core, request)| async move {
        core.clear_behind(request).await
    })
    .await
}

async fn retry(
    prepared: Result<
        (
            std::sync::Arc<crate::runtime::Core>,
            RetryTarget,
            RetryRequest,
        ),
        ApiError,
    >,
) -> Response {
    act(prepared, |(core, target, request)| async move {
        core.retry(target, request).await
    })
    .await
}

/// `GET /v1/transactions/{id}/evidence[?gtid=..]`: the coordinator's word on the attempt and
/// each participant's, asked now.
pub async fn evidence(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: QueryPairs,
) -> Response {
    let prepared = (|| {
        let core = state.core()?.clone();
        let txid = txid(path)?;
        let mut gtid = None;
        for (key, value) in query_pairs(query)? {
            match key.as_str() {
                "gtid" => {
                    gtid = Some(GlobalTxId::new(value).map_err(|e| {
                        ApiError::new(ErrorCode::InvalidQuery, format!("gtid: {e}"))
                    })?)
                }
                other => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidQuery,
                        format!("unknown query parameter {other:?}; only \"gtid\" is accepted"),
                    ));
                }
            }
        }
        Ok::<_, ApiError>((core, txid, gtid))
    })();
    act(prepared, |(core, txid, gtid)| async move {
        core.evidence(txid, gtid).await
    })
    .await
}

/// Audit entries listed when `limit` is not given.
const AUDIT_LIMIT_DEFAULT: usize = 100;

/// `GET /v1/audit?limit=..&before=..`: newest first; `before` (a `seq`) pages back.
pub async fn audit(
    State(state): State<AppState>,
    query: QueryPairs,
) -> Result<Json<AuditList>, ApiError> {
    let core = state.core()?;
    let mut limit = AUDIT_LIMIT_DEFAULT;
    let mut before = None;
    for (key, value) in query_pairs(query)? {
        match key.as_str() {
            "limit" => limit = list_limit(&value)?,
            "before" => {
                before = Some(whole_number(&value).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidQuery,
                        format!("before={value:?}: expected an audit seq (a number)"),
                    )
                })?)
            }
            other => {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuery,
                    format!(
                        "unknown query parameter {other:?}; \"limit\" and \"before\" are accepted"
                    ),
                ));
            }
        }
    }
    Ok(Json(AuditList {
        audit: core.audit(limit, before),
    }))
}

/// `GET /v1/cluster`: what is stuck or in doubt across the cluster, asked now.
pub async fn cluster(State(state): State<AppState>) -> Response {
    match state.core() {
        Ok(core) => Json(core.cluster().await).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /ui`: the live page (static, embedded; it reads `/v1/cluster` every 2 s and acts through
/// the operator routes, each action behind a confirmation).
pub async fn ui() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("ui.html"),
    )
        .into_response()
}
