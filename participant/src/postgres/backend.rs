//! The protocol mapped onto PostgreSQL's two-phase commit.
//!
//! Prepare: intent row (autocommit), `BEGIN`, the service's work, the `committed` outcome row,
//! `PREPARE TRANSACTION '<gid>'` on the same session, then yes: the prepared state is durable
//! in PostgreSQL's own WAL (`PREPARE TRANSACTION` flushes it, and with it the intent written
//! just before). Commit / abort: `COMMIT PREPARED` / `ROLLBACK PREPARED` from any session,
//! idempotent: a gid PostgreSQL no longer knows is "already committed" only if its outcome row
//! says so (see `schema`); a commit for a gid never prepared is 409 `not_prepared`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::{DecisionRequest, ErrorCode, PrepareRequest, Vote};
use tokio_postgres::error::SqlState;

use super::config::PgConfig;
use super::error::{PgError, describe};
use super::gid::{Gid, GidPrefix};
use super::policy::{self, AbortMissing, CommitMissing, Fence, Known, Recorded};
use super::pool::Pool;
use super::schema;
use super::work::{PgWork, WorkRefusal};
use crate::api_error::ApiError;
use crate::crash::crash_point;
use crate::rejection::Rejection;

/// Crash point: `PREPARE TRANSACTION` returned, the yes vote not yet sent.
pub const AFTER_PREPARE_TRANSACTION: &str = "participant::pg_after_prepare_transaction";
/// Crash point: `COMMIT PREPARED` returned, the ack not yet sent.
pub const AFTER_COMMIT_PREPARED: &str = "participant::pg_after_commit_prepared";

/// How long an abort waits for a prepare of the same attempt still running here.
const ABORT_WAITS_FOR_PREPARE_MS: u64 = 30_000;

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

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct PgMetrics {
    pub(crate) votes_yes: AtomicU64,
    pub(crate) votes_no: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) aborts: AtomicU64,
    pub(crate) decision_queries: AtomicU64,
    pub(crate) resolved_by_query: AtomicU64,
}

pub(crate) struct Inner<W: PgWork> {
    pub(crate) work: W,
    pub(crate) pool: Pool,
    pub(crate) prefix: GidPrefix,
    pub(crate) config: PgConfig,
    /// Highest epoch seen per coordinator id (mirrors `twopc.pg_epochs`).
    epochs: Mutex<HashMap<String, u64>>,
    /// Gids whose prepare runs in this process now.
    pub(crate) preparing: Mutex<HashSet<String>>,
    /// The coordinator's last answer per in-doubt gid, for `/v1/prepared`.
    pub(crate) answers: Mutex<HashMap<String, String>>,
    pub(crate) metrics: PgMetrics,
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
        let pool = Pool::new(&config.url, config.connections)?;
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
        let http = crate::decision_client::build(
            config.decision_timeout_ms,
            config.coordinator_tls.clone(),
        )?;
        let coordinators =
            crate::decision_client::Coordinators::new(http, &config.coordinator_urls);
        Ok(Self {
            inner: Arc::new(Inner {
                work,
                pool,
                prefix,
                config,
                epochs: Mutex::new(epochs),
                preparing: Mutex::new(HashSet::new()),
                answers: Mutex::new(HashMap::new()),
                metrics: PgMetrics::default(),
                coordinators,
                max_prepared,
            }),
        })
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

    /// The gid this participant uses for an attempt.
    pub fn gid_of(&self, gtid: &protocol::GlobalTxId) -> Result<Gid, Rejection> {
        self.inner
            .prefix
            .gid(gtid)
            .map_err(|e| Rejection::InvalidPayload(e.to_string()))
    }

