//! The PostgreSQL participant's outbox (`twopc.pg_outbox`, written by `super::write`): the
//! listing a relay and an operator read, the relay's reports (delivered, attempt) and the
//! operator's actions (retry, mark), and the retention that drops settled intents.
//!
//! Every change runs in a transaction of its own with `synchronous_commit = on` and answers
//! only after its `COMMIT` returned (durable before answered). A change locks the intent's row
//! (`FOR UPDATE`), so reports on one intent apply one at a time. Reports are claims: `delivered`
//! for an intent behind an open one of its aggregate is refused (`intent_out_of_order`); a
//! report on a delivered or abandoned intent answers the entry unchanged. Operator actions are
//! recorded in the row's `marks` (who, why, when), the backend's audit trail, and logged.
//! Ages and times are PostgreSQL's clock (`now()`), as in `/v1/prepared`. This module must
//! never drop a pending or failed intent.

use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::outbox::{IntentState, OutboxEntry, OutboxList};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::backend::PgParticipant;
use super::error::describe;
use super::metrics::OpenCounts;
use super::pool::Side;
use super::work::PgWork;
use crate::outbox::{StateFilter, cut_error, state_name as state_text};

/// The states a listing's filter admits, as `string_to_array` reads them.
fn states(filter: StateFilter) -> &'static str {
    match filter {
        StateFilter::All => "pending,failed,delivered,abandoned",
        StateFilter::Open | StateFilter::Heads => "pending,failed",
        StateFilter::One(state) => state_text(state),
    }
}

/// Why an outbox request changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// 404 `not_found`.
    #[error("{0}")]
    NotFound(String),
    /// 409 `intent_out_of_order`: an earlier intent of the aggregate is still open.
    #[error("{0}")]
    OutOfOrder(String),
    /// 409 `not_pending`: a retry of an intent that is not failed, a mark of a settled one.
    #[error("{0}")]
    Settled(String),
    /// 422 `invalid_payload`.
    #[error("{0}")]
    Invalid(String),
    /// 503 `not_ready`: PostgreSQL did not answer; repeat.
    #[error("PostgreSQL: {0}")]
    Database(String),
}

fn db(context: &str, error: &tokio_postgres::Error) -> OutboxError {
    OutboxError::Database(format!("{context}: {}", describe(error)))
}

/// What is done to one intent.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A relay: the receiver answered for it.
    Delivered { answer: serde_json::Value },
    /// A relay: an attempt without a delivery; `permanent` fails it.
    Attempt { error: String, permanent: bool },
    /// An operator: a failed intent back to pending.
    Retry { operator: String, reason: String },
    /// An operator: settled outside twopc (`Delivered` or `Abandoned`).
    Mark {
        operator: String,
        reason: String,
        state: IntentState,
    },
}

/// What an action does to an intent as it stands.
enum Verdict {
    Apply,
    Unchanged,
    Refuse(OutboxError),
}

impl Action {
    fn verdict(&self, entry: &OutboxEntry) -> Verdict {
        let settled = matches!(entry.state, IntentState::Delivered | IntentState::Abandoned);
        match self {
            Action::Delivered { .. } | Action::Attempt { .. } if settled => Verdict::Unchanged,
            Action::Delivered { .. } | Action::Attempt { .. } => Verdict::Apply,
            // As the KV participant: retry takes failed intents only, mark pending or failed.
            Action::Retry { .. } if entry.state != IntentState::Failed => {
                Verdict::Refuse(OutboxError::Settled(format!(
                    "intent {:?} is {}; retry takes failed intents only",
                    entry.event_id,
                    state_text(entry.state)
                )))
            }
            Action::Retry { .. } => Verdict::Apply,
            Action::Mark { .. } if settled => Verdict::Refuse(OutboxError::Settled(format!(
                "intent {:?} is {}; mark takes pending or failed intents only",
                entry.event_id,
                state_text(entry.state)
            ))),
            Action::Mark { .. } => Verdict::Apply,
        }
    }

