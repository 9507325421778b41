//! The protocol mapped onto PostgreSQL's two-phase commit.
//!
//! Prepare, in two round trips on one session: `BEGIN`, the `committed` outcome row (seen only
//! once the transaction commits) and the service's work, all sent together; then, once their
//! answers (row counts included) are checked, `PREPARE TRANSACTION '<gid>'`, then yes: the
//! prepared state is durable in PostgreSQL's own WAL (`PREPARE TRANSACTION` flushes it). The
//! gid carries the txid a decision query needs (`super::gid`); where it does not fit, an
//! intent row carries it, written first in a transaction of its own (made durable by the same
//! flush) and removed by the prepared transaction; the statements are in `super::prepare_sql`.
//! Only a gid this process may hold prepared (`super::held`) looks at `pg_prepared_xacts`
//! first. Commit / abort: `super::decide`, on phase-two sessions (`super::phase_two`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use protocol::{ErrorCode, PrepareRequest, Vote};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::config::PgConfig;
use super::error::PgError;
use super::gid::{Gid, GidPrefix};
use super::held::Held;
use super::metrics::PgMetrics;
use super::phase_two::PhaseTwo;
use super::policy::{self, Fence, Known};
use super::pool::{Pool, Side};
use super::prepare_sql::{
    FIRST_INTENT_SQL, FIRST_OUTCOME_SQL, FORGET_SQL, INTENT_SQL, INTENT_TYPES, OUTCOME_SQL, lookup,
    prepare_refusal,
};
use super::schema;
use super::work::{PgWork, WorkRefusal};
use crate::api_error::ApiError;
use crate::crash::crash_point;
use crate::rejection::Rejection;

/// Crash point: `PREPARE TRANSACTION` returned, the yes vote not yet sent.
pub const AFTER_PREPARE_TRANSACTION: &str = "participant::pg_after_prepare_transaction";
/// Crash point: `COMMIT PREPARED` returned, the ack not yet sent.
pub const AFTER_COMMIT_PREPARED: &str = "participant::pg_after_commit_prepared";
/// Crash point: `ROLLBACK PREPARED` returned, the `aborted` tombstone not yet written.
pub const AFTER_ROLLBACK_PREPARED: &str = "participant::pg_after_rollback_prepared";

/// Why a protocol request got no vote or ack.
#[derive(Debug, thiserror::Error)]
pub enum PgRequestError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// PostgreSQL could not be reached or failed; the sender retries.
    #[error("PostgreSQL: {0}")]
    Database(String),
    /// A prepare of the same attempt is still running; retry.
    #[error("{0}")]
    Busy(String),
    /// The decision contradicts what PostgreSQL already holds (an abort of a committed gid).
    #[error("{0}")]
    Contradiction(String),
}

impl From<PgRequestError> for ApiError {
    fn from(error: PgRequestError) -> Self {
        let code = match &error {
            PgRequestError::Rejected(rejection) => return ApiError::rejected(rejection),
            PgRequestError::Database(_) | PgRequestError::Busy(_) => ErrorCode::NotReady,
            PgRequestError::Contradiction(_) => ErrorCode::IdConflict,
        };
        ApiError::new(code, error.to_string())
    }
}

impl From<PgError> for PgRequestError {
    fn from(error: PgError) -> Self {
        PgRequestError::Database(error.to_string())
    }
}

pub(crate) struct Inner<W: PgWork> {
    pub(crate) work: W,
    /// The work's statements kept prepared on every prepare session ([`PgWork::prepared_sql`]).
    work_sql: Vec<(String, Vec<Type>)>,
    pub(crate) pool: Arc<Pool>,
    /// Decisions waiting for a phase-two session, sent together.
    pub(crate) phase_two: Arc<PhaseTwo>,
    pub(crate) prefix: GidPrefix,
    pub(crate) config: PgConfig,
    /// Highest epoch seen per coordinator id (mirrors `twopc.pg_epochs`).
    epochs: Mutex<HashMap<String, u64>>,
    /// Gids whose prepare runs in this process now.
    pub(crate) preparing: Mutex<HashSet<String>>,
    /// Gids that may be prepared in this database now: their prepares take the careful path.
    pub(crate) held: Held,
    /// The coordinator's last answer per in-doubt gid, for `/v1/prepared`.
    pub(crate) answers: Mutex<HashMap<String, String>>,
    pub(crate) metrics: Arc<PgMetrics>,
    /// Whom in-doubt transactions are asked about (`decision_client`).
    pub(crate) coordinators: crate::decision_client::Coordinators,
    pub(crate) max_prepared: i64,
}

