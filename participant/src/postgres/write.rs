//! The local write (`POST /v1/pg/write`, docs/postgres.md "The outbox"): one named statement
//! and the intents it leads to, in one local PostgreSQL transaction outside 2PC.
//!
//! In order, on one session: `BEGIN` (with `synchronous_commit = on`, so `COMMIT` returns only
//! once the WAL is flushed: durable before answered); the op id's row in `twopc.pg_ops` (a
//! repeat finds it and answers the first answer; a concurrent repeat waits for the first to
//! end); with a `fence`, the resource's highest token raised (`super::fence`: a token the
//! policy refuses rolls back; a stale one commits only its refusal, kept with the op id); the
//! statement; its row count against the declared `guards_intent` (another count rolls
//! back: no write, no intent, `condition_failed`); per intent, its aggregate's counter bumped
//! (which locks that aggregate until commit, so seq follows commit order) and its outbox row;
//! the answer stored with the op id; `COMMIT`. It must never record an intent whose guarding
//! statement did not have its count, never run a statement under a token below its resource's
//! highest, and never answer before the `COMMIT` returned.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use protocol::ids::check_id;
use protocol::outbox::{
    INTENTS_PER_WRITE_MAX, IntentRef, OUTBOX_ID_LEN_MAX, PgWriteRequest, PgWriteResponse,
};
use serde::{Deserialize, Serialize};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::backend::PgParticipant;
use super::error::describe;
use super::fence::{Raised, judge, raise};
use super::pool::{Session, Side};
use super::work::{PgWork, RunError};
use crate::crash::crash_point;
use crate::fence::{FenceRefusal, StaleToken};

/// Crash point: the local write's transaction committed, the answer not yet sent.
pub const AFTER_OUTBOX_WRITE_COMMITTED: &str = "participant::pg_after_outbox_write_committed";

/// Why a local write wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// 422 `invalid_id`.
    #[error("{0}")]
    InvalidId(String),
    /// 422 `invalid_payload`: an unknown statement, parameters that do not fit, bad intents.
    #[error("{0}")]
    Invalid(String),
    /// 409 `condition_failed`: the guarding statement's row count, or a constraint.
    #[error("{0}")]
    ConditionFailed(String),
    /// 409 `id_conflict`: an event id another write recorded.
    #[error("{0}")]
    IdConflict(String),
    /// 409 `op_id_conflict`: the op id was used for another request.
    #[error("{0}")]
    OpIdConflict(String),
    /// 409 `stale_token` with the highest token: a higher token was accepted for the fence's
    /// resource. Kept with the op id: a repeat is refused again.
    #[error(transparent)]
    Stale(StaleToken),
    /// 409 `invalid_fence_proof` or `token_too_high`: a token the participant cannot trust
    /// (nothing kept, the op id stays free).
    #[error(transparent)]
    Fence(FenceRefusal),
    /// 503 `not_ready`: PostgreSQL unreachable, a lock wait or a serialization failure; the
    /// client repeats the op id.
    #[error("PostgreSQL: {0}")]
    Database(String),
}

impl WriteError {
    /// A statement's database error: a constraint is a failed condition; a lock wait, a
    /// serialization failure or a lost session is worth a retry; anything else is the request's.
    fn from_statement(name: &str, error: &tokio_postgres::Error) -> Self {
        let message = format!("statement {name:?}: {}", describe(error));
        match error.code().map(SqlState::code) {
            Some(code) if code.starts_with("23") => WriteError::ConditionFailed(format!(
                "{message}; nothing written, no intent recorded"
            )),
            Some(code) if code.starts_with("40") || code == "55P03" || code == "57014" => {
                WriteError::Database(message)
            }
            Some(_) => WriteError::Invalid(message),
            None => WriteError::Database(message),
        }
    }

    fn db(context: &str, error: &tokio_postgres::Error) -> Self {
        WriteError::Database(format!("{context}: {}", describe(error)))
    }
}

