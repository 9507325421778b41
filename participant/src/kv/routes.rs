//! The reference participant's own routes (`GET /v1/kv/{key}`) and its whole app.

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;
use protocol::kv::KvEntry;
use protocol::{ErrorCode, routes};

use crate::http::{ApiError, finish};
use crate::kv::KvStore;
use crate::service::Participant;

/// Every route of `twopc participant`: the library's plus the committed-read API.
pub fn app(participant: &Participant<KvStore>) -> Router {
    let reads = Router::new()
        .route(routes::KV_KEY, get(read))
        .with_state(participant.clone());
    finish(participant.router().merge(reads))
}

/// The committed value and version; prepared writes are never visible here.
async fn read(
    State(participant): State<Participant<KvStore>>,
    Path(key): Path<String>,
) -> Result<axum::Json<KvEntry>, ApiError> {
    participant
        .read(|store| store.get(&key))
        .map(axum::Json)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no key {key:?}")))
}