/// A participant whose resource is a PostgreSQL database. Cheap to clone.
pub struct PgParticipant<W: PgWork> {
    pub(crate) inner: Arc<Inner<W>>,
}

impl<W: PgWork> Clone for PgParticipant<W> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<W: PgWork> std::fmt::Debug for PgParticipant<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgParticipant")
            .field("url", &self.inner.pool.shown_url())
            .field("prefix", &self.inner.prefix.as_str())
            .finish_non_exhaustive()
    }
}

/// Removes a gid from the preparing set when the prepare ends, however it ends.
struct Preparing<'a> {
    set: &'a Mutex<HashSet<String>>,
    gid: String,
}

impl Drop for Preparing<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.gid);
    }
}

impl<W: PgWork> PgParticipant<W> {
    /// Connects, refuses a server with `max_prepared_transactions = 0`, creates the
    /// bookkeeping tables and loads the epochs. In-doubt transactions left by an earlier run
    /// are resolved by [`PgParticipant::spawn_resolver`].
    pub async fn start(config: PgConfig, work: W) -> Result<Self, PgError> {
        let prefix = GidPrefix::new(&config.name)?;
        let pool = Arc::new(Pool::new(
            &config.url,
            config.connections,
            config.decision_connections,
        )?);
        let metrics = Arc::new(PgMetrics::default());
        let phase_two = PhaseTwo::new(Arc::clone(&pool), Arc::clone(&metrics));
        let client = pool.connect().await?;
        let max_prepared = schema::check_and_create(&client).await?;
        let rows = client
            .query("SELECT coordinator_id, epoch FROM twopc.pg_epochs", &[])
            .await
            .map_err(|e| PgError::db("reading twopc.pg_epochs", e))?;
        let epochs = rows
            .iter()
            .map(|row| {
                let epoch: i64 = row.get(1);
                (row.get::<_, String>(0), u64::try_from(epoch).unwrap_or(0))
            })
            .collect();
        // Before serving: a repeated prepare of a gid prepared by an earlier run must take the
        // careful path.
        let prepared = client
            .query(
                "SELECT gid FROM pg_prepared_xacts \
                 WHERE database = current_database() AND gid LIKE $1",
                &[&prefix.like_pattern()],
            )
            .await
            .map_err(|e| PgError::db("listing pg_prepared_xacts", e))?;
        let held = Held::seeded(prepared.iter().map(|row| row.get::<_, String>(0)));
        let http = crate::decision_client::build(
            config.decision_timeout_ms,
            config.coordinator_tls.clone(),
        )?;
        let coordinators =
            crate::decision_client::Coordinators::new(http, &config.coordinator_urls);
        Ok(Self {
            inner: Arc::new(Inner {
                work_sql: work.prepared_sql(),
                work,
                pool,
                phase_two,
                prefix,
                config,
                epochs: Mutex::new(epochs),
                preparing: Mutex::new(HashSet::new()),
                held,
                answers: Mutex::new(HashMap::new()),
                metrics,
                coordinators,
                max_prepared,
            }),
        })
    }

    /// Counts one batched phase message of `items` items.
    pub(crate) fn count_batch(&self, items: usize) {
        let metrics = &self.inner.metrics;
        metrics.batches.fetch_add(1, Ordering::Relaxed);
        metrics
            .batched_items
            .fetch_add(items as u64, Ordering::Relaxed);
    }

    pub fn config(&self) -> &PgConfig {
        &self.inner.config
    }

    /// The service's work (for services that keep state in it).
    pub fn work(&self) -> &W {
        &self.inner.work
    }

    /// `max_prepared_transactions` of the server, read at start.
    pub fn max_prepared_transactions(&self) -> i64 {
        self.inner.max_prepared
    }