/// Checks what can be checked without the database.
fn check(request: &PgWriteRequest) -> Result<(), WriteError> {
    check_id("op_id", &request.op_id, OUTBOX_ID_LEN_MAX)
        .map_err(|e| WriteError::InvalidId(e.to_string()))?;
    if let Some(fence) = &request.fence {
        crate::fence::check_claim_ids(fence).map_err(|e| WriteError::InvalidId(e.to_string()))?;
    }
    if request.next.len() > INTENTS_PER_WRITE_MAX {
        return Err(WriteError::Invalid(format!(
            "{} intents; a write carries at most {INTENTS_PER_WRITE_MAX}",
            request.next.len()
        )));
    }
    let mut seen = HashSet::new();
    for intent in &request.next {
        intent
            .check_ids()
            .map_err(|e| WriteError::InvalidId(e.to_string()))?;
        if !seen.insert(intent.event_id.as_str()) {
            return Err(WriteError::Invalid(format!(
                "event_id {:?} appears twice in this write",
                intent.event_id
            )));
        }
    }
    Ok(())
}

/// Ends the open transaction; a session whose rollback failed is closed (PostgreSQL then rolls
/// back for us).
async fn rollback(mut session: Session<'_>) {
    if session.client().batch_execute("ROLLBACK").await.is_ok() {
        session.idle();
    } else {
        session.discard();
    }
}

const CLAIM_OP_SQL: &str = "INSERT INTO twopc.pg_ops (participant, op_id, request) \
    VALUES ($1, $2, $3) ON CONFLICT (participant, op_id) DO NOTHING RETURNING 1";
const NEXT_SEQ_SQL: &str = "INSERT INTO twopc.pg_outbox_aggregates \
    (participant, aggregate, last_seq) VALUES ($1, $2, 1) \
    ON CONFLICT (participant, aggregate) \
    DO UPDATE SET last_seq = twopc.pg_outbox_aggregates.last_seq + 1 RETURNING last_seq";
const INSERT_INTENT_SQL: &str = "INSERT INTO twopc.pg_outbox \
    (participant, event_id, aggregate, seq, target, type, body, op_id) \
    VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8) \
    ON CONFLICT (participant, event_id) DO NOTHING RETURNING 1";
const STORE_ANSWER_SQL: &str =
    "UPDATE twopc.pg_ops SET answer = $3 WHERE participant = $1 AND op_id = $2";

/// What `twopc.pg_ops.answer` holds: the answer, or the stale-token refusal (answers stored
/// before fences are plain answers, which this reads unchanged).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Stored {
    Stale { stale: StaleToken },
    Applied(PgWriteResponse),
}

