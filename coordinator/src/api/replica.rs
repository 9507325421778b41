//! The routes of a coordinator group (`ha`): `/v1/replica/*`, which a follower serves to its
//! leader (peer token), and `/v1/group`, this node's view of the group. A node that runs
//! alone answers them 404 `not_found`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};

use protocol::ErrorCode;

use crate::api::{ApiError, AppState};
use crate::ha::node::GroupNode;
use crate::ha::replica_host::{CopyStatus, Refusal};
use crate::records::Retained;

/// The largest replication message: a base backup carries the whole log directory.
pub const REPLICA_BODY_MAX: usize = 1 << 30;

#[derive(Debug, serde::Deserialize)]
pub struct ReplicaQuery {
    term: u64,
    /// With a base backup: whose log it is.
    coordinator_id: Option<String>,
    #[serde(default)]
    reset: bool,
    now_ms: Option<u64>,
}

fn group(state: &AppState) -> Result<Arc<GroupNode>, ApiError> {
    state.group().cloned().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            "this coordinator runs alone (no --ha): it has no group",
        )
    })
}

/// The query, judged only once this node is known to be in a group (a coordinator that runs
/// alone answers 404 whatever is asked), with our error body for a bad one.
fn query_of(
    state: &AppState,
    query: Result<Query<ReplicaQuery>, QueryRejection>,
) -> Result<ReplicaQuery, ApiError> {
    group(state)?;
    query.map(|Query(q)| q).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidQuery,
            format!("the replication query (term, now_ms, reset, coordinator_id): {e}"),
        )
    })
}

fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::StaleTerm { .. } => ApiError::new(ErrorCode::StaleEpoch, refusal.to_string()),
        other => ApiError::new(ErrorCode::ReplicaRefused, other.to_string()),
    }
}

async fn on_copy(
    state: &AppState,
    work: impl FnOnce(&GroupNode) -> Result<(), Refusal> + Send + 'static,
) -> Result<Json<CopyStatus>, ApiError> {
    let node = group(state)?;
    tokio::task::spawn_blocking(move || {
        work(&node).map_err(refused)?;
        Ok(Json(node.host().status()))
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the copy's task failed: {e}")))?
}

/// `POST /v1/replica/backup?term=N`: the leader's base backup of its log directory.
pub async fn backup(
    State(state): State<AppState>,
    query: Result<Query<ReplicaQuery>, QueryRejection>,
    body: Bytes,
) -> Result<Json<CopyStatus>, ApiError> {
    let query = query_of(&state, query)?;
    on_copy(&state, move |node| {
        node.host()
            .install(query.term, query.coordinator_id.as_deref(), &body)
    })
    .await
}

/// `POST /v1/replica/ops?term=N`: one sync point's file operations.
pub async fn ops(
    State(state): State<AppState>,
    query: Result<Query<ReplicaQuery>, QueryRejection>,
    body: Bytes,
) -> Result<Json<CopyStatus>, ApiError> {
    let query = query_of(&state, query)?;
    on_copy(&state, move |node| node.host().apply(query.term, &body)).await
}

/// `POST /v1/replica/outcomes?term=N&now_ms=T[&reset=true]`: ended outcomes for the index.
pub async fn outcomes(
    State(state): State<AppState>,
    query: Result<Query<ReplicaQuery>, QueryRejection>,
    body: Bytes,
) -> Result<Json<CopyStatus>, ApiError> {
    let query = query_of(&state, query)?;
    let batch: Vec<Retained> = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("the outcome batch does not decode: {e}"),
        )
    })?;
    let now_ms = query.now_ms.unwrap_or_else(crate::clock::now_ms);
    on_copy(&state, move |node| {
        node.host().archive(query.term, query.reset, &batch, now_ms)
    })
    .await
}

/// `GET /v1/group`: this node's role, the leader it knows, its copy, and (on the leader) the
/// followers attached and whether they count in the sync set.
pub async fn view(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let node = group(&state)?;
    let followers: Vec<serde_json::Value> = node
        .mirror()
        .map(|mirror| {
            mirror
                .followers()
                .into_iter()
                .map(|(name, streaming, in_sync)| {
                    serde_json::json!({"node": name, "streaming": streaming, "in_sync": in_sync})
                })
                .collect()
        })
        .unwrap_or_default();
    let (group_state, _) = node
        .group()
        .state()
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("etcd: {e}")))?;
    Ok(Json(serde_json::json!({
        "node": node.settings().node,
        "url": node.settings().advertise,
        "role": node.role(),
        "copy": node.host().status(),
        "state": group_state,
        "followers": followers,
        "epoch": state.core().ok().map(|core| core.epoch().0),
    })))
}