    /// The gid this participant prepares an attempt of `txid` under: with the txid where it
    /// fits (`super::gid`), except for an attempt an earlier version prepared under its gid
    /// without the txid, which may still be prepared here (those are held since the start).
    pub fn gid_of(
        &self,
        gtid: &protocol::GlobalTxId,
        txid: &protocol::TxId,
    ) -> Result<Gid, Rejection> {
        let refused = |e: super::gid::GidError| Rejection::InvalidPayload(e.to_string());
        let gid = self.inner.prefix.gid(gtid, txid).map_err(refused)?;
        if gid.carries_txid() {
            let without = self.inner.prefix.gid_without_txid(gtid).map_err(refused)?;
            if self.inner.held.holds(without.as_str()) {
                return Ok(without);
            }
        }
        Ok(gid)
    }

    /// The key of an attempt's outcome row: its gid without the txid, whichever gid it is
    /// prepared under, so that one attempt has one row (an earlier version keyed every row so,
    /// and a late prepare must find the outcome it recorded).
    pub(crate) fn outcome_key(&self, gid: &Gid) -> Gid {
        self.inner
            .prefix
            .without_txid(gid)
            .unwrap_or_else(|| gid.clone())
    }

    /// The highest epoch recorded for `coordinator_id` (`twopc.pg_epochs`).
    pub(crate) fn highest_epoch(&self, coordinator_id: &str) -> Option<u64> {
        self.inner
            .epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(coordinator_id)
            .copied()
    }

    /// Fencing: 409 `stale_epoch` for an epoch below the highest seen; a higher one is
    /// recorded durably before it is acted on.
    pub(crate) async fn fence(
        &self,
        coordinator_id: &str,
        epoch: u64,
        side: Side,
    ) -> Result<(), PgRequestError> {
        let highest = self
            .inner
            .epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(coordinator_id)
            .copied();
        match policy::fence(highest, epoch, self.inner.config.epoch_jump_max) {
            Fence::Stale { highest } => {
                return Err(Rejection::StaleEpoch {
                    coordinator_id: protocol::CoordinatorId::new(coordinator_id)
                        .map_err(|e| Rejection::InvalidPayload(e.to_string()))?,
                    got: protocol::Epoch(epoch),
                    highest: protocol::Epoch(highest),
                }
                .into());
            }
            Fence::TooHigh => {
                return Err(Rejection::EpochTooHigh {
                    coordinator_id: protocol::CoordinatorId::new(coordinator_id)
                        .map_err(|e| Rejection::InvalidPayload(e.to_string()))?,
                    got: protocol::Epoch(epoch),
                    highest: protocol::Epoch(highest.unwrap_or(0)),
                    max_jump: self.inner.config.epoch_jump_max.unwrap_or(u64::MAX),
                }
                .into());
            }
            Fence::Current => return Ok(()),
            Fence::Raise => {}
        }
        let session = self.inner.pool.get(side).await?;
        let stored = i64::try_from(epoch).unwrap_or(i64::MAX);
        session
            .client()
            .execute(
                "INSERT INTO twopc.pg_epochs (coordinator_id, epoch) VALUES ($1, $2) \
                 ON CONFLICT (coordinator_id) DO UPDATE \
                 SET epoch = GREATEST(twopc.pg_epochs.epoch, EXCLUDED.epoch)",
                &[&coordinator_id, &stored],
            )
            .await
            .map_err(|e| PgError::db("recording the coordinator's epoch", e))?;
        let mut epochs = self.inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
        let entry = epochs.entry(coordinator_id.to_string()).or_insert(epoch);
        *entry = (*entry).max(epoch);
        Ok(())
    }

