//! The HTTP API (design 3.1): transactions for clients, the decision for participants in
//! doubt, and health, readiness and metrics for operators.

pub mod auth;
mod cross_site;
mod error;
mod json_body;
mod leases;
mod operator;
mod replica;
mod sagas;
mod transactions;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_abuse;
#[cfg(test)]
mod tests_auth;
#[cfg(test)]
mod tests_contract;
#[cfg(test)]
mod tests_cross_site;
#[cfg(test)]
mod tests_leases;
#[cfg(test)]
mod tests_openapi;
#[cfg(test)]
mod tests_saga_keys;
#[cfg(test)]
mod tests_saga_operator;
#[cfg(test)]
mod tests_sagas;

use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use protocol::auth::KeyRing;
use protocol::limits::BODY_BYTES_MAX;
use protocol::{ErrorCode, routes};

use crate::metrics::{Metrics, Sampled};
use crate::runtime::Core;

pub use crate::query_limit::{QueryLimit, QueryLimiter};
pub use error::ApiError;

/// Every (method, path) the API serves; the OpenAPI document must list exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("post", routes::TRANSACTIONS),
    ("get", routes::TRANSACTIONS),
    ("get", routes::TRANSACTION),
    ("get", routes::TRANSACTION_DECISION),
    ("get", routes::TRANSACTION_EVIDENCE),
    ("post", routes::TRANSACTION_RESOLVE),
    ("post", routes::TRANSACTION_RETRY),
    ("post", routes::PARTICIPANT_RETRY),
    ("get", routes::AUDIT),
    ("get", routes::CLUSTER),
    ("post", routes::SAGA_RETRY),
    ("post", routes::SAGA_RESOLVE),
    ("get", routes::SAGA_EVIDENCE),
    ("post", routes::LOG_BEHIND_CLEAR),
    ("get", routes::UI),
    ("get", routes::HEALTHZ),
    ("get", routes::READYZ),
    ("get", routes::METRICS),
    ("post", routes::SAGAS),
    ("get", routes::SAGAS),
    ("get", routes::SAGA),
    ("get", routes::LEASES),
    ("post", routes::LEASE),
    ("get", routes::LEASE),
    ("delete", routes::LEASE),
    ("post", routes::LEASE_RENEW),
    ("get", routes::GROUP),
    ("post", routes::REPLICA_BACKUP),
    ("post", routes::REPLICA_OPS),
    ("post", routes::REPLICA_OUTCOMES),
];

/// What the handlers share. The core appears once recovery finished; until then every route
/// but `/healthz` and `/metrics` answers 503 `not_ready`.
#[derive(Debug, Clone)]
pub struct AppState {
    core: Arc<OnceLock<Arc<Core>>>,
    metrics: Arc<Metrics>,
    /// Unknown-attempt decision queries per caller (`query_limit`); configured at ready.
    decision_queries: Arc<Mutex<QueryLimiter>>,
    /// The tokens in force (none: authentication off); reloaded on SIGHUP by the server.
    keys: KeyRing,
    /// The listener is a loopback address: without tokens, only loopback `Host` names are
    /// answered (`cross_site`). True until told otherwise, the stricter choice.
    loopback_listen: bool,
    /// In a coordinator group (`--ha`): this node, which says whether it may answer clients.
    group: Option<Arc<crate::ha::node::GroupNode>>,
}

impl AppState {
    pub fn new(metrics: Arc<Metrics>) -> AppState {
        AppState {
            core: Arc::new(OnceLock::new()),
            metrics,
            decision_queries: Arc::new(Mutex::new(QueryLimiter::new(QueryLimit::default()))),
            keys: KeyRing::default(),
            loopback_listen: true,
            group: None,
        }
    }

    /// Serves as a node of a coordinator group: client routes answer 503 `not_leader` unless
    /// this node leads with a lease that holds.
    pub fn with_group(mut self, node: Arc<crate::ha::node::GroupNode>) -> AppState {
        self.group = Some(node);
        self
    }

    pub fn group(&self) -> Option<&Arc<crate::ha::node::GroupNode>> {
        self.group.as_ref()
    }

    /// Checks callers against `keys` (shared with whoever reloads them).
    pub fn with_keys(mut self, keys: KeyRing) -> AppState {
        self.keys = keys;
        self
    }

    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    /// Whether the listener is a loopback address (see `loopback_listen`).
    pub fn with_loopback_listen(mut self, loopback: bool) -> AppState {
        self.loopback_listen = loopback;
        self
    }

    pub fn loopback_listen(&self) -> bool {
        self.loopback_listen
    }

    /// Recovery finished: start serving.
    pub fn set_ready(&self, core: Arc<Core>) {
        *self.decision_limiter() = QueryLimiter::new(core.config().decision_query_limit());
        let _ = self.core.set(core);
    }

