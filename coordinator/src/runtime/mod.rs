//! The tokio shell around the engine: it feeds events in, executes the commands that come out
//! (log appends, HTTP sends, timers, client replies), and feeds the results back as events.
//!
//! Ordering rules kept here: appends are submitted to the log while the engine lock is held,
//! so the log's order is the engine's order; a decision is acted on only after its forced
//! append resolved (the `DecisionDurable` event), so nobody hears an outcome that a crash
//! could undo.

mod cluster;
mod fencing;
mod housekeeping;
mod leases;
mod operator;
pub mod participants;
mod sagas;
mod start;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_start;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;
use tracing::{error, warn};

use protocol::{
    Decision, DecisionQuery, DecisionQueryResponse, DecisionRequest, DecisionStatus, GlobalTxId,
    ParticipantName, PrepareRequest, TransactionState, TransactionStatus, TxId, VoteKind,
};
use wal::{Durability, RecordType, Wal};

use crate::config::Config;
use crate::engine::view::Gauges;
use crate::engine::{
    AnswerSource, Command, DecisionAnswer, Engine, Event, Reply, WaitFor, WaiterId,
};
use crate::http_client::Endpoint;
use crate::metrics::Metrics;
use crate::outcomes::{Cursor, OutcomeError, OutcomeStore};
use crate::records::{Attempt, EpochRecord, LogRecord, Retained};
use participants::DeliveryError;

pub use fencing::PROBE_TXID;
pub use housekeeping::housekeeping;
pub use operator::{OperatorError, RetryTarget, check_operator};
pub use sagas::{SagaOutcome, SagaShell, op_outcome, probe_answer};
pub use start::{StartError, recover, recover_on};

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The running coordinator after recovery: the engine, the log and the means to act.
#[derive(Debug)]
pub struct Core {
    engine: Mutex<Engine>,
    waiters: Mutex<HashMap<WaiterId, oneshot::Sender<Reply>>>,
    next_waiter: AtomicU64,
    wal: Wal,
    /// This run as it started; its epoch may rise since (`epoch`, `runtime::fencing`).
    identity: EpochRecord,
    /// The epoch every message carries now: `identity.epoch`, or a raise of it once durable.
    epoch: AtomicU64,
    /// Shared, so a task that outlives no core (the epoch probe) can hold its peer alone.
    participants: BTreeMap<ParticipantName, Arc<Endpoint>>,
    config: Config,
    metrics: Arc<Metrics>,
    /// Set while recovery issues its resends (for the `coordinator::during_recovery` point).
    recovering: AtomicBool,
    /// Mirrors `Engine::behind` so the hot path checks a flag, not the engine lock. Once set
    /// (by evidence from participants, or from the log at start) only an operator's audited
    /// clear lifts it: new work is refused; decisions already in the log are still delivered
    /// and answered.
    behind: AtomicBool,
    /// Ended outcomes for the whole retention window (the engine stages only the archiver's
    /// lag).
    pub(crate) outcomes: Arc<OutcomeStore>,
    /// To the archiver task: outcomes the engine staged (`Command::Archive`).
    archive: tokio::sync::mpsc::UnboundedSender<Retained>,
    /// Mirrors `Engine::archive_generation`, stored under the engine lock when `Archived` is
    /// stepped, so `submit` reads it before its index lookup without taking the lock.
    archive_generation: AtomicU64,
    /// Operator actions run one at a time (see `operator`).
    operator_lock: tokio::sync::Mutex<()>,
    /// The saga table (issue 13), run by `sagas.rs`.
    sagas: SagaShell,
    /// The lease service (`runtime::leases`); its records share this log.
    leases: crate::leases::Leases,
}

/// One prepare to send (`Command::SendPrepare`).
#[derive(Debug)]
struct PrepareJob {
    txid: TxId,
    attempt: Attempt,
    participant: ParticipantName,
    payload: serde_json::Value,
    timeout_ms: u64,
    started_at_ms: u64,
    named: Vec<ParticipantName>,
}

/// A new transaction, checked by the API.
#[derive(Debug)]
pub struct NewTransaction {
    pub txid: TxId,
    pub digest: crate::digest::Digest,
    pub participants: Vec<(ParticipantName, serde_json::Value)>,
    pub timeout_ms: u64,
    pub wait: WaitFor,
    /// The client's name from its token, recorded on the attempt.
    pub client: Option<String>,
}

