//! The reference participant's own routes (`GET /v1/kv/{key}`; `PUT /v1/kv/{key}`: a fenced,
//! idempotent write outside 2PC; `POST /v1/kv`: ops applied together under an op id,
//! optionally fenced, with the outbox intents they lead to) and its whole app.

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use protocol::kv::KvEntry;
use protocol::lease::{FencedPutRequest, FencedPutResponse};
use protocol::outbox::{WriteRequest, WriteResponse, WrittenKey};
use protocol::{ErrorCode, routes};

use crate::api_error::{ApiError, json_body, path_param};
use crate::fence::{FencedAnswer, FencedWrite};
use crate::http::finish;
use crate::kv::KvStore;
use crate::outbox::Write;
use crate::service::Participant;

/// Every route of `twopc participant`: the library's plus the committed-read API.
pub fn app(participant: &Participant<KvStore>) -> Router {
    let reads = Router::new()
        .route(routes::KV_KEY, get(read).put(fenced_put))
        .route(routes::KV_WRITE, post(write))
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
        Ok(FencedAnswer::Applied { token, receipt, .. }) => Ok(axum::Json(FencedPutResponse {
            key: receipt["key"].as_str().unwrap_or(&key).to_string(),
            version: receipt["version"].as_u64().unwrap_or(0),
            token,
        })),
        Ok(FencedAnswer::Stale(stale)) => Err(stale.into_response()),
        Err(error) => Err(ApiError::from(error).into_response()),
    }
}

/// `POST /v1/kv` (`protocol::outbox::WriteRequest`): 200 `WriteResponse` with every key's new
/// version and the intents' seqs; 409 `condition_failed` (a `check` op), `stale_token`,
/// `key_locked`, `id_conflict` (an `event_id` already recorded), `op_id_conflict`; 422 for bad
/// ids, ops or intents. A repeated `op_id` answers its first answer.
async fn write(
    State(participant): State<Participant<KvStore>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<WriteResponse>, Response> {
    let request: WriteRequest = json_body(&headers, body).map_err(IntoResponse::into_response)?;
    let write = Write {
        op_id: request.op_id,
        fence: request.fence,
        payload: serde_json::json!({"ops": request.ops}),
        next: request.next,
    };
    write
        .check_ids()
        .map_err(|e| ApiError::new(ErrorCode::InvalidId, e.to_string()).into_response())?;
    let (op_id, fenced) = (write.op_id.clone(), write.fence.is_some());
    match participant.write(write).await {
        Ok(FencedAnswer::Applied {
            token,
            receipt,
            intents,
        }) => Ok(axum::Json(WriteResponse {
            op_id,
            token: fenced.then_some(token),
            written: written_keys(&receipt),
            intents,
        })),
        Ok(FencedAnswer::Stale(stale)) => Err(stale.into_response()),
        Err(error) => Err(ApiError::from(error).into_response()),
    }
}

/// The keys a receipt names: a write's list, or a fenced put's one key (an op id first used by
/// `PUT /v1/kv/{key}` and repeated here has the put's receipt).
fn written_keys(receipt: &serde_json::Value) -> Vec<WrittenKey> {
    let one = |entry: &serde_json::Value| {
        entry["key"].as_str().map(|key| WrittenKey {
            key: key.to_string(),
            version: entry["version"].as_u64(),
        })
    };
    match receipt.as_array() {
        Some(entries) => entries.iter().filter_map(one).collect(),
        None => one(receipt).into_iter().collect(),
    }
}
