//! Phase two: `COMMIT PREPARED` / `ROLLBACK PREPARED` of a decision (sent with others waiting,
//! `super::phase_two`), and what a gid this database no longer holds means: idempotent, a gid
//! is "already committed" only if its attempt's outcome row says so (see `super::schema`; the
//! row's key is the gid without the txid, `PgParticipant::outcome_key`); a commit for a gid
//! never prepared is 409 `not_prepared`; an abort leaves a tombstone (an `aborted` outcome
//! row), whether it rolled a prepared transaction back or found none, so a late prepare votes no.

use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::DecisionRequest;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::backend::{
    AFTER_COMMIT_PREPARED, AFTER_ROLLBACK_PREPARED, PgParticipant, PgRequestError,
};
use super::error::{PgError, describe};
use super::gid::Gid;
use super::phase_two::Finish;
use super::policy::{self, AbortMissing, CommitMissing, Recorded};
use super::pool::Side;
use super::work::PgWork;
use crate::crash::crash_point;
use crate::rejection::Rejection;

/// How long an abort waits for a prepare of the same attempt still running here.
const ABORT_WAITS_FOR_PREPARE_MS: u64 = 30_000;

impl<W: PgWork> PgParticipant<W> {
    /// Phase two, commit: `COMMIT PREPARED`, or an ack if the outcome row shows it done.
    pub async fn commit(&self, request: DecisionRequest) -> Result<(), PgRequestError> {
        Self::check_owner(&request.gtid, &request.coordinator_id)?;
        let gid = self.gid_of(&request.gtid, &request.txid)?;
        self.fence(
            request.coordinator_id.as_str(),
            request.epoch.0,
            Side::Decide,
        )
        .await?;
        self.commit_gid(&gid).await?;
        crash_point(AFTER_COMMIT_PREPARED);
        Ok(())
    }

    pub(crate) async fn commit_gid(&self, gid: &Gid) -> Result<(), PgRequestError> {
        let finished = self.inner.phase_two.finish(Finish::Commit, gid).await?;
        if finished.as_ref().map_or_else(
            |e| policy::gid_missing(e.code().map(SqlState::code)),
            |()| true,
        ) {
            self.inner.held.ended(gid.as_str(), &self.inner.preparing);
        }
        match finished {
            Ok(()) => {
                // The intent row went with the transaction (it deleted it before preparing).
                self.inner.metrics.commits.fetch_add(1, Ordering::Relaxed);
                self.forget_answer(gid);
                tracing::debug!(%gid, "committed");
                Ok(())
            }
            Err(error) if policy::gid_missing(error.code().map(SqlState::code)) => {
                let session = self.inner.pool.get(Side::Decide).await?;
                let key = self.outcome_key(gid);
                self.refuse_another_txid(session.client(), gid, &key)
                    .await?;
                match policy::commit_missing(outcome(session.client(), &key).await?) {
                    CommitMissing::AlreadyCommitted => Ok(()),
                    CommitMissing::Contradiction => Err(PgRequestError::Contradiction(format!(
                        "{gid} was aborted here; it cannot commit"
                    ))),
                    CommitMissing::NeverPrepared => Err(Rejection::NotPrepared {
                        gtid: self.inner.prefix.gtid_of(gid.as_str()).ok_or_else(|| {
                            Rejection::InvalidPayload(format!("{gid} has another prefix"))
                        })?,
                        why: "was never prepared here (no prepared transaction and no \
                              outcome row in this database)"
                            .into(),
                    }
                    .into()),
                }
            }
            Err(error) => Err(PgError::db(format!("COMMIT PREPARED {gid}"), error).into()),
        }
    }

    /// Phase two, abort: `ROLLBACK PREPARED`, or a tombstone if it was never prepared (a late
    /// prepare then votes no).
    pub async fn abort(&self, request: DecisionRequest) -> Result<(), PgRequestError> {
        Self::check_owner(&request.gtid, &request.coordinator_id)?;
        let gid = self.gid_of(&request.gtid, &request.txid)?;
        self.fence(
            request.coordinator_id.as_str(),
            request.epoch.0,
            Side::Decide,
        )
        .await?;
        self.abort_gid(&gid).await
    }

