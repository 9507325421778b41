//! The reference participant's own routes (`GET /v1/kv/{key}`, and `PUT /v1/kv/{key}`: a
//! fenced, idempotent write outside 2PC) and its whole app.

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use protocol::kv::KvEntry;
use protocol::lease::{FencedPutRequest, FencedPutResponse};
use protocol::{ErrorCode, routes};

use crate::api_error::{ApiError, json_body, path_param};
use crate::fence::{FencedAnswer, FencedWrite};
use crate::http::finish;
use crate::kv::KvStore;
use crate::service::Participant;

/// Every route of `twopc participant`: the library's plus the committed-read API.
pub fn app(participant: &Participant<KvStore>) -> Router {
    let reads = Router::new()
        .route(routes::KV_KEY, get(read).put(fenced_put))
        .with_state(participant.clone());
    let config = participant.config();
    let reads = crate::auth::protect(reads, config.keys.clone(), config.loopback_listen);
    finish(participant.router().merge(reads))
}

/// The committed value and version; prepared writes are never visible here.
async fn read(
    State(participant): State<Participant<KvStore>>,
    key: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<KvEntry>, ApiError> {
    let key = path_param(key)?;
    participant
        .read(|store| store.get(&key))
        .map(axum::Json)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no key {key:?}")))
}

/// `PUT /v1/kv/{key}` `{"value", "fence": {"resource", "token"}, "op_id"}`: 200
/// `{"key", "version", "token"}`, 409 `stale_token` with `highest`, 409 `key_locked` while a
/// prepared transaction holds the key; a repeated `op_id` answers its first answer.
async fn fenced_put(
    State(participant): State<Participant<KvStore>>,
    key: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<FencedPutResponse>, Response> {
    let key = path_param(key).map_err(IntoResponse::into_response)?;
    let request: FencedPutRequest =
        json_body(&headers, body).map_err(IntoResponse::into_response)?;
    let write = FencedWrite {
        op_id: request.op_id,
        fence: request.fence,
        payload: serde_json::json!({"ops": [{"op": "put", "key": key, "value": request.value}]}),
    };
    write
        .check_ids()
        .map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()).into_response())?;
    match participant.fenced_write(write).await {
        Ok(FencedAnswer::Applied { token, receipt }) => Ok(axum::Json(FencedPutResponse {
            key: receipt["key"].as_str().unwrap_or(&key).to_string(),
            version: receipt["version"].as_u64().unwrap_or(0),
            token,
        })),
        Ok(FencedAnswer::Stale(stale)) => Err(stale.into_response()),
        Err(error) => Err(ApiError::from(error).into_response()),
    }
}