    /// The update and its three text parameters ($3, $4, $5; $1 participant, $2 event id).
    fn update(&self) -> (String, [Option<String>; 3]) {
        match self {
            Action::Delivered { answer } => (
                DELIVERED_SQL.to_string(),
                [Some(answer.to_string()), None, None],
            ),
            Action::Attempt { error, permanent } => (
                ATTEMPT_SQL.to_string(),
                [Some(cut_error(error)), Some(permanent.to_string()), None],
            ),
            Action::Retry { operator, reason } => (
                retry_sql(),
                [
                    Some(operator.clone()),
                    Some(reason.clone()),
                    Some("retry".to_string()),
                ],
            ),
            Action::Mark {
                operator,
                reason,
                state,
            } => (
                mark_sql(),
                [
                    Some(operator.clone()),
                    Some(reason.clone()),
                    Some(state_text(*state).to_string()),
                ],
            ),
        }
    }
}

/// The columns of an [`OutboxEntry`], in the order [`entry`] reads them.
const COLUMNS: &str = "event_id, aggregate, seq, target, type, body::text, state, op_id, \
    (extract(epoch from created_at) * 1000)::bigint, attempts, last_error, \
    (extract(epoch from last_attempt_at) * 1000)::bigint, \
    (extract(epoch from delivered_at) * 1000)::bigint, answer::text, marks::text, \
    (extract(epoch from now() - created_at) * 1000)::bigint";

const MARK: &str = "marks = marks || jsonb_build_array(jsonb_build_object('operator', $3::text, \
    'reason', $4::text, 'action', $5::text, 'at_ms', (extract(epoch from now()) * 1000)::bigint))";
const DELIVERED_SQL: &str = "UPDATE twopc.pg_outbox SET state = 'delivered', \
    attempts = attempts + 1, last_attempt_at = now(), delivered_at = now(), settled_at = now(), \
    answer = $3::text::jsonb WHERE participant = $1 AND event_id = $2";
const ATTEMPT_SQL: &str = "UPDATE twopc.pg_outbox SET attempts = attempts + 1, \
    last_error = $3, last_attempt_at = now(), \
    state = CASE WHEN $4 = 'true' THEN 'failed' ELSE state END \
    WHERE participant = $1 AND event_id = $2";

fn retry_sql() -> String {
    format!(
        "UPDATE twopc.pg_outbox SET state = 'pending', {MARK} \
         WHERE participant = $1 AND event_id = $2"
    )
}

fn mark_sql() -> String {
    format!(
        "UPDATE twopc.pg_outbox SET state = $5, settled_at = now(), \
         delivered_at = CASE WHEN $5 = 'delivered' THEN now() ELSE delivered_at END, {MARK} \
         WHERE participant = $1 AND event_id = $2"
    )
}

/// Milliseconds read as `bigint`: NULL is `None`, a negative age (never expected: a row we
/// see committed before our `now()`) is 0. (Not `greatest(0, ...)` in SQL: it ignores NULL.)
fn ms(row: &Row, n: usize) -> Option<u64> {
    row.get::<_, Option<i64>>(n)
        .map(|v| u64::try_from(v).unwrap_or(0))
}

fn json(text: Option<String>, what: &str) -> Result<Option<serde_json::Value>, OutboxError> {
    text.map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(|e| OutboxError::Database(format!("the stored {what} does not decode: {e}")))
}

/// One row of [`COLUMNS`].
fn entry(row: &Row) -> Result<OutboxEntry, OutboxError> {
    let state: String = row.get(6);
    let state = match StateFilter::parse(&state) {
        Some(StateFilter::One(state)) => state,
        _ => return Err(OutboxError::Database(format!("unknown state {state:?}"))),
    };
    let marks = json(row.get(14), "marks")?.unwrap_or(serde_json::Value::Null);
    Ok(OutboxEntry {
        event_id: row.get(0),
        aggregate: row.get(1),
        seq: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
        target: row.get(3),
        kind: row.get(4),
        body: json(row.get(5), "body")?.unwrap_or(serde_json::Value::Null),
        state,
        op_id: row.get(7),
        created_at_ms: ms(row, 8).unwrap_or(0),
        attempts: u32::try_from(row.get::<_, i32>(9)).unwrap_or(0),
        last_error: row.get(10),
        last_attempt_at_ms: ms(row, 11),
        delivered_at_ms: ms(row, 12),
        answer: json(row.get(13), "answer")?,
        marks: serde_json::from_value(marks).unwrap_or_default(),
        age_ms: ms(row, 15),
    })
}