    pub(crate) async fn abort_gid(&self, gid: &Gid) -> Result<(), PgRequestError> {
        let key = self.outcome_key(gid);
        let mut waited_ms = 0;
        loop {
            match self.inner.phase_two.finish(Finish::Rollback, gid).await? {
                Ok(()) => {
                    self.inner.held.ended(gid.as_str(), &self.inner.preparing);
                    self.inner.metrics.aborts.fetch_add(1, Ordering::Relaxed);
                    crash_point(AFTER_ROLLBACK_PREPARED);
                    // The tombstone an abort of a gid never prepared leaves, durable before the
                    // ack: a prepare of it arriving late (a retried message the abort overtook)
                    // then votes no instead of preparing it again. Rolled back with the
                    // transaction, its intent's removal is undone: the intent goes with it. If
                    // this fails, the abort is not acked; its resend finds nothing prepared and
                    // takes the path below, which writes the same tombstone.
                    let mut session = self.inner.pool.get(Side::Decide).await?;
                    session.busy();
                    let recorded = session
                        .client()
                        .batch_execute(&format!(
                            "BEGIN; INSERT INTO twopc.pg_outcomes (gid, outcome) \
                             VALUES ({key}, 'aborted') ON CONFLICT (gid) DO NOTHING; \
                             DELETE FROM twopc.pg_intents WHERE gid = {gid}; COMMIT",
                            key = key.literal(),
                            gid = gid.literal()
                        ))
                        .await;
                    if let Err(error) = recorded {
                        // Its transaction may be left open, failed: the session is not reused.
                        session.discard();
                        return Err(PgError::db("recording the rollback", error).into());
                    }
                    session.idle();
                    self.forget_answer(gid);
                    tracing::debug!(%gid, "rolled back");
                    return Ok(());
                }
                Err(error) if policy::gid_missing(error.code().map(SqlState::code)) => {}
                Err(error) => {
                    return Err(PgError::db(format!("ROLLBACK PREPARED {gid}"), error).into());
                }
            }
            let running = self
                .inner
                .preparing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(gid.as_str());
            if policy::abort_missing(running) == AbortMissing::WaitForPrepare {
                // Its prepare is still running here: roll it back once it is prepared (or
                // find it voted no).
                if waited_ms >= ABORT_WAITS_FOR_PREPARE_MS {
                    return Err(PgRequestError::Busy(format!(
                        "a prepare of {gid} is still running here; retry the abort"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                waited_ms += 10;
                continue;
            }
            // Never prepared (or already rolled back): a tombstone, so a late prepare votes no.
            // A committed outcome row makes the insert a no-op, and the abort a contradiction.
            let session = self.inner.pool.get(Side::Decide).await?;
            let client = session.client();
            self.refuse_another_txid(client, gid, &key).await?;
            self.inner.held.ended(gid.as_str(), &self.inner.preparing);
            client
                .execute(
                    "INSERT INTO twopc.pg_outcomes (gid, outcome) VALUES ($1, 'aborted') \
                     ON CONFLICT (gid) DO NOTHING",
                    &[&key.as_str()],
                )
                .await
                .map_err(|e| PgError::db("recording the abort", e))?;
            if !policy::abort_acked(outcome(client, &key).await?) {
                return Err(PgRequestError::Contradiction(format!(
                    "{gid} was committed here; it cannot abort"
                )));
            }
            self.forget(client, gid).await;
            return Ok(());
        }
    }

    /// Refuses (409 `id_conflict`) a decision whose gid is not the one its attempt is
    /// preparing or prepared under here: the same gtid with another txid, so a decision that
    /// names the wrong transaction. It must not touch that transaction, and its tombstone would
    /// wait on that transaction's uncommitted outcome row until it is decided.
    async fn refuse_another_txid(
        &self,
        client: &tokio_postgres::Client,
        gid: &Gid,
        key: &Gid,
    ) -> Result<(), PgRequestError> {
        let preparing = self
            .inner
            .preparing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|other| {
                other.as_str() != gid.as_str()
                    && Gid::new((*other).clone())
                        .is_ok_and(|other| self.outcome_key(&other) == *key)
            })
            .cloned();
        let other = match preparing {
            Some(other) => Some(other),
            None => client
                .query_typed_opt(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
                     AND gid <> $1 AND (gid = $2 OR left(gid, length($2) + 1) = $2 || '+') \
                     LIMIT 1",
                    &[(&gid.as_str(), Type::TEXT), (&key.as_str(), Type::TEXT)],
                )
                .await
                .map_err(|e| PgError::db("looking for the attempt's gid", e))?
                .map(|row| row.get::<_, String>(0)),
        };
        match other {
            Some(other) => Err(PgRequestError::Contradiction(format!(
                "the attempt of {gid} is prepared here as {other}: this decision names another                  transaction id"
            ))),
            None => Ok(()),
        }
    }

    fn forget_answer(&self, gid: &Gid) {
        self.inner
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(gid.as_str());
    }

    /// Drops the intent of a gid rolled back or never prepared (best effort, and committed
    /// asynchronously: a leftover intent only costs a row).
    async fn forget(&self, client: &tokio_postgres::Client, gid: &Gid) {
        self.forget_answer(gid);
        if let Err(error) = client
            .batch_execute(&format!(
                "BEGIN; SET LOCAL synchronous_commit = off; \
                 DELETE FROM twopc.pg_intents WHERE gid = {}; COMMIT",
                gid.literal()
            ))
            .await
        {
            tracing::warn!(%gid, error = %describe(&error), "could not drop the intent row");
        }
    }
}

/// The recorded outcome of an attempt (its outcome row under `key`), if any.
async fn outcome(
    client: &tokio_postgres::Client,
    key: &Gid,
) -> Result<Option<Recorded>, PgRequestError> {
    let row = client
        .query_typed_opt(
            "SELECT outcome FROM twopc.pg_outcomes WHERE gid = $1",
            &[(&key.as_str(), Type::TEXT)],
        )
        .await
        .map_err(|e| PgError::db("reading the outcome row", e))?;
    Ok(row.and_then(|row| Recorded::parse(row.get(0))))
}