    pub(crate) fn check_owner(
        gtid: &protocol::GlobalTxId,
        coordinator_id: &protocol::CoordinatorId,
    ) -> Result<(), Rejection> {
        match gtid.parts() {
            Some((owner, _, _)) if owner != coordinator_id.as_str() => {
                Err(Rejection::ForeignAttempt {
                    gtid: gtid.clone(),
                    coordinator_id: coordinator_id.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Phase one. `Ok(Vote::Yes)` only once `PREPARE TRANSACTION` has returned.
    pub async fn prepare(&self, request: PrepareRequest) -> Result<Vote, PgRequestError> {
        Self::check_owner(&request.gtid, &request.coordinator_id)?;
        let gid = self.gid_of(&request.gtid, &request.txid)?;
        self.fence(
            request.coordinator_id.as_str(),
            request.epoch.0,
            Side::Prepare,
        )
        .await?;
        {
            let mut preparing = self
                .inner
                .preparing
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !preparing.insert(gid.as_str().to_string()) {
                return Err(PgRequestError::Busy(format!(
                    "a prepare of {gid} is already running here; retry"
                )));
            }
        }
        let _preparing = Preparing {
            set: &self.inner.preparing,
            gid: gid.as_str().to_string(),
        };
        let vote = self.prepare_gid(&gid, &request).await;
        match &vote {
            Ok(Vote::Yes) => {
                crash_point(AFTER_PREPARE_TRANSACTION);
                self.inner.metrics.votes_yes.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%gid, "prepared, voting yes");
            }
            Ok(Vote::No { reason }) => {
                self.inner.metrics.votes_no.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%gid, %reason, "voting no");
            }
            Err(error) => tracing::info!(%gid, %error, "prepare refused"),
        }
        vote
    }

    async fn prepare_gid(
        &self,
        gid: &Gid,
        request: &PrepareRequest,
    ) -> Result<Vote, PgRequestError> {
        let mut session = self.inner.pool.get(Side::Prepare).await?;
        let position = i64::try_from(request.position).unwrap_or(i64::MAX);
        let epoch = i64::try_from(request.epoch.0).unwrap_or(i64::MAX);
        let incarnation = request.incarnation.to_string();
        let wait_max = self.inner.config.lock_wait_max_ms;
        let wait = request
            .lock_wait_ms
            .unwrap_or(wait_max)
            .min(wait_max)
            .max(1);
        // A gid that carries its txid needs no intent row: the transaction is all there is.
        let with_intent = !gid.carries_txid();
        // The intent's transaction waits for no lock in the normal course; lock_timeout bounds
        // it all the same.
        let intent_begin =
            format!("BEGIN; SET LOCAL synchronous_commit = off; SET LOCAL lock_timeout = {wait}");
        let begin = if with_intent {
            format!("COMMIT; BEGIN; SET LOCAL lock_timeout = {wait}")
        } else {
            format!("BEGIN; SET LOCAL lock_timeout = {wait}")
        };
        let (gid_text, txid, coordinator) = (
            gid.as_str(),
            request.txid.as_str(),
            request.coordinator_id.as_str(),
        );
        let (intent_text, outcome_text) = if self.inner.held.holds(gid_text) {
            (INTENT_SQL, OUTCOME_SQL)
        } else {
            (FIRST_INTENT_SQL, FIRST_OUTCOME_SQL)
        };
        let statements = async {
            let mut work = Vec::with_capacity(self.inner.work_sql.len());
            for (sql, types) in &self.inner.work_sql {
                work.push(session.statement(sql, types).await?);
            }
            let intent = if with_intent {
                Some((
                    session.statement(intent_text, &INTENT_TYPES).await?,
                    session.statement(FORGET_SQL, &[Type::TEXT]).await?,
                ))
            } else {
                None
            };
            Ok::<_, tokio_postgres::Error>((
                intent,
                session
                    .statement(outcome_text, &[Type::TEXT, Type::TEXT])
                    .await?,
                work,
            ))
        };
        let (intent, outcome_sql, work_statements) = match statements.await {
            Ok(prepared) => prepared,
            Err(error) => {
                session.discard();
                return Err(PgError::db("preparing the library's statements", error).into());
            }
        };
        let intent_params: [&(dyn ToSql + Sync); 6] = [
            &gid_text,
            &txid,
            &coordinator,
            &epoch,
            &incarnation,
            &position,
        ];
        let key = self.outcome_key(gid);
        let key_text = key.as_str();
        let gid_param: [&(dyn ToSql + Sync); 1] = [&gid_text];
        let outcome_params: [&(dyn ToSql + Sync); 2] = [&key_text, &gid_text];
        // From the first message until PREPARE TRANSACTION or ROLLBACK returns, a transaction
        // may be open on this session: if this future is dropped (the request cancelled), the
        // session closes, and PostgreSQL rolls it back.
        session.busy();
        let client = session.client();
        // One round trip: the transaction, the outcome row (which also finds a gid decided or
        // prepared already, see OUTCOME_SQL) and the work. With an intent row, it commits
        // first, asynchronously (PREPARE TRANSACTION below flushes the WAL through its own
        // record, so the intent is durable before any yes), and the transaction removes it.
        let work = self
            .inner
            .work
            .work_prepared(client, &work_statements, &request.payload);
        let (begun, outcome_row, forgotten, worked) = match &intent {
            Some((intent_sql, forget_sql)) => {
                let (intent_begin, intent, began, outcome_row, forgotten, worked) = tokio::join!(
                    biased;
                    client.batch_execute(&intent_begin),
                    client.execute(intent_sql, &intent_params),
                    client.batch_execute(&begin),
                    client.execute(&outcome_sql, &outcome_params),
                    client.execute(forget_sql, &gid_param),
                    work,
                );
                let begun = intent_begin.and(intent.map(drop)).and(began);
                (begun, outcome_row, forgotten.map(drop), worked)
            }
            None => {
                let (began, outcome_row, worked) = tokio::join!(
                    biased;
                    client.batch_execute(&begin),
                    client.execute(&outcome_sql, &outcome_params),
                    work,
                );
                (began, outcome_row, Ok(()), worked)
            }
        };
        if let Err(error) = begun {
            session.discard();
            return Err(PgError::db("beginning the transaction", error).into());
        }
        let refusal = match (outcome_row, forgotten, worked) {
            (Err(error), _, _) if policy::already_known(error.code().map(SqlState::code)) => {
                // Decided or prepared here already: the records say how to vote.
                let (rolled_back, known) = tokio::join!(
                    biased;
                    client.batch_execute("ROLLBACK"),
                    lookup(client, gid, &key),
                );
                if rolled_back.is_err() {
                    session.discard();
                    return Err(PgError::db("rolling back a repeated prepare", error).into());
                }
                let (recorded, prepared_now) = known?;
                match policy::known(recorded, prepared_now) {
                    Known::VoteYes => {
                        session.idle();
                        return Ok(Vote::Yes);
                    }
                    Known::VoteNo => {
                        session.idle();
                        return Ok(Vote::No {
                            reason: format!("{} was aborted before it was prepared", request.gtid),
                        });
                    }
                    // Resolved between the two looks: no is always safe.
                    Known::Run => prepare_refusal(&error),
                }
            }
            (Err(error), _, _) | (Ok(_), Err(error), _) => prepare_refusal(&error),
            (Ok(_), Ok(_), Err(refusal)) => refusal,
            (Ok(_), Ok(_), Ok(())) => {
                // Held from now on: if this future is dropped or the answer lost, the gid may
                // be prepared all the same.
                self.inner.held.hold(gid_text);
                match client
                    .batch_execute(&format!("PREPARE TRANSACTION {}", gid.literal()))
                    .await
                {
                    Ok(()) => {
                        session.idle();
                        return Ok(Vote::Yes);
                    }
                    Err(error) => {
                        if error.as_db_error().is_some() {
                            self.inner.held.refused(gid_text);
                        }
                        prepare_refusal(&error)
                    }
                }
            }
        };
        // Nothing was prepared: roll back and forget the intent, if any (asynchronously: a
        // leftover intent only costs a row). After a failed PREPARE TRANSACTION no transaction
        // is open, and ROLLBACK only warns.
        let cleanup = if with_intent {
            format!(
                "ROLLBACK; BEGIN; SET LOCAL synchronous_commit = off; \
                 DELETE FROM twopc.pg_intents WHERE gid = {}; COMMIT",
                gid.literal()
            )
        } else {
            "ROLLBACK".to_string()
        };
        let cleaned = client.batch_execute(&cleanup).await;
        if cleaned.is_err() {
            session.discard();
        } else {
            session.idle();
        }
        match refusal {
            WorkRefusal::No(reason) => Ok(Vote::No { reason }),
            WorkRefusal::Invalid(message) => Err(Rejection::InvalidPayload(message).into()),
        }
    }
}