impl Core {
    fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        // The engine is only mutated inside `step`, which does not panic on any input; if a
        // panic happened anyway, the table is still the best record we have.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This run, at the epoch its messages carry now.
    pub fn identity(&self) -> EpochRecord {
        EpochRecord {
            epoch: self.epoch(),
            ..self.identity.clone()
        }
    }

    /// The epoch messages carry now.
    pub fn epoch(&self) -> protocol::Epoch {
        protocol::Epoch(self.epoch.load(Ordering::Acquire))
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Blocking: writes everything submitted, then closes the log (shutdown).
    pub fn close_log(&self) {
        self.wal.close();
    }

    pub fn is_poisoned(&self) -> bool {
        self.wal.is_poisoned()
    }

    pub fn knows_participant(&self, name: &ParticipantName) -> bool {
        self.participants.contains_key(name)
    }

    /// Why this coordinator takes no new work, if it learned that its log is behind.
    pub fn log_behind(&self) -> Option<String> {
        if !self.behind.load(Ordering::Relaxed) {
            return None;
        }
        self.lock_engine().behind().map(|b| b.evidence.clone())
    }

    /// Starts (or joins) a transaction and waits for the answer the request asked for.
    /// `None` means the process is shutting down before an answer came.
    ///
    /// The index is looked up first, outside the engine lock, and what it held goes into the
    /// `Submit` event, so an id whose outcome is only in the index is answered without a new
    /// attempt. The lookup races with the archiver; the generation read before it lets the
    /// engine tell (`Reply::LookAgain`) when an outcome may have left staging after the lookup
    /// missed it, and then it is simply done again.
    pub async fn submit(self: &Arc<Self>, tx: NewTransaction) -> Option<Reply> {
        // Moved into the event once; kept while a stale lookup has to be done again.
        let mut participants = Some(tx.participants);
        loop {
            let generation = self.archive_generation.load(Ordering::Acquire);
            let now = now_ms();
            let archived = match self.outcomes.get(&tx.txid, now, self.config.retention_ms) {
                Ok(found) => found,
                Err(e) => {
                    self.metrics
                        .index_read_failures
                        .fetch_add(1, Ordering::Relaxed);
                    error!(txid = %tx.txid, error = %e, "outcome index lookup failed");
                    return Some(Reply::IndexUnavailable {
                        error: e.to_string(),
                    });
                }
            };
            let waiter = self.next_waiter.fetch_add(1, Ordering::Relaxed);
            let (sender, receiver) = oneshot::channel();
            self.lock_waiters().insert(waiter, sender);
            let mut stale = false;
            self.apply_with(|engine| {
                // The engine would answer `LookAgain` to a stale lookup; checking here, under
                // the same lock, keeps the payloads for the next try instead of cloning them.
                if engine.archive_generation() != generation {
                    stale = true;
                    return Vec::new();
                }
                engine.step(Event::Submit {
                    waiter,
                    wait: tx.wait,
                    txid: tx.txid.clone(),
                    digest: tx.digest,
                    participants: participants.take().unwrap_or_default(),
                    timeout_ms: tx.timeout_ms,
                    now_ms: now,
                    archived,
                    archive_generation: generation,
                    client: tx.client.clone(),
                })
            });
            if stale {
                self.lock_waiters().remove(&waiter);
                continue;
            }
            return match receiver.await.ok()? {
                // Cannot happen after the check above; an answer all the same.
                Reply::LookAgain => Some(Reply::IndexUnavailable {
                    error: "the outcome lookup raced with the archiver".to_string(),
                }),
                reply => Some(reply),
            };
        }
    }

    /// A transaction's status: the engine (live and staged), then the index. In that order,
    /// because an outcome leaves staging only once the index holds it, so a miss in the engine
    /// followed by the lookup never misses an outcome in between.
    pub fn status(&self, txid: &TxId) -> Result<Option<TransactionStatus>, OutcomeError> {
        if let Some(status) = self.lock_engine().status(txid) {
            return Ok(Some(status));
        }
        if let Some(retained) = self
            .outcomes
            .get(txid, now_ms(), self.config.retention_ms)?
        {
            return Ok(Some(crate::engine::view::retained_status(&retained)));
        }
        Ok(self.lock_engine().resolved_status(txid))
    }

    /// A listing page: without a cursor, live transactions first (from the engine, bounded by
    /// `limit`); then ended ones from the index, oldest ended first, one page of it; once the
    /// index has no more, the staged outcomes not in it yet. `next` continues the index pages.
    pub fn list(
        &self,
        state: Option<TransactionState>,
        limit: usize,
        after: Option<Cursor>,
    ) -> Result<(Vec<TransactionStatus>, Option<Cursor>), OutcomeError> {
        let ended = match state {
            None => Some(None),
            Some(TransactionState::Committed) => Some(Some(Decision::Commit)),
            Some(TransactionState::Aborted) => Some(Some(Decision::Abort)),
            Some(
                TransactionState::Preparing
                | TransactionState::Committing
                | TransactionState::Aborting,
            ) => None,
        };
        let mut out = match after {
            None => self.lock_engine().list_live(state, limit),
            Some(_) => Vec::new(),
        };
        let mut next = None;
        if let Some(decision) = ended {
            if out.len() < limit {
                let page = self.outcomes.list(
                    decision,
                    limit - out.len(),
                    after,
                    now_ms(),
                    self.config.retention_ms,
                )?;
                out.extend(
                    page.outcomes
                        .iter()
                        .map(crate::engine::view::retained_status),
                );
                next = page.next;
            }
            if next.is_none() && out.len() < limit {
                let shown: std::collections::HashSet<TxId> =
                    out.iter().map(|s| s.id.clone()).collect();
                let staged = self
                    .lock_engine()
                    .list_staged(state, limit - out.len(), &shown);
                out.extend(staged);
            }
        }
        Ok((out, next))
    }

    /// The archiver made these outcomes durable in the index: they leave staging.
    pub(crate) fn archived(self: &Arc<Self>, archived: Vec<(TxId, GlobalTxId)>) {
        self.apply_with(|engine| {
            let commands = engine.step(Event::Archived { archived });
            self.archive_generation
                .store(engine.archive_generation(), Ordering::Release);
            commands
        });
    }

    /// The index's numbers (metrics, `/readyz`).
    pub fn index_stats(&self) -> Result<crate::outcomes::IndexStats, OutcomeError> {
        self.outcomes.stats(now_ms(), self.config.retention_ms)
    }

    /// Whether callers of the decision route proved they are peers (a peer token is
    /// configured, so the route refuses everyone else).
    pub fn peers_authenticate(&self) -> bool {
        // With authentication on, the decision route takes the peer token only.
        self.config.keys.current().enabled()
    }

    /// What a participant in doubt about an attempt of `txid` is told (see
    /// `Engine::decision_for`). Nothing is written: an attempt's id is never reused, so a
    /// presumed abort cannot be contradicted later.
    pub fn decision_query(
        &self,
        txid: &TxId,
        query: Option<&DecisionQuery>,
    ) -> DecisionQueryResponse {
        let mut answer = self.lock_engine().decision_for(txid, query);
        // Not answered from the engine's own record: the attempt may be in the index, archived
        // after the engine let go of it, under this id or another. The index outranks a
        // resolution, a presumption and an `unknown`; an attempt leaves staging only once the
        // index holds it, so nothing falls between the two lookups.
        if let (false, Some(query)) = (answer.source == AnswerSource::Record, query) {
            match self
                .outcomes
                .get_attempt(&query.gtid, now_ms(), self.config.retention_ms)
            {
                Ok(Some(retained)) => {
                    answer = DecisionAnswer::from_index(
                        txid,
                        &retained.decision.txid,
                        &query.gtid,
                        retained.decision.decision.into(),
                    );
                }
                Ok(None) => {}
                Err(e) => {
                    // Presumed abort is only safe if no decision exists: unknown it is.
                    error!(%txid, error = %e, "outcome index lookup failed (decision query)");
                    answer =
                        DecisionAnswer::unknown(format!("the outcome index cannot be read: {e}"));
                }
            }
        }
        if answer.unknown_run {
            self.metrics
                .unknown_run_queries
                .fetch_add(1, Ordering::Relaxed);
        }
        match answer.decision {
            DecisionStatus::Abort if answer.source == AnswerSource::Presumed => {
                self.metrics.presumed_aborts.fetch_add(1, Ordering::Relaxed);
            }
            DecisionStatus::Unknown => {
                self.metrics.unknown_answers.fetch_add(1, Ordering::Relaxed);
                warn!(%txid, gtid = query.map_or("", |q| q.gtid.as_str()),
                      reason = answer.reason.as_deref().unwrap_or(""),
                      "decision query answered unknown");
            }
            DecisionStatus::Abort | DecisionStatus::Commit | DecisionStatus::Pending => {}
        }
        DecisionQueryResponse {
            decision: answer.decision,
            coordinator_id: Some(self.identity.coordinator_id.clone()),
            epoch: Some(self.epoch()),
            incarnation: Some(self.identity.incarnation),
            reason: answer.reason,
        }
    }

    /// Every configured participant's load here (zero when it holds nothing).
    pub fn participant_loads(&self) -> Vec<crate::metrics::ParticipantLoad> {
        let engine = self.lock_engine();
        self.participants
            .keys()
            .map(|name| {
                let load = engine.load(name);
                crate::metrics::ParticipantLoad {
                    name: name.to_string(),
                    live: load.live,
                    pending_acks: load.pending_acks,
                }
            })
            .collect()
    }

    pub fn gauges(&self) -> Gauges {
        self.lock_engine().gauges()
    }

    /// The log's counters (records, fsyncs, batches, bytes), for metrics and the benchmark.
    pub fn wal_stats(&self) -> wal::WalStats {
        self.wal.stats()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn log_bytes(&self) -> u64 {
        self.wal.stats().log_bytes_on_disk
    }

    fn lock_waiters(&self) -> MutexGuard<'_, HashMap<WaiterId, oneshot::Sender<Reply>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Steps the engine and executes its commands in order.
    pub fn apply(self: &Arc<Self>, event: Event) {
        self.apply_with(|engine| engine.step(event));
    }

    /// Runs `step` (which reads and steps the engine) under the engine lock, then executes the
    /// commands it returned in order.
    fn apply_with(self: &Arc<Self>, step: impl FnOnce(&mut Engine) -> Vec<Command>) {
        let mut decisions = Vec::new();
        let mut epochs = Vec::new();
        let commands = {
            let mut engine = self.lock_engine();
            let commands = step(&mut engine);
            // Submitted under the lock: the log's order is the engine's order.
            for command in &commands {
                match command {
                    Command::AppendLazy(record) => {
                        match record {
                            LogRecord::Begin(_) => crash_point!("coordinator::before_first_record"),
                            LogRecord::End(_) => crash_point!("coordinator::before_end_record"),
                            LogRecord::Epoch(_)
                            | LogRecord::Decision(_)
                            | LogRecord::Ack(_)
                            | LogRecord::Behind(_)
                            | LogRecord::Audit(_)
                            | LogRecord::Saga(_)
                            | LogRecord::Lease(_) => {}
                        }
                        let ticket = self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Lazy,
                        );
                        // A lazy append's failure poisons the log, which the housekeeping task
                        // reports and the API turns into 503s; nobody waits on it here.
                        drop(ticket);
                    }
                    Command::AppendDecision(decision) => {
                        crash_point!("coordinator::before_decision_durable");
                        let record = LogRecord::Decision(decision.clone());
                        let ticket = self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        );
                        decisions.push((decision.txid.clone(), decision.decision, ticket));
                    }
                    Command::AppendForced(record) => {
                        // Nobody waits on it: losing it in a crash only means learning it again.
                        drop(self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        ));
                    }
                    Command::AppendEpoch(raised) => {
                        let record = LogRecord::Epoch(raised.clone());
                        let ticket = self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        );
                        epochs.push((raised.clone(), ticket));
                    }
                    Command::SendPrepare { .. }
                    | Command::ArmPrepareDeadline { .. }
                    | Command::SendDecision { .. }
                    | Command::ArmRetry { .. }
                    | Command::Reply { .. }
                    | Command::Archive(_) => {}
                }
            }
            commands
        };
        for command in commands {
            self.execute(command);
        }
        for (raised, ticket) in epochs {
            tokio::spawn(Arc::clone(self).raise_when_durable(raised, ticket));
        }
        for (txid, decision, ticket) in decisions {
            let core = Arc::clone(self);
            let submitted = Instant::now();
            tokio::spawn(async move {
                match ticket.wait().await {
                    Ok(_) => {
                        core.metrics.decision_fsync.observe(submitted.elapsed());
                        crash_point!("coordinator::after_decision_durable");
                        let counter = match decision {
                            Decision::Commit => &core.metrics.committed,
                            Decision::Abort => &core.metrics.aborted,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%txid, ?decision, "decision durable");
                        core.apply(Event::DecisionDurable { txid });
                    }
                    Err(wal::WalError::Closed) => {
                        tracing::info!(
                            %txid,
                            "shutting down before the decision was durable; \
                                   the next start aborts this transaction"
                        );
                        core.apply(Event::DecisionFailed {
                            txid,
                            error: "the coordinator is shutting down".to_string(),
                        });
                    }
                    Err(e) => {
                        error!(%txid, error = %e, "LOG FAILED: decision could not be made durable; \
                                   this coordinator takes no more transactions until restarted");
                        core.apply(Event::DecisionFailed {
                            txid,
                            error: e.to_string(),
                        });
                    }
                }
            });
        }
    }

    fn execute(self: &Arc<Self>, command: Command) {
        match command {
            // Submitted while the engine lock was held.
            Command::AppendLazy(_)
            | Command::AppendDecision(_)
            | Command::AppendForced(_)
            | Command::AppendEpoch(_) => {}
            Command::Archive(retained) => {
                if self.archive.send(retained).is_err() {
                    // Only when the archiver is gone (shutting down): the outcome stays staged,
                    // in the next checkpoint, and the next start archives it.
                    warn!("the outcome archiver is gone; the outcome stays staged");
                }
            }
            Command::SendPrepare {
                txid,
                attempt,
                participant,
                payload,
                timeout_ms,
                started_at_ms,
                named,
            } => {
                tokio::spawn(Arc::clone(self).prepare(PrepareJob {
                    txid,
                    attempt,
                    participant,
                    payload,
                    timeout_ms,
                    started_at_ms,
                    named,
                }));
            }
            Command::ArmPrepareDeadline { txid, after_ms } => {
                let core = Arc::clone(self);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    core.apply(Event::PrepareDeadline {
                        txid,
                        now_ms: now_ms(),
                    });
                });
            }
            Command::SendDecision {
                txid,
                gtid,
                participant,
                decision,
                attempt,
                tracked: true,
            } => {
                let from_recovery = self.recovering.load(Ordering::Relaxed);
                tokio::spawn(Arc::clone(self).deliver(
                    txid,
                    gtid,
                    participant,
                    decision,
                    attempt,
                    from_recovery,
                ));
            }
            Command::SendDecision {
                txid,
                gtid,
                participant,
                decision,
                tracked: false,
                ..
            } => {
                tokio::spawn(Arc::clone(self).notify_once(txid, gtid, participant, decision));
            }
            Command::ArmRetry {
                txid,
                participant,
                after_ms,
            } => {
                let core = Arc::clone(self);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    core.apply(Event::RetryDue { txid, participant });
                });
            }
            Command::Reply { waiter, reply } => {
                if let Some(sender) = self.lock_waiters().remove(&waiter) {
                    // The client may have gone away; the outcome stays queryable.
                    let _ = sender.send(reply);
                }
            }
        }
    }

    async fn prepare(self: Arc<Self>, job: PrepareJob) {
        let PrepareJob {
            txid,
            attempt,
            participant,
            payload,
            timeout_ms,
            started_at_ms,
            named,
        } = job;
        let started = Instant::now();
        let (vote, reason) = match self.participants.get(&participant) {
            Some(endpoint) => {
                let request = PrepareRequest {
                    txid: txid.clone(),
                    gtid: attempt.gtid,
                    coordinator_id: self.identity.coordinator_id.clone(),
                    epoch: self.epoch(),
                    incarnation: self.identity.incarnation,
                    position: attempt.position,
                    payload,
                    started_at_ms: Some(started_at_ms),
                    // A quarter of the deadline is left for the no vote to travel back before
                    // the coordinator stops waiting (and records a timeout instead).
                    lock_wait_ms: Some(timeout_ms.saturating_mul(3) / 4),
                    participants: Some(named),
                };
                let outcome =
                    participants::prepare(endpoint, &request, Duration::from_millis(timeout_ms))
                        .await;
                if let Some(refusal) = outcome.fenced {
                    self.fenced(&participant, "a prepare", request.epoch, refusal);
                }
                (outcome.vote, outcome.reason)
            }
            None => (
                VoteKind::Error,
                Some(format!("{participant} is not configured")),
            ),
        };
        self.metrics.prepare_latency.observe(started.elapsed());
        match vote {
            VoteKind::Yes => tracing::debug!(%txid, %participant, "voted yes"),
            VoteKind::No | VoteKind::Timeout | VoteKind::Error => {
                tracing::info!(%txid, %participant, ?vote, reason = reason.as_deref().unwrap_or(""), "prepare not granted")
            }
        }
        crash_point!("coordinator::during_prepare_fanout");
        self.apply(Event::VoteReceived {
            txid,
            participant,
            vote,
            reason,
            now_ms: now_ms(),
        });
    }

    /// An abort nobody waits for (see `rules::send_decisions`): sent once so that a participant
    /// that prepared after all releases its locks now rather than when it next asks.
    async fn notify_once(
        self: Arc<Self>,
        txid: TxId,
        gtid: GlobalTxId,
        participant: ParticipantName,
        decision: Decision,
    ) {
        let Some(endpoint) = self.participants.get(&participant) else {
            return;
        };
        let request = self.decision_request(&txid, gtid);
        self.metrics
            .untracked_aborts
            .fetch_add(1, Ordering::Relaxed);
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        if let Err(e) = participants::deliver(endpoint, decision, &request, timeout).await {
            tracing::debug!(%txid, %participant, error = %e,
                "untracked abort not delivered; the participant asks if it prepared");
        }
    }

    /// A phase-two message for attempt `gtid` of `txid`, from this run.
    fn decision_request(&self, txid: &TxId, gtid: GlobalTxId) -> DecisionRequest {
        DecisionRequest {
            txid: txid.clone(),
            gtid,
            coordinator_id: self.identity.coordinator_id.clone(),
            epoch: self.epoch(),
            incarnation: self.identity.incarnation,
        }
    }

    async fn deliver(
        self: Arc<Self>,
        txid: TxId,
        gtid: GlobalTxId,
        participant: ParticipantName,
        decision: Decision,
        attempt: u32,
        from_recovery: bool,
    ) {
        if attempt > 1 {
            self.metrics
                .phase_two_retries
                .fetch_add(1, Ordering::Relaxed);
        }
        let request = self.decision_request(&txid, gtid);
        let sent_epoch = request.epoch;
        let result = match self.participants.get(&participant) {
            Some(endpoint) => {
                participants::deliver(
                    endpoint,
                    decision,
                    &request,
                    Duration::from_millis(self.config.delivery_timeout_ms),
                )
                .await
            }
            None => Err(DeliveryError::Transport(format!(
                "{participant} is not in this coordinator's configuration any more; \
                 add it back to deliver the decision"
            ))),
        };
        match result {
            Ok(()) => {
                crash_point!("coordinator::after_some_phase_two");
                if from_recovery {
                    crash_point!("coordinator::during_recovery");
                }
                tracing::debug!(%txid, %participant, ?decision, attempt, "acknowledged");
                self.apply(Event::Acked {
                    txid,
                    participant,
                    now_ms: now_ms(),
                });
            }
            Err(e) => {
                let mut refused = None;
                match &e {
                    DeliveryError::Fenced(refusal) => {
                        self.metrics
                            .stale_epoch_answers
                            .fetch_add(1, Ordering::Relaxed);
                        error!(%txid, %participant, ?decision, attempt, epoch = %sent_epoch, error = %e,
                            "FENCED: a participant has seen a newer or another run of this coordinator id; \
                             delivery stays pending until this run's epoch is raised past it");
                        refused = Some(refusal.clone());
                    }
                    DeliveryError::NotPrepared(_) => {
                        error!(%txid, %participant, ?decision, attempt, error = %e,
                            "participant never prepared a transaction we decided to commit; \
                             it stays pending and visible (GET /v1/transactions?state=committing)");
                    }
                    DeliveryError::Transport(_)
                    | DeliveryError::Status { .. }
                    | DeliveryError::Malformed(_) => {
                        warn!(%txid, %participant, ?decision, attempt, error = %e, "phase two not acknowledged; will retry");
                    }
                }
                self.apply(Event::DeliveryFailed {
                    txid,
                    participant: participant.clone(),
                    error: e.to_string(),
                    jitter: fastrand::u64(..),
                });
                // After the retry is armed: a raise, once durable, starts it again at once.
                if let Some(refusal) = refused {
                    let what = match decision {
                        Decision::Commit => "a commit",
                        Decision::Abort => "an abort",
                    };
                    self.fenced(&participant, what, sent_epoch, refusal);
                }
            }
        }
    }
}