    pub(crate) fn decision_limiter(&self) -> std::sync::MutexGuard<'_, QueryLimiter> {
        // The limiter holds counts only; a panic elsewhere leaves them usable.
        self.decision_queries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn core(&self) -> Result<&Arc<Core>, ApiError> {
        self.core.get().ok_or_else(ApiError::not_ready)
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            routes::TRANSACTIONS,
            get(transactions::list).post(transactions::create),
        )
        .route(routes::TRANSACTION, get(transactions::status))
        .route(routes::TRANSACTION_DECISION, get(transactions::decision))
        .route(routes::TRANSACTION_EVIDENCE, get(operator::evidence))
        .route(routes::TRANSACTION_RESOLVE, post(operator::resolve))
        .route(routes::TRANSACTION_RETRY, post(operator::retry_transaction))
        .route(routes::PARTICIPANT_RETRY, post(operator::retry_participant))
        .route(routes::AUDIT, get(operator::audit))
        .route(routes::CLUSTER, get(operator::cluster))
        .route(routes::SAGA_RETRY, post(operator::retry_saga))
        .route(routes::SAGA_RESOLVE, post(operator::resolve_saga))
        .route(routes::SAGA_EVIDENCE, get(operator::saga_evidence))
        .route(routes::LOG_BEHIND_CLEAR, post(operator::clear_behind))
        .route(routes::UI, get(operator::ui))
        .route(routes::SAGAS, get(sagas::list).post(sagas::create))
        .route(routes::SAGA, get(sagas::status))
        .route(routes::HEALTHZ, get(healthz))
        .route(routes::READYZ, get(readyz))
        .route(routes::METRICS, get(metrics))
        .route(routes::LEASES, get(leases::list))
        .route(
            routes::LEASE,
            get(leases::get)
                .post(leases::acquire)
                .delete(leases::release),
        )
        .route(routes::LEASE_RENEW, post(leases::renew))
        .route(routes::GROUP, get(replica::view))
        .route(
            routes::REPLICA_BACKUP,
            post(replica::backup).layer(DefaultBodyLimit::max(replica::REPLICA_BODY_MAX)),
        )
        .route(
            routes::REPLICA_OPS,
            post(replica::ops).layer(DefaultBodyLimit::max(replica::REPLICA_BODY_MAX)),
        )
        .route(
            routes::REPLICA_OUTCOMES,
            post(replica::outcomes).layer(DefaultBodyLimit::max(replica::REPLICA_BODY_MAX)),
        )
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(state)
}

/// Every route's gate: the cross-site rules, then the caller's token. A cross-site request is
/// refused whoever's token it carries. One middleware for both, not one each: every axum
/// middleware layer costs boxed services and futures on every request.
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Err(refusal) = cross_site::check(&state, &request) {
        return refusal.into_response();
    }
    let leaders_only = state.group.is_some() && answers_only_when_leading(&request);
    if leaders_only
        && let Some(node) = &state.group
        && let Some((leader, why)) = node.refusal()
    {
        return ApiError::not_leader(leader, &why).into_response();
    }
    let response = auth::check(&state, request, next).await;
    // Asked again as the answer leaves: a request taken in before a stall (a paused process)
    // must not be answered after the lease may have lapsed.
    if leaders_only
        && let Some(node) = &state.group
        && let Some((leader, why)) = node.refusal()
    {
        return ApiError::not_leader(leader, &why).into_response();
    }
    response
}

/// Every route but liveness, metrics and the group's own routes is the leader's to answer.
fn answers_only_when_leading(request: &Request) -> bool {
    let path = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| request.uri().path(), |p| p.as_str());
    !matches!(
        path,
        routes::HEALTHZ
            | routes::METRICS
            | routes::GROUP
            | routes::REPLICA_BACKUP
            | routes::REPLICA_OPS
            | routes::REPLICA_OUTCOMES
    )
}

async fn unknown_route() -> ApiError {
    ApiError::new(ErrorCode::UnknownRoute, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this route does not take that method",
    )
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let core = state.core()?;
    if core.is_poisoned() {
        return Err(ApiError::log_failed());
    }
    if let Some(evidence) = core.log_behind() {
        return Err(ApiError::log_behind(&evidence));
    }
    // Detail only: a budget that shortens the window is an operator's choice to revisit, not
    // a reason to take the coordinator out of rotation.
    let configured_ms = core.config().retention_ms;
    let retention = match core.index_stats() {
        Ok(stats) => serde_json::json!({
            "configured_ms": configured_ms,
            "effective_ms": stats.effective_window_ms,
            "evicted_early": stats.evicted_early_total,
            "disk_bytes": stats.logical_bytes,
        }),
        Err(e) => serde_json::json!({
            "configured_ms": configured_ms,
            "error": e.to_string(),
        }),
    };
    Ok(axum::Json(
        serde_json::json!({"status": "ready", "retention": retention}),
    ))
}

async fn metrics(State(state): State<AppState>) -> Response {
    let loads = state
        .core
        .get()
        .map(|core| core.participant_loads())
        .unwrap_or_default();
    let sampled = match state.core.get() {
        Some(core) => {
            let wal = core.wal_stats();
            Sampled {
                ready: true,
                log_poisoned: core.is_poisoned(),
                log_bytes: core.log_bytes(),
                epoch: core.identity().epoch.0,
                gauges: core.gauges(),
                wal_fsyncs: wal.fsyncs,
                wal_records: wal.records_appended,
                index: core.index_stats().ok(),
                retention_ms: core.config().retention_ms,
                now_ms: crate::runtime::now_ms(),
            }
        }
        None => Sampled::default(),
    };
    let sagas = state.core.get().map(|core| core.saga_numbers());
    let mut text = state.metrics.render(sampled, &loads, sagas.as_ref());
    if let Some(node) = &state.group {
        text.push_str(&crate::metrics::group::render(&node.numbers()));
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, net::exposition::CONTENT_TYPE)],
        text,
    )
        .into_response()
}
