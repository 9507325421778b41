//! The PostgreSQL participant's HTTP surface: the same protocol routes as every participant,
//! `/v1/prepared` (with gids and ages), health, readiness (PostgreSQL reachable) and metrics.

use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use protocol::{AckResponse, DecisionRequest, ErrorCode, PrepareRequest, Vote, routes};

use super::backend::PgParticipant;
use super::in_doubt::PgPreparedList;
use super::work::PgWork;
use crate::http::{ApiError, json_body};

impl<W: PgWork> PgParticipant<W> {
    /// The routes; pass the router through [`crate::finish`].
    pub fn router(&self) -> Router {
        let routes = Router::new()
            .route(routes::PREPARE, post(prepare::<W>))
            .route(routes::COMMIT, post(commit::<W>))
            .route(routes::ABORT, post(abort::<W>))
            .route(routes::PREPARED, get(prepared::<W>))
            .route(routes::HEALTHZ, get(healthz))
            .route(routes::READYZ, get(readyz::<W>))
            .route(routes::METRICS, get(metrics::<W>))
            .with_state(self.clone());
        crate::auth::protect(
            routes,
            self.inner.config.keys.clone(),
            self.inner.config.loopback_listen,
        )
    }

    /// The Prometheus text (reads `pg_prepared_xacts` for the in-doubt gauges).
    pub async fn metrics_text(&self) -> String {
        let m = &self.inner.metrics;
        let (in_doubt, oldest_s, scrape_ok) = match self.in_doubt().await {
            Ok(list) => (
                list.prepared.len() + list.unattributed.len(),
                list.prepared
                    .first()
                    .map_or(0.0, |p| p.age_ms as f64 / 1000.0),
                1,
            ),
            Err(_) => (0, 0.0, 0),
        };
        let counter = |name: &str, help: &str, value: u64| {
            format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n")
        };
        let mut text = String::new();
        text.push_str(&format!(
            "# HELP twopc_pg_votes_total Votes sent, by vote.\n# TYPE twopc_pg_votes_total counter\n\
             twopc_pg_votes_total{{vote=\"yes\"}} {}\ntwopc_pg_votes_total{{vote=\"no\"}} {}\n",
            m.votes_yes.load(Ordering::Relaxed),
            m.votes_no.load(Ordering::Relaxed)
        ));
        text.push_str(&counter(
            "twopc_pg_commit_prepared_total",
            "COMMIT PREPARED statements that committed a transaction.",
            m.commits.load(Ordering::Relaxed),
        ));
        text.push_str(&counter(
            "twopc_pg_rollback_prepared_total",
            "ROLLBACK PREPARED statements that rolled a transaction back.",
            m.aborts.load(Ordering::Relaxed),
        ));
        text.push_str(&counter(
            "twopc_pg_decision_queries_total",
            "Decision queries sent to the coordinator about in-doubt transactions.",
            m.decision_queries.load(Ordering::Relaxed),
        ));
        text.push_str(&counter(
            "twopc_pg_resolved_by_query_total",
            "In-doubt transactions resolved from the coordinator's answer.",
            m.resolved_by_query.load(Ordering::Relaxed),
        ));
        text.push_str(&format!(
            "# HELP twopc_pg_prepared This participant's prepared transactions in \
             pg_prepared_xacts (they hold locks and block VACUUM).\n\
             # TYPE twopc_pg_prepared gauge\ntwopc_pg_prepared {in_doubt}\n\
             # HELP twopc_pg_prepared_oldest_age_seconds Age of the oldest of them.\n\
             # TYPE twopc_pg_prepared_oldest_age_seconds gauge\n\
             twopc_pg_prepared_oldest_age_seconds {oldest_s:.3}\n\
             # HELP twopc_pg_up Whether PostgreSQL answered this scrape's query.\n\
             # TYPE twopc_pg_up gauge\ntwopc_pg_up {scrape_ok}\n"
        ));
        text
    }
}

async fn prepare<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Vote>, ApiError> {
    let request: PrepareRequest = json_body(&headers, body)?;
    Ok(axum::Json(participant.prepare(request).await?))
}

async fn commit<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<AckResponse>, ApiError> {
    let request: DecisionRequest = json_body(&headers, body)?;
    participant.commit(request).await?;
    Ok(axum::Json(AckResponse { ack: true }))
}

async fn abort<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<AckResponse>, ApiError> {
    let request: DecisionRequest = json_body(&headers, body)?;
    participant.abort(request).await?;
    Ok(axum::Json(AckResponse { ack: true }))
}

async fn prepared<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
) -> Result<axum::Json<PgPreparedList>, ApiError> {
    participant
        .in_doubt()
        .await
        .map(axum::Json)
        .map_err(|e| ApiError::new(ErrorCode::NotReady, e.to_string()))
}

async fn healthz() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"status": "ok"}))
}

async fn readyz<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    participant
        .in_doubt()
        .await
        .map_err(|e| ApiError::new(ErrorCode::NotReady, e.to_string()))?;
    Ok(axum::Json(serde_json::json!({"status": "ready"})))
}

async fn metrics<W: PgWork>(State(participant): State<PgParticipant<W>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        participant.metrics_text().await,
    )
}
