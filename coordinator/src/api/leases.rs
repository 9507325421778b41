//! The lease routes (docs/leases.md): acquire, renew, release, read one, list. Inputs are
//! checked here; the rules are the lease engine's; every grant and renewal is durable before
//! it is answered.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use protocol::ErrorCode;
use protocol::lease::{
    AcquireRequest, LEASE_TTL_MS_DEFAULT, LEASE_TTL_MS_MAX, Lease, LeaseHeldBody, LeaseList,
    RenewRequest, check_lease_id,
};
use protocol::limits::BODY_BYTES_MAX;

use crate::api::transactions::{is_json, whole_number};
use crate::api::{ApiError, AppState, json_body};
use crate::leases::{LeaseEvent, LeaseReply};
use crate::runtime::Core;

type Answer<T> = Result<Json<T>, Refusal>;

/// An error answer: the usual body, or `lease_held` with who holds the lease.
#[derive(Debug)]
pub enum Refusal {
    Api(ApiError),
    Held(LeaseHeldBody),
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Refusal {
        Refusal::Api(e)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Api(e) => e.into_response(),
            Refusal::Held(body) => (StatusCode::CONFLICT, Json(body)).into_response(),
        }
    }
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal::Api(ApiError::new(code, message))
}

fn ready(state: &AppState) -> Result<&std::sync::Arc<Core>, Refusal> {
    let core = state.core()?;
    if core.is_poisoned() {
        return Err(ApiError::log_failed().into());
    }
    Ok(core)
}

fn checked(kind: &'static str, value: &str) -> Result<(), Refusal> {
    check_lease_id(kind, value).map_err(|e| refuse(ErrorCode::InvalidId, e.to_string()))
}

fn lease_name(path: Result<Path<String>, PathRejection>) -> Result<String, Refusal> {
    let Path(name) = path.map_err(|e| refuse(ErrorCode::InvalidId, e.body_text()))?;
    checked("lease name", &name)?;
    Ok(name)
}

fn request_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    what: &str,
) -> Result<T, Refusal> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            refuse(
                ErrorCode::BodyTooLarge,
                format!("the body is over the limit of {BODY_BYTES_MAX} bytes"),
            )
        } else {
            refuse(ErrorCode::MalformedJson, e.body_text())
        }
    })?;
    if !is_json(headers) {
        return Err(refuse(
            ErrorCode::UnsupportedMediaType,
            "send the body as Content-Type: application/json",
        ));
    }
    json_body::decode(&body, &[]).map_err(|e| {
        refuse(
            ErrorCode::MalformedJson,
            format!("the body is not {what}: {e}"),
        )
    })
}

async fn step(core: &Core, make: impl FnOnce(u64) -> LeaseEvent) -> Result<LeaseReply, Refusal> {
    core.lease_step(make).await.map_err(|e| {
        tracing::error!(error = %e, "LOG FAILED: a lease record could not be made durable");
        Refusal::from(ApiError::log_failed())
    })
}

/// The answer to the holder itself (acquire, renew): with a fence key, the grant's proof, so
/// the holder's fenced writes can show participants that the lease service handed this token
/// to it. Reads never carry it: a proof is the holder's to use.
fn granted(core: &Core, name: &str, reply: LeaseReply) -> Answer<Lease> {
    match reply {
        LeaseReply::Granted(mut lease) => {
            if let Some(keys) = &core.config().fence_key.keys {
                lease.proof = Some(keys.sign(&lease.name, lease.token, &lease.holder));
            }
            Ok(Json(lease))
        }
        LeaseReply::Held {
            holder,
            expires_in_ms,
        } => Err(Refusal::Held(LeaseHeldBody {
            error: ErrorCode::LeaseHeld,
            message: format!("lease {name:?} is held by {holder:?} for {expires_in_ms} ms more"),
            holder,
            expires_in_ms,
        })),
        LeaseReply::Lost { reason } => Err(refuse(ErrorCode::LeaseLost, reason)),
        LeaseReply::Released(_) => Err(refuse(ErrorCode::Internal, "a grant was released")),
    }
}