impl<W: PgWork> PgParticipant<W> {
    /// A local write: the statement and its intents committed together, or nothing.
    pub async fn write(&self, request: PgWriteRequest) -> Result<PgWriteResponse, WriteError> {
        check(&request)?;
        let name = self.inner.config.name.as_str();
        let text = serde_json::to_string(&request)
            .map_err(|e| WriteError::Invalid(format!("the request does not encode: {e}")))?;
        let mut session = self
            .inner
            .pool
            .get(Side::Prepare)
            .await
            .map_err(|e| WriteError::Database(e.to_string()))?;
        let wait = self.inner.config.lock_wait_max_ms.max(1);
        session.busy();
        let client = session.client();
        let begin =
            format!("BEGIN; SET LOCAL synchronous_commit = on; SET LOCAL lock_timeout = {wait}");
        let op_id = request.op_id.as_str();
        let text_param = text.as_str();
        let claim: [(&(dyn ToSql + Sync), Type); 3] = [
            (&name, Type::TEXT),
            (&op_id, Type::TEXT),
            (&text_param, Type::TEXT),
        ];
        // The fence statement goes out behind the claim in the same round trip: if the claim
        // finds a repeat, or the policy refuses the token, the rollback undoes it.
        let raising = async {
            match &request.fence {
                Some(fence) => Some(raise(client, name, fence).await),
                None => None,
            }
        };
        let (began, claimed, raised) = tokio::join!(
            biased;
            client.batch_execute(&begin),
            client.query_typed(CLAIM_OP_SQL, &claim),
            raising,
        );
        if let Err(error) = began {
            session.discard();
            return Err(WriteError::db("beginning the write", &error));
        }
        let claimed = match claimed {
            Ok(rows) => !rows.is_empty(),
            Err(error) => {
                rollback(session).await;
                return Err(WriteError::db("claiming the op id", &error));
            }
        };
        if !claimed {
            rollback(session).await;
            return self.first_answer(&request.op_id, &text).await;
        }
        if let (Some(fence), Some(raised)) = (&request.fence, raised) {
            let judged = match raised {
                Ok(raised) => judge(client, name, &self.inner.config.fence, fence, raised).await,
                Err(error) => Err(error),
            };
            match judged {
                Ok(Ok(Raised::Raised)) => {}
                Ok(Ok(Raised::Stale(stale))) => {
                    return self.refuse_stale(session, &request.op_id, stale).await;
                }
                Ok(Err(refusal)) => {
                    rollback(session).await;
                    return Err(WriteError::Fence(refusal));
                }
                Err(error) => {
                    rollback(session).await;
                    return Err(WriteError::Database(error.0));
                }
            }
        }
        let ran = match self
            .inner
            .work
            .run_statement(client, &request.statement, &request.params)
            .await
        {
            Ok(ran) => ran,
            Err(RunError::Invalid(message)) => {
                rollback(session).await;
                return Err(WriteError::Invalid(message));
            }
            Err(RunError::Db(error)) => {
                rollback(session).await;
                return Err(WriteError::from_statement(&request.statement, &error));
            }
        };
        if let Some(expected) = ran.expected
            && ran.rows != expected
        {
            rollback(session).await;
            return Err(WriteError::ConditionFailed(format!(
                "statement {:?} affected {} rows, expected {expected}: nothing written, no \
                 intent recorded",
                request.statement, ran.rows
            )));
        }
        let mut intents = Vec::with_capacity(request.next.len());
        for intent in &request.next {
            match self.record_intent(client, intent, &request.op_id).await {
                Ok(seq) => intents.push(IntentRef {
                    event_id: intent.event_id.clone(),
                    aggregate: intent.aggregate.clone(),
                    seq,
                }),
                Err(error) => {
                    rollback(session).await;
                    return Err(error);
                }
            }
        }
        let response = PgWriteResponse {
            op_id: request.op_id.clone(),
            rows: ran.rows,
            returned: ran.returned,
            intents,
        };
        let answer = serde_json::to_string(&Stored::Applied(response.clone()))
            .map_err(|e| WriteError::Invalid(format!("the answer does not encode: {e}")))?;
        let answer_param = answer.as_str();
        let store: [(&(dyn ToSql + Sync), Type); 3] = [
            (&name, Type::TEXT),
            (&op_id, Type::TEXT),
            (&answer_param, Type::TEXT),
        ];
        let stored = client.execute_typed(STORE_ANSWER_SQL, &store).await;
        if let Err(error) = stored {
            rollback(session).await;
            return Err(WriteError::db("storing the answer", &error));
        }
        if let Err(error) = client.batch_execute("COMMIT").await {
            // Committed or not, we cannot tell: the client repeats the op id, which answers
            // the first answer if it did.
            session.discard();
            return Err(WriteError::db(
                "committing (the outcome is unknown; repeat the op id)",
                &error,
            ));
        }
        session.idle();
        crash_point(AFTER_OUTBOX_WRITE_COMMITTED);
        self.inner
            .metrics
            .outbox_intents_written
            .fetch_add(response.intents.len() as u64, Ordering::Relaxed);
        tracing::debug!(op_id = %response.op_id, intents = response.intents.len(), "local write");
        Ok(response)
    }

    /// A stale token: nothing ran but the op id's claim, which now keeps the refusal, so a
    /// repeat is refused again whatever the highest token becomes. Committed before answered.
    async fn refuse_stale(
        &self,
        mut session: Session<'_>,
        op_id: &str,
        stale: StaleToken,
    ) -> Result<PgWriteResponse, WriteError> {
        let answer = match serde_json::to_string(&Stored::Stale {
            stale: stale.clone(),
        }) {
            Ok(answer) => answer,
            Err(e) => {
                rollback(session).await;
                return Err(WriteError::Invalid(format!(
                    "the refusal does not encode: {e}"
                )));
            }
        };
        let name = self.inner.config.name.as_str();
        let answer_param = answer.as_str();
        let store: [(&(dyn ToSql + Sync), Type); 3] = [
            (&name, Type::TEXT),
            (&op_id, Type::TEXT),
            (&answer_param, Type::TEXT),
        ];
        let client = session.client();
        if let Err(error) = client.execute_typed(STORE_ANSWER_SQL, &store).await {
            rollback(session).await;
            return Err(WriteError::db("keeping the refusal", &error));
        }
        if let Err(error) = client.batch_execute("COMMIT").await {
            session.discard();
            return Err(WriteError::db(
                "committing the refusal (repeat the op id)",
                &error,
            ));
        }
        session.idle();
        tracing::debug!(op_id, %stale, "stale token");
        Err(WriteError::Stale(stale))
    }