async fn open_counts(client: &Client, name: &str) -> Result<OpenCounts, OutboxError> {
    let row = client
        .query_typed(
            "SELECT count(*) FILTER (WHERE state = 'pending'), \
             count(*) FILTER (WHERE state = 'failed'), \
             (extract(epoch from now() - min(created_at) \
                 FILTER (WHERE state = 'pending')) * 1000)::bigint \
             FROM twopc.pg_outbox WHERE participant = $1 AND state IN ('pending', 'failed')",
            &[(&name, Type::TEXT)],
        )
        .await
        .map_err(|e| db("counting the open intents", &e))?;
    let row = row
        .first()
        .ok_or_else(|| OutboxError::Database("the counts came back empty".into()))?;
    let count = |n: usize| u64::try_from(row.get::<_, i64>(n)).unwrap_or(0);
    Ok(OpenCounts {
        pending: count(0),
        failed: count(1),
        oldest_pending_age_ms: ms(row, 2),
    })
}

impl<W: PgWork> PgParticipant<W> {
    /// `GET /v1/outbox`: entries in write order, with the counts of every open intent.
    pub async fn outbox(
        &self,
        filter: StateFilter,
        aggregate: Option<&str>,
        limit: usize,
    ) -> Result<OutboxList, OutboxError> {
        let session = self
            .inner
            .pool
            .get(Side::Decide)
            .await
            .map_err(|e| OutboxError::Database(e.to_string()))?;
        let client = session.client();
        let name = self.inner.config.name.as_str();
        let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let states = states(filter);
        let sql = if filter == StateFilter::Heads {
            // Each aggregate's lowest open seq, then in write order.
            format!(
                "SELECT {COLUMNS} FROM (SELECT DISTINCT ON (aggregate) * FROM twopc.pg_outbox \
                 WHERE participant = $1 AND ($2::text IS NULL OR aggregate = $2) \
                 AND state = ANY (string_to_array($3, ',')) ORDER BY aggregate, seq) heads \
                 ORDER BY position LIMIT $4"
            )
        } else {
            format!(
                "SELECT {COLUMNS} FROM twopc.pg_outbox WHERE participant = $1 \
                 AND ($2::text IS NULL OR aggregate = $2) \
                 AND state = ANY (string_to_array($3, ',')) ORDER BY position LIMIT $4"
            )
        };
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&name, Type::TEXT),
            (&aggregate, Type::TEXT),
            (&states, Type::TEXT),
            (&fetch, Type::INT8),
        ];
        let (rows, counts) =
            tokio::join!(client.query_typed(&sql, &params), open_counts(client, name));
        let rows = rows.map_err(|e| db("listing the outbox", &e))?;
        let counts = counts?;
        let truncated = rows.len() > limit;
        let intents = rows
            .iter()
            .take(limit)
            .map(entry)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(OutboxList {
            intents,
            pending: counts.pending,
            failed: counts.failed,
            oldest_pending_age_ms: counts.oldest_pending_age_ms,
            truncated,
        })
    }

    /// `GET /v1/outbox/{event_id}`.
    pub async fn outbox_entry(&self, event_id: &str) -> Result<OutboxEntry, OutboxError> {
        let session = self
            .inner
            .pool
            .get(Side::Decide)
            .await
            .map_err(|e| OutboxError::Database(e.to_string()))?;
        let name = self.inner.config.name.as_str();
        let rows = session
            .client()
            .query_typed(
                &format!(
                    "SELECT {COLUMNS} FROM twopc.pg_outbox \
                     WHERE participant = $1 AND event_id = $2"
                ),
                &[(&name, Type::TEXT), (&event_id, Type::TEXT)],
            )
            .await
            .map_err(|e| db("reading the intent", &e))?;
        rows.first()
            .map(entry)
            .unwrap_or_else(|| Err(not_found(event_id)))
    }

    /// The open counts for `/metrics` (`None`: PostgreSQL did not answer).
    pub(crate) async fn outbox_counts(&self) -> Option<OpenCounts> {
        let session = self.inner.pool.get(Side::Decide).await.ok()?;
        open_counts(session.client(), &self.inner.config.name)
            .await
            .ok()
    }

    /// Applies `action` to one intent, committed before the answer; answers the entry as it
    /// then stands.
    pub async fn outbox_act(
        &self,
        event_id: &str,
        action: Action,
    ) -> Result<OutboxEntry, OutboxError> {
        if let Action::Mark { state, .. } = &action
            && !matches!(state, IntentState::Delivered | IntentState::Abandoned)
        {
            return Err(OutboxError::Invalid(format!(
                "an intent is marked delivered or abandoned, not {}",
                state_text(*state)
            )));
        }
        let mut session = self
            .inner
            .pool
            .get(Side::Prepare)
            .await
            .map_err(|e| OutboxError::Database(e.to_string()))?;
        let wait = self.inner.config.lock_wait_max_ms.max(1);
        session.busy();
        let client = session.client();
        let name = self.inner.config.name.as_str();
        let key: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&event_id, Type::TEXT)];
        let begin =
            format!("BEGIN; SET LOCAL synchronous_commit = on; SET LOCAL lock_timeout = {wait}");
        let select = format!(
            "SELECT {COLUMNS} FROM twopc.pg_outbox \
             WHERE participant = $1 AND event_id = $2 FOR UPDATE"
        );
        let (began, found) = tokio::join!(
            biased;
            client.batch_execute(&begin),
            client.query_typed(&select, &key),
        );
        let outcome = match began.and(found) {
            Ok(rows) => match rows.first().map(entry) {
                None => Err(not_found(event_id)),
                Some(Err(error)) => Err(error),
                Some(Ok(current)) => self.decide(client, &current, &action).await,
            },
            Err(error) => Err(db("reading the intent", &error)),
        };
        let changed = match outcome {
            Ok(Some(())) => client.batch_execute("COMMIT").await,
            Ok(None) | Err(_) => client.batch_execute("ROLLBACK").await,
        };
        if let Err(error) = changed {
            session.discard();
            return Err(db("ending the change (repeat it)", &error));
        }
        session.idle();
        drop(session);
        match outcome {
            Err(error) => Err(error),
            Ok(None) => self.outbox_entry(event_id).await,
            Ok(Some(())) => {
                self.after(event_id, &action);
                self.outbox_entry(event_id).await
            }
        }
    }

    /// Inside the transaction: `Some(())` when the row was updated, `None` when it stands.
    async fn decide(
        &self,
        client: &Client,
        current: &OutboxEntry,
        action: &Action,
    ) -> Result<Option<()>, OutboxError> {
        match action.verdict(current) {
            Verdict::Unchanged => return Ok(None),
            Verdict::Refuse(error) => return Err(error),
            Verdict::Apply => {}
        }
        let name = self.inner.config.name.as_str();
        if let Action::Delivered { .. } = action {
            let seq = i64::try_from(current.seq).unwrap_or(i64::MAX);
            let earlier = client
                .query_typed(
                    "SELECT event_id, state FROM twopc.pg_outbox WHERE participant = $1 \
                     AND aggregate = $2 AND seq < $3 AND state IN ('pending', 'failed') \
                     ORDER BY seq LIMIT 1",
                    &[
                        (&name, Type::TEXT),
                        (&current.aggregate.as_str(), Type::TEXT),
                        (&seq, Type::INT8),
                    ],
                )
                .await
                .map_err(|e| db("looking for earlier open intents", &e))?;
            if let Some(row) = earlier.first() {
                let (id, state): (String, String) = (row.get(0), row.get(1));
                return Err(OutboxError::OutOfOrder(format!(
                    "intent {} (seq {}) of {} is behind {id}, which is still {state}: intents of \
                     one aggregate are delivered in order",
                    current.event_id, current.seq, current.aggregate
                )));
            }
        }
        let (sql, texts) = action.update();
        let [a, b, c] = texts;
        let params: [(&(dyn ToSql + Sync), Type); 5] = [
            (&name, Type::TEXT),
            (&current.event_id.as_str(), Type::TEXT),
            (&a, Type::TEXT),
            (&b, Type::TEXT),
            (&c, Type::TEXT),
        ];
        client
            .execute_typed(&sql, &params)
            .await
            .map_err(|e| db("updating the intent", &e))?;
        Ok(Some(()))
    }

    /// Counts and logs a committed change (the marks are the audit; the log says it too).
    fn after(&self, event_id: &str, action: &Action) {
        match action {
            Action::Delivered { .. } => {
                self.inner
                    .metrics
                    .outbox_delivered
                    .fetch_add(1, Ordering::Relaxed);
            }
            Action::Attempt { error, permanent } => {
                self.inner
                    .metrics
                    .outbox_attempts_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(event_id, permanent, error = %cut_error(error), "delivery attempt");
            }
            Action::Retry { operator, reason } => {
                tracing::warn!(
                    event_id,
                    operator,
                    reason,
                    "outbox: an operator retried an intent"
                );
            }
            Action::Mark {
                operator,
                reason,
                state,
            } => tracing::warn!(
                event_id,
                operator,
                reason,
                state = state_text(*state),
                "outbox: an operator marked an intent"
            ),
        }
    }

    /// Drops delivered and abandoned intents settled longer ago than the retention, and op ids
    /// recorded longer ago; returns the intents dropped. Never a pending or failed one.
    pub async fn prune_outbox(&self) -> Result<u64, OutboxError> {
        let session = self
            .inner
            .pool
            .get(Side::Decide)
            .await
            .map_err(|e| OutboxError::Database(e.to_string()))?;
        let client = session.client();
        let name = self.inner.config.name.as_str();
        let seconds = self.inner.config.outbox_retention_ms as f64 / 1000.0;
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&name, Type::TEXT), (&seconds, Type::FLOAT8)];
        let (intents, ops) = tokio::join!(
            client.execute_typed(
                "DELETE FROM twopc.pg_outbox WHERE participant = $1 \
                 AND state IN ('delivered', 'abandoned') \
                 AND settled_at < now() - $2 * interval '1 second'",
                &params,
            ),
            client.execute_typed(
                "DELETE FROM twopc.pg_ops WHERE participant = $1 \
                 AND recorded_at < now() - $2 * interval '1 second'",
                &params,
            ),
        );
        ops.map_err(|e| db("pruning op ids", &e))?;
        intents.map_err(|e| db("pruning the outbox", &e))
    }

    /// Prunes every quarter of the retention (at least every minute, at most every 50 ms).
    pub fn spawn_outbox_pruner(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let every =
            Duration::from_millis((this.inner.config.outbox_retention_ms / 4).clamp(50, 60_000));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match this.prune_outbox().await {
                    Ok(0) => {}
                    Ok(dropped) => {
                        tracing::info!(dropped, "outbox: settled intents past retention dropped")
                    }
                    Err(error) => tracing::warn!(%error, "outbox: pruning failed; retrying later"),
                }
            }
        })
    }
}

fn not_found(event_id: &str) -> OutboxError {
    OutboxError::NotFound(format!("no intent {event_id:?} in this outbox"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_name_the_states_they_admit() {
        assert_eq!(states(StateFilter::Open), "pending,failed");
        assert_eq!(states(StateFilter::One(IntentState::Failed)), "failed");
        assert_eq!(states(StateFilter::All).split(',').count(), 4);
    }
}