    /// Fencing: 409 `stale_epoch` for an epoch below the highest seen; a higher one is
    /// recorded durably before it is acted on.
    async fn fence(&self, coordinator_id: &str, epoch: u64) -> Result<(), PgRequestError> {
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
        let session = self.inner.pool.get().await?;
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

    fn check_owner(
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
        let gid = self.gid_of(&request.gtid)?;
        self.fence(request.coordinator_id.as_str(), request.epoch.0)
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
        let mut session = self.inner.pool.get().await?;
        let client = session.client();
        // Decided already (a late or repeated prepare)?
        let known = client
            .query(
                "SELECT outcome FROM twopc.pg_outcomes WHERE gid = $1 \
                 UNION ALL SELECT 'prepared' FROM pg_prepared_xacts WHERE gid = $1",
                &[&gid.as_str()],
            )
            .await
            .map_err(|e| PgError::db("looking up the attempt", e))?;
        let mut recorded = None;
        let mut prepared_now = false;
        for row in &known {
            let what: String = row.get(0);
            prepared_now |= what == "prepared";
            recorded = recorded.or(Recorded::parse(&what));
        }
        match policy::known(recorded, prepared_now) {
            Known::VoteYes => return Ok(Vote::Yes),
            Known::VoteNo => {
                return Ok(Vote::No {
                    reason: format!("{} was aborted before it was prepared", request.gtid),
                });
            }
            Known::Run => {}
        }
        // The intent can commit asynchronously: PREPARE TRANSACTION below flushes the WAL
        // through its own record, so the intent is durable before any yes.
        let position = i64::try_from(request.position).unwrap_or(i64::MAX);
        let epoch = i64::try_from(request.epoch.0).unwrap_or(i64::MAX);
        // From here until PREPARE TRANSACTION or ROLLBACK returns, a transaction may be open on
        // this session: if this future is dropped (the request cancelled), the session closes.
        session.busy();
        let client = session.client();
        let intent = async {
            client
                .batch_execute("BEGIN; SET LOCAL synchronous_commit = off")
                .await?;
            client
                .execute(
                    "INSERT INTO twopc.pg_intents \
                     (gid, txid, coordinator_id, epoch, incarnation, position) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (gid) DO NOTHING",
                    &[
                        &gid.as_str(),
                        &request.txid.as_str(),
                        &request.coordinator_id.as_str(),
                        &epoch,
                        &request.incarnation.to_string(),
                        &position,
                    ],
                )
                .await?;
            let wait_max = self.inner.config.lock_wait_max_ms;
            let wait = request
                .lock_wait_ms
                .unwrap_or(wait_max)
                .min(wait_max)
                .max(1);
            client
                .batch_execute(&format!("COMMIT; BEGIN; SET LOCAL lock_timeout = {wait}"))
                .await
        };
        if let Err(error) = intent.await {
            session.discard();
            return Err(PgError::db("recording the intent", error).into());
        }
        let worked = self.inner.work.work(client, &request.payload).await;
        let refusal = match worked {
            Ok(()) => {
                let prepared = async {
                    client
                        .execute(
                            "INSERT INTO twopc.pg_outcomes (gid, outcome) VALUES ($1, 'committed')",
                            &[&gid.as_str()],
                        )
                        .await?;
                    client
                        .batch_execute(&format!("PREPARE TRANSACTION {}", gid.literal()))
                        .await
                };
                match prepared.await {
                    Ok(()) => {
                        session.idle();
                        return Ok(Vote::Yes);
                    }
                    Err(error) => prepare_refusal(&error),
                }
            }
            Err(refusal) => refusal,
        };
        // Nothing was prepared: roll back and forget the intent.
        let cleaned = client.batch_execute("ROLLBACK").await;
        let forgot = client
            .execute(
                "DELETE FROM twopc.pg_intents WHERE gid = $1",
                &[&gid.as_str()],
            )
            .await;
        if cleaned.is_err() || forgot.is_err() {
            session.discard();
        } else {
            session.idle();
        }
        match refusal {
            WorkRefusal::No(reason) => Ok(Vote::No { reason }),
            WorkRefusal::Invalid(message) => Err(Rejection::InvalidPayload(message).into()),
        }
    }

    /// Phase two, commit: `COMMIT PREPARED`, or an ack if the outcome row shows it done.
    pub async fn commit(&self, request: DecisionRequest) -> Result<(), PgRequestError> {
        Self::check_owner(&request.gtid, &request.coordinator_id)?;
        let gid = self.gid_of(&request.gtid)?;
        self.fence(request.coordinator_id.as_str(), request.epoch.0)
            .await?;
        self.commit_gid(&gid).await?;
        crash_point(AFTER_COMMIT_PREPARED);
        Ok(())
    }

    pub(crate) async fn commit_gid(&self, gid: &Gid) -> Result<(), PgRequestError> {
        let session = self.inner.pool.get().await?;
        let client = session.client();
        match client
            .batch_execute(&format!("COMMIT PREPARED {}", gid.literal()))
            .await
        {
            Ok(()) => {
                self.inner.metrics.commits.fetch_add(1, Ordering::Relaxed);
                self.forget(client, gid).await;
                tracing::debug!(%gid, "committed");
                Ok(())
            }
            Err(error) if error.code() == Some(&SqlState::UNDEFINED_OBJECT) => {
                match policy::commit_missing(outcome(client, gid).await?) {
                    CommitMissing::AlreadyCommitted => Ok(()),
                    CommitMissing::Contradiction => Err(PgRequestError::Contradiction(format!(
                        "{gid} was aborted here; it cannot commit"
                    ))),
                    CommitMissing::NeverPrepared => Err(Rejection::NotPrepared {
                        gtid: self.inner.prefix.gtid_of(gid.as_str()).ok_or_else(|| {
                            Rejection::InvalidPayload(format!("{gid} has another prefix"))
                        })?,
                        why: "was never prepared here (no prepared transaction and no \
                              outcome row in PostgreSQL)"
                            .into(),
                    }
                    .into()),
                }
            }
            Err(error) => {
                session.discard();
                Err(PgError::db(format!("COMMIT PREPARED {gid}"), error).into())
            }
        }
    }

    /// Phase two, abort: `ROLLBACK PREPARED`, or a tombstone if it was never prepared (a late
    /// prepare then votes no).
    pub async fn abort(&self, request: DecisionRequest) -> Result<(), PgRequestError> {
        Self::check_owner(&request.gtid, &request.coordinator_id)?;
        let gid = self.gid_of(&request.gtid)?;
        self.fence(request.coordinator_id.as_str(), request.epoch.0)
            .await?;
        self.abort_gid(&gid).await
    }

    pub(crate) async fn abort_gid(&self, gid: &Gid) -> Result<(), PgRequestError> {
        let mut waited_ms = 0;
        loop {
            let session = self.inner.pool.get().await?;
            let client = session.client();
            match client
                .batch_execute(&format!("ROLLBACK PREPARED {}", gid.literal()))
                .await
            {
                Ok(()) => {
                    self.inner.metrics.aborts.fetch_add(1, Ordering::Relaxed);
                    self.forget(client, gid).await;
                    tracing::debug!(%gid, "rolled back");
                    return Ok(());
                }
                Err(error) if error.code() == Some(&SqlState::UNDEFINED_OBJECT) => {}
                Err(error) => {
                    session.discard();
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
                drop(session);
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
            client
                .execute(
                    "INSERT INTO twopc.pg_outcomes (gid, outcome) VALUES ($1, 'aborted') \
                     ON CONFLICT (gid) DO NOTHING",
                    &[&gid.as_str()],
                )
                .await
                .map_err(|e| PgError::db("recording the abort", e))?;
            if !policy::abort_acked(outcome(client, gid).await?) {
                return Err(PgRequestError::Contradiction(format!(
                    "{gid} was committed here; it cannot abort"
                )));
            }
            self.forget(client, gid).await;
            return Ok(());
        }
    }

    /// Drops the intent of a resolved gid (best effort: a leftover intent only costs a row).
    async fn forget(&self, client: &tokio_postgres::Client, gid: &Gid) {
        self.inner
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(gid.as_str());
        if let Err(error) = client
            .execute(
                "DELETE FROM twopc.pg_intents WHERE gid = $1",
                &[&gid.as_str()],
            )
            .await
        {
            tracing::warn!(%gid, error = %describe(&error), "could not drop the intent row");
        }
    }
}

/// The recorded outcome of a gid, if any.
async fn outcome(
    client: &tokio_postgres::Client,
    gid: &Gid,
) -> Result<Option<Recorded>, PgRequestError> {
    let row = client
        .query_opt(
            "SELECT outcome FROM twopc.pg_outcomes WHERE gid = $1",
            &[&gid.as_str()],
        )
        .await
        .map_err(|e| PgError::db("reading the outcome row", e))?;
    Ok(row.and_then(|row| Recorded::parse(row.get(0))))
}

/// Why `PREPARE TRANSACTION` (or the outcome row before it) failed, as a no vote.
fn prepare_refusal(error: &tokio_postgres::Error) -> WorkRefusal {
    let message = describe(error);
    let full = error.as_db_error().is_some_and(|db| {
        db.message()
            .contains("maximum number of prepared transactions reached")
    });
    if full {
        WorkRefusal::No(format!(
            "prepared_transactions_full: {message}; raise max_prepared_transactions (needs a \
             PostgreSQL restart) or resolve old prepared transactions"
        ))
    } else if error.code() == Some(&SqlState::UNIQUE_VIOLATION) {
        WorkRefusal::No(format!(
            "the attempt was aborted here before it was prepared ({message})"
        ))
    } else {
        WorkRefusal::No(message)
    }
}