/// `POST /v1/leases/{name}` `{"holder","ttl_ms"}`.
pub async fn acquire(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer<Lease> {
    let core = ready(&state)?;
    let name = lease_name(path)?;
    let request: AcquireRequest = request_body(&headers, body, "a lease request")?;
    checked("holder", &request.holder)?;
    let ttl_ms = request.ttl_ms.unwrap_or(LEASE_TTL_MS_DEFAULT);
    if ttl_ms == 0 || ttl_ms > LEASE_TTL_MS_MAX {
        return Err(refuse(
            ErrorCode::InvalidTtl,
            format!("ttl_ms {ttl_ms} is outside 1..={LEASE_TTL_MS_MAX}"),
        ));
    }
    let holder = request.holder;
    let event_name = name.clone();
    let reply = step(core, move |now_ms| LeaseEvent::Acquire {
        name: event_name,
        holder,
        ttl_ms,
        now_ms,
    })
    .await?;
    granted(core, &name, reply)
}

/// `POST /v1/leases/{name}/renew` `{"holder","token"}`.
pub async fn renew(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer<Lease> {
    let core = ready(&state)?;
    let name = lease_name(path)?;
    let request: RenewRequest = request_body(&headers, body, "a renew request")?;
    checked("holder", &request.holder)?;
    let event_name = name.clone();
    let reply = step(core, move |now_ms| LeaseEvent::Renew {
        name: event_name,
        holder: request.holder,
        token: request.token,
        now_ms,
    })
    .await?;
    granted(core, &name, reply)
}

/// `DELETE /v1/leases/{name}?holder=..&token=..` (idempotent).
pub async fn release(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, Refusal> {
    let core = ready(&state)?;
    let name = lease_name(path)?;
    let Query(pairs) = query.map_err(|e| refuse(ErrorCode::InvalidQuery, e.body_text()))?;
    let (mut holder, mut token) = (None, None);
    for (key, value) in pairs {
        match key.as_str() {
            "holder" => holder = Some(value),
            "token" => {
                token = Some(whole_number(&value).ok_or_else(|| {
                    refuse(
                        ErrorCode::InvalidQuery,
                        format!("token={value:?} is not a whole number"),
                    )
                })?)
            }
            other => {
                return Err(refuse(
                    ErrorCode::InvalidQuery,
                    format!("unknown query parameter {other:?}; expected holder and token"),
                ));
            }
        }
    }
    let (Some(holder), Some(token)) = (holder, token) else {
        return Err(refuse(
            ErrorCode::InvalidQuery,
            "a release needs ?holder=...&token=...",
        ));
    };
    checked("holder", &holder)?;
    let reply = step(core, move |now_ms| LeaseEvent::Release {
        name,
        holder,
        token,
        now_ms,
    })
    .await?;
    match reply {
        LeaseReply::Released(released) => Ok(Json(released).into_response()),
        LeaseReply::Lost { reason } => Err(refuse(ErrorCode::LeaseLost, reason)),
        LeaseReply::Granted(_) | LeaseReply::Held { .. } => {
            Err(refuse(ErrorCode::Internal, "a release granted"))
        }
    }
}

/// `GET /v1/leases/{name}`: 404 `not_found` when nobody holds it.
pub async fn get(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Answer<Lease> {
    let core = state.core()?;
    let name = lease_name(path)?;
    core.lease(&name)
        .map(Json)
        .ok_or_else(|| refuse(ErrorCode::NotFound, format!("nobody holds lease {name:?}")))
}

/// `GET /v1/leases`: every lease held now, by name.
pub async fn list(State(state): State<AppState>) -> Answer<LeaseList> {
    let core = state.core()?;
    Ok(Json(LeaseList {
        leases: core.leases(),
    }))
}