    /// One intent's seq and row; `IdConflict` when its event id is taken.
    async fn record_intent(
        &self,
        client: &tokio_postgres::Client,
        intent: &protocol::outbox::Intent,
        op_id: &str,
    ) -> Result<u64, WriteError> {
        let name = self.inner.config.name.as_str();
        let aggregate = intent.aggregate.as_str();
        let seq_params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&name, Type::TEXT), (&aggregate, Type::TEXT)];
        let seq: i64 = client
            .query_typed(NEXT_SEQ_SQL, &seq_params)
            .await
            .map_err(|e| WriteError::from_statement("the aggregate's seq", &e))?
            .first()
            .map(|row| row.get(0))
            .ok_or_else(|| WriteError::Database("the aggregate's seq came back empty".into()))?;
        let body = intent.body.to_string();
        let (event_id, target, kind, body) = (
            intent.event_id.as_str(),
            intent.target.as_str(),
            intent.kind.as_str(),
            body.as_str(),
        );
        let params: [(&(dyn ToSql + Sync), Type); 8] = [
            (&name, Type::TEXT),
            (&event_id, Type::TEXT),
            (&aggregate, Type::TEXT),
            (&seq, Type::INT8),
            (&target, Type::TEXT),
            (&kind, Type::TEXT),
            (&body, Type::TEXT),
            (&op_id, Type::TEXT),
        ];
        let inserted = client
            .query_typed(INSERT_INTENT_SQL, &params)
            .await
            .map_err(|e| WriteError::from_statement("the outbox row", &e))?;
        if inserted.is_empty() {
            return Err(WriteError::IdConflict(format!(
                "event_id {:?} names an intent another write recorded here; an event id names \
                 one intent: nothing written",
                intent.event_id
            )));
        }
        Ok(u64::try_from(seq).unwrap_or(0))
    }

    /// The answer stored under an op id, for a repeat of the same request.
    async fn first_answer(&self, op_id: &str, text: &str) -> Result<PgWriteResponse, WriteError> {
        let session = self
            .inner
            .pool
            .get(Side::Decide)
            .await
            .map_err(|e| WriteError::Database(e.to_string()))?;
        let name = self.inner.config.name.as_str();
        let key: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&op_id, Type::TEXT)];
        let row = session
            .client()
            .query_typed(
                "SELECT request, answer FROM twopc.pg_ops WHERE participant = $1 AND op_id = $2",
                &key,
            )
            .await
            .map_err(|e| WriteError::db("reading the op id's answer", &e))?;
        let Some(row) = row.first() else {
            // Rolled back between our two looks (an op of the same id that then failed): the
            // op id is free again.
            return Err(WriteError::Database(format!(
                "op id {op_id:?} was taken by a write that then failed; repeat it"
            )));
        };
        let (request, answer): (String, Option<String>) = (row.get(0), row.get(1));
        if request != text {
            return Err(WriteError::OpIdConflict(format!(
                "op id {op_id:?} was used for another request here; an op id names one write"
            )));
        }
        let answer = answer
            .ok_or_else(|| WriteError::Database(format!("op id {op_id:?} has no answer stored")))?;
        match serde_json::from_str(&answer) {
            Ok(Stored::Applied(response)) => Ok(response),
            Ok(Stored::Stale { stale }) => Err(WriteError::Stale(stale)),
            Err(e) => Err(WriteError::Database(format!(
                "op id {op_id:?}'s stored answer: {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_answers_from_before_fences_read_as_answers_and_refusals_as_refusals() {
        let old = r#"{"op_id":"w","rows":1,"returned":[{"version":4}],"intents":[]}"#;
        assert!(matches!(
            serde_json::from_str::<Stored>(old),
            Ok(Stored::Applied(PgWriteResponse { rows: 1, .. }))
        ));
        let stale = StaleToken {
            resource: "r".into(),
            token: 5,
            highest: 7,
        };
        let text = serde_json::to_string(&Stored::Stale {
            stale: stale.clone(),
        })
        .unwrap();
        assert!(text.starts_with(r#"{"stale":"#), "{text}");
        assert!(matches!(
            serde_json::from_str::<Stored>(&text),
            Ok(Stored::Stale { stale: read }) if read == stale
        ));
    }
}
