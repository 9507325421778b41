//! The PostgreSQL participant's HTTP surface: the same protocol routes as every participant
//! (the batched phase messages too, as the library serves them: `crate::batch_http`),
//! `/v1/prepared` (with gids and ages), the local write and the outbox (`super::outbox_http`),
//! health, readiness (PostgreSQL reachable) and metrics.

use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use protocol::batch::{DecisionBatch, PrepareBatch};
use protocol::limits::BATCH_BODY_BYTES_MAX;
use protocol::{AckResponse, Decision, DecisionRequest, ErrorCode, PrepareRequest, Vote, routes};

use net::exposition::Exposition;

use super::backend::PgParticipant;
use super::in_doubt::PgPreparedList;
use super::metrics::{OpenCounts, PgMetrics, outbox_families};
use super::work::PgWork;
use super::{fence_http, outbox_http};
use crate::api_error::{ApiError, json_body};
use crate::batch_http::{answer_decisions, answer_prepares, batch_body, check_items};

impl<W: PgWork> PgParticipant<W> {
    /// The routes; pass the router through [`crate::finish`].
    pub fn router(&self) -> Router {
        let routes = Router::new()
            .route(routes::PREPARE, post(prepare::<W>))
            .route(routes::COMMIT, post(commit::<W>))
            .route(routes::ABORT, post(abort::<W>))
            .route(routes::CAPABILITIES, get(crate::batch_http::capabilities))
            .route(
                routes::BATCH_PREPARE,
                post(batch_prepare::<W>).layer(DefaultBodyLimit::max(BATCH_BODY_BYTES_MAX)),
            )
            .route(
                routes::BATCH_DECIDE,
                post(batch_decide::<W>).layer(DefaultBodyLimit::max(BATCH_BODY_BYTES_MAX)),
            )
            .route(routes::PREPARED, get(prepared::<W>))
            .route(routes::PG_WRITE, post(outbox_http::write::<W>))
            .route(routes::OUTBOX, get(outbox_http::list::<W>))
            .route(routes::OUTBOX_INTENT, get(outbox_http::entry::<W>))
            .route(routes::OUTBOX_DELIVERED, post(outbox_http::delivered::<W>))
            .route(routes::OUTBOX_ATTEMPT, post(outbox_http::attempt::<W>))
            .route(routes::OUTBOX_RETRY, post(outbox_http::retry::<W>))
            .route(routes::OUTBOX_MARK, post(outbox_http::mark::<W>))
            .route(routes::FENCE, get(fence_http::status::<W>))
            .route(routes::FENCE_RESET, post(fence_http::reset::<W>))
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

    /// The `/metrics` text (reads `pg_prepared_xacts` for the in-doubt gauges and the outbox
    /// table for its open counts).
    pub async fn metrics_text(&self) -> String {
        let (listed, outbox) = tokio::join!(self.in_doubt(), self.outbox_counts());
        let in_doubt = match listed {
            Ok(list) => Some(InDoubt {
                prepared: list.prepared.len() + list.unattributed.len(),
                oldest_age_ms: list.prepared.first().map_or(0, |p| p.age_ms),
            }),
            Err(_) => None,
        };
        render(&self.inner.metrics, in_doubt, outbox)
    }
}

/// This participant's prepared transactions in `pg_prepared_xacts`, as one scrape read them.
#[derive(Debug, Clone, Copy)]
struct InDoubt {
    prepared: usize,
    oldest_age_ms: u64,
}

/// The PostgreSQL participant's `/metrics` families (`None`: PostgreSQL did not answer).
fn render(m: &PgMetrics, in_doubt: Option<InDoubt>, outbox: Option<OpenCounts>) -> String {
    let mut out = Exposition::default();
    out.counters_by(
        "twopc_pg_votes_total",
        "Votes sent, by vote",
        "vote",
        [
            ("yes", m.votes_yes.load(Ordering::Relaxed)),
            ("no", m.votes_no.load(Ordering::Relaxed)),
        ],
    );
    out.counter_of(
        "twopc_pg_commit_prepared_total",
        "COMMIT PREPARED statements that committed a transaction",
        &m.commits,
    );
    out.counter_of(
        "twopc_pg_rollback_prepared_total",
        "ROLLBACK PREPARED statements that rolled a transaction back",
        &m.aborts,
    );
    out.counter_of(
        "twopc_pg_decision_queries_total",
        "Decision queries sent to the coordinator about in-doubt transactions",
        &m.decision_queries,
    );
    out.counter_of(
        "twopc_pg_resolved_by_query_total",
        "In-doubt transactions resolved from the coordinator's answer",
        &m.resolved_by_query,
    );
    out.counter_of(
        "twopc_pg_batches_total",
        "Batched phase messages received (each carries many attempts' prepares or decisions)",
        &m.batches,
    );
    out.counter_of(
        "twopc_pg_batched_items_total",
        "Prepares and decisions received inside batched phase messages",
        &m.batched_items,
    );
    out.counter_of(
        "twopc_pg_phase_two_round_trips_total",
        "Round trips that carried COMMIT PREPARED / ROLLBACK PREPARED statements",
        &m.phase_two_round_trips,
    );
    out.counter_of(
        "twopc_pg_phase_two_statements_total",
        "COMMIT PREPARED / ROLLBACK PREPARED statements sent (per round trip: the batch size)",
        &m.phase_two_statements,
    );
    let read = in_doubt.unwrap_or(InDoubt {
        prepared: 0,
        oldest_age_ms: 0,
    });
    out.gauge(
        "twopc_pg_prepared",
        "This participant's prepared transactions in pg_prepared_xacts (they hold locks and \
         block VACUUM)",
        u64::try_from(read.prepared).unwrap_or(u64::MAX),
    );
    out.gauge_f64(
        "twopc_pg_prepared_oldest_age_seconds",
        "Age of the oldest of them",
        read.oldest_age_ms as f64 / 1000.0,
    );
    out.gauge(
        "twopc_pg_up",
        "Whether PostgreSQL answered this scrape's query",
        u64::from(in_doubt.is_some()),
    );
    outbox_families(&mut out, m, outbox);
    out.text()
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

/// `POST /2pc/batch/prepare`: each item runs as `/2pc/prepare` alone would (each on a prepare
/// session of its own, so one waiting on a lock holds back no other), answered line by line.
async fn batch_prepare<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let batch: PrepareBatch = batch_body(&headers, body)?;
    check_items(batch.prepares.len())?;
    participant.count_batch(batch.prepares.len());
    Ok(answer_prepares(batch, move |request| {
        let participant = participant.clone();
        async move { participant.prepare(request).await }
    })
    .await)
}

/// `POST /2pc/batch/decide`: each item runs as `/2pc/commit` or `/2pc/abort` alone would; the
/// items arrive together, so their `COMMIT PREPARED`s go out together (`super::phase_two`).
async fn batch_decide<W: PgWork>(
    State(participant): State<PgParticipant<W>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let batch: DecisionBatch = batch_body(&headers, body)?;
    check_items(batch.decisions.len())?;
    participant.count_batch(batch.decisions.len());
    Ok(answer_decisions(batch, move |decision, request| {
        let participant = participant.clone();
        async move {
            match decision {
                Decision::Commit => participant.commit(request).await,
                Decision::Abort => participant.abort(request).await,
            }
        }
    })
    .await)
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
        [(header::CONTENT_TYPE, net::exposition::CONTENT_TYPE)],
        participant.metrics_text().await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The series the PostgreSQL participant exported when it wrote its text by hand, in
    /// order, values removed, plus the batch counters and the outbox's families since: a
    /// rename fails here.
    const SERIES: [&str; 37] = [
        "# TYPE twopc_pg_votes_total counter",
        "twopc_pg_votes_total{vote=\"yes\"}",
        "twopc_pg_votes_total{vote=\"no\"}",
        "# TYPE twopc_pg_commit_prepared_total counter",
        "twopc_pg_commit_prepared_total",
        "# TYPE twopc_pg_rollback_prepared_total counter",
        "twopc_pg_rollback_prepared_total",
        "# TYPE twopc_pg_decision_queries_total counter",
        "twopc_pg_decision_queries_total",
        "# TYPE twopc_pg_resolved_by_query_total counter",
        "twopc_pg_resolved_by_query_total",
        "# TYPE twopc_pg_batches_total counter",
        "twopc_pg_batches_total",
        "# TYPE twopc_pg_batched_items_total counter",
        "twopc_pg_batched_items_total",
        "# TYPE twopc_pg_phase_two_round_trips_total counter",
        "twopc_pg_phase_two_round_trips_total",
        "# TYPE twopc_pg_phase_two_statements_total counter",
        "twopc_pg_phase_two_statements_total",
        "# TYPE twopc_pg_prepared gauge",
        "twopc_pg_prepared",
        "# TYPE twopc_pg_prepared_oldest_age_seconds gauge",
        "twopc_pg_prepared_oldest_age_seconds",
        "# TYPE twopc_pg_up gauge",
        "twopc_pg_up",
        "# TYPE twopc_participant_outbox_intents_written_total counter",
        "twopc_participant_outbox_intents_written_total",
        "# TYPE twopc_participant_outbox_delivered_total counter",
        "twopc_participant_outbox_delivered_total",
        "# TYPE twopc_participant_outbox_attempts_failed_total counter",
        "twopc_participant_outbox_attempts_failed_total",
        "# TYPE twopc_participant_outbox_pending gauge",
        "twopc_participant_outbox_pending",
        "# TYPE twopc_participant_outbox_failed gauge",
        "twopc_participant_outbox_failed",
        "# TYPE twopc_participant_outbox_oldest_pending_age_seconds gauge",
        "twopc_participant_outbox_oldest_pending_age_seconds",
    ];

    #[test]
    fn the_exported_series_and_types_are_the_same_as_before() {
        let text = render(&PgMetrics::default(), None, None);
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("# TYPE ") || !l.starts_with('#'))
            .map(|l| match l.strip_prefix("# TYPE ") {
                Some(_) => l,
                None => l.rsplit_once(' ').map_or(l, |(series, _)| series),
            })
            .collect();
        assert_eq!(series, SERIES, "{text}");
    }

    #[test]
    fn values_are_the_counters_and_what_the_scrape_read() {
        let m = PgMetrics::default();
        m.votes_no.fetch_add(2, Ordering::Relaxed);
        let down = render(&m, None, None);
        assert!(down.contains("twopc_pg_up 0\n"), "{down}");
        assert!(
            down.contains("twopc_pg_votes_total{vote=\"no\"} 2\n"),
            "{down}"
        );
        let up = render(
            &m,
            Some(InDoubt {
                prepared: 3,
                oldest_age_ms: 1_234,
            }),
            Some(OpenCounts {
                pending: 4,
                failed: 1,
                oldest_pending_age_ms: Some(2_500),
            }),
        );
        for line in [
            "twopc_pg_up 1\n",
            "twopc_pg_prepared 3\n",
            "twopc_pg_prepared_oldest_age_seconds 1.234\n",
            "twopc_participant_outbox_pending 4\n",
            "twopc_participant_outbox_failed 1\n",
            "twopc_participant_outbox_oldest_pending_age_seconds 2.5\n",
        ] {
            assert!(up.contains(line), "{line} missing in\n{up}");
        }
    }
}
