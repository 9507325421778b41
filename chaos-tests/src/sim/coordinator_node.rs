//! The coordinator's runtime, modelled: it feeds events to the real pure engine
//! (`coordinator::engine::Engine`) and executes its commands against the simulated disk,
//! network and timers with the real runtime's contract: appends in command order; a decision
//! acted on (client answer, phase two) only after its forced append is durable; a prepare or a
//! delivery that gets no answer within its timeout counts as `Timeout` / a failed delivery.
//! Restart rebuilds the engine through `Engine::replay` from what the disk kept, logs the next
//! epoch (forced) with a fresh incarnation and steps `RecoveryDone`, as `runtime::recover_on`
//! does, then sends every participant the epoch probe (`Core::probe_epochs`). Decision queries
//! are answered from `Engine::decision_for`, with the outcome index outranking any answer not
//! from the engine's own record, as `Core::decision_query` does; every answer is checked
//! against the log and the index (`answer_violation`). A query is a claim: one naming an
//! unknown run is counted, nothing more. A participant's `stale_epoch` /
//! `incarnation_conflict` refusal of a message this run sent is stepped as `Event::Fenced`:
//! the behind mark (forced, not awaited) and a raise of this run's epoch (forced; messages
//! carry it once durable, `Event::EpochDurable`), as `Core::fenced` does. An operator may stop
//! it, copy its disk, and later put the copy back (`backup`, `restore`).
//!
//! The outcome index is modelled too: `Command::Archive` outcomes wait in an unsynced batch
//! that the next disk sync commits to a durable map (a crash loses the batch, never the map),
//! then `Event::Archived` is stepped, as the archiver does. A backup copies the map with the
//! log and a restore puts both back. Its disk budget is `index_max` outcomes (the oldest go
//! first), tiny in some runs so that ids are forgotten and reused. Submits look the id up in
//! the map first, as `Core::submit` does.

use std::collections::BTreeMap;

use coordinator::digest::Digest;
use coordinator::engine::{
    AnswerSource, Command, DecisionAnswer, Engine, EngineConfig, Event, Fenced, WaitFor, WaiterId,
};
use coordinator::records::{EpochRecord, LogRecord, Retained, Snapshot};
use protocol::{
    CoordinatorId, Decision, DecisionQuery, DecisionQueryResponse, DecisionRequest, DecisionStatus,
    Epoch, ErrorBody, ErrorCode, GlobalTxId, ParticipantName, PrepareRequest, TxId, Vote, VoteKind,
};

use protocol::operator::{AuditAction, AuditEntry};

use super::Mutation;
use super::disk::Disk;
use super::io::Io;
use super::net::{Body, Ev, Incarnation, Msg, Node, RequestId, Timer};

/// The simulated coordinator's id (what its first start writes).
pub const COORDINATOR_ID: &str = "c-sim";

/// The client id the epoch probe is sent under (`runtime::PROBE_TXID`).
const PROBE_TXID: &str = "twopc-epoch-probe";

/// How long the probe waits before asking an unanswering participant again.
const PROBE_RETRY_MS: u64 = 500;

/// An HTTP call the coordinator is waiting on, with the epoch it carried.
#[derive(Debug, Clone)]
enum Call {
    Prepare(TxId, ParticipantName, Epoch),
    Deliver(TxId, ParticipantName, Epoch),
    Probe(usize, Epoch),
}

#[derive(Debug)]
pub struct CoordinatorNode {
    pub config: EngineConfig,
    pub delivery_timeout_ms: u64,
    pub participants: Vec<ParticipantName>,
    pub disk: Disk<LogRecord, Snapshot>,
    pub incarnation: Incarnation,
    /// `None` while crashed.
    pub engine: Option<Engine>,
    identity: Option<EpochRecord>,
    calls: BTreeMap<RequestId, Call>,
    waiters: BTreeMap<WaiterId, (usize, u32)>,
    next_waiter: WaiterId,
    /// Forced decision appends waiting for a sync: (sequence number, txid).
    decision_waits: Vec<(u64, TxId)>,
    /// A forced audit append (an operator's resolution) waiting for a sync.
    audit_waits: Vec<(u64, AuditEntry)>,
    /// A forced raise of this run's epoch waiting for a sync.
    epoch_waits: Vec<(u64, EpochRecord)>,
    sync_scheduled: bool,
    /// The operator's copy of the disk, taken while stopped.
    backup: Option<Disk<LogRecord, Snapshot>>,
    /// Ground truth for the checks, kept across crashes and restores (they are facts about
    /// the world, not about the disk): every decision that ever became durable, per attempt,
    /// and any decision that flipped; every attempt ever begun, with its client id and digest.
    pub durable_decisions: BTreeMap<GlobalTxId, Decision>,
    pub attempts: BTreeMap<GlobalTxId, (TxId, Digest)>,
    pub flipped: Option<String>,
    /// Operator resolutions that became durable, for the world to settle against the ground
    /// truth (`World::settle_resolutions`).
    pub resolutions: Vec<(GlobalTxId, TxId, Decision)>,
    /// Coordinator crashes and restores so far: attempts in doubt for ever are only acceptable
    /// after a restore.
    pub crashes: u64,
    pub restores: u64,
    /// The outcome index: durable, survives crashes; at most `index_max` outcomes.
    pub index: BTreeMap<TxId, Retained>,
    pub index_max: usize,
    /// Archive outcomes not yet committed to the index (lost in a crash).
    archive_batch: Vec<Retained>,
    backup_index: Option<BTreeMap<TxId, Retained>>,
    /// Every outcome the engine staged and that was not superseded or evicted since: each must
    /// be live or staged in the engine, or durable in the index, at every step.
    must_hold: BTreeMap<TxId, GlobalTxId>,
    /// The first broken promise about ended outcomes (staging or idempotency), if any.
    pub outcome_violation: Option<String>,
    /// The first decision answer that contradicted the log or the index, if any.
    pub answer_violation: Option<String>,
    /// Decision queries that named a run this log does not hold (counted, never believed).
    pub unknown_run_queries: u64,
    /// Raises of the epoch that became durable, over all runs.
    pub raises: u64,
    /// `Mutation::BehindFromQuery`: new work stopped on a query's say-so.
    stopped_by_query: bool,
}

impl CoordinatorNode {
    pub fn new(config: EngineConfig, participants: Vec<ParticipantName>) -> Self {
        Self {
            config,
            delivery_timeout_ms: 400,
            participants,
            disk: Disk::new(),
            incarnation: 0,
            engine: None,
            identity: None,
            calls: BTreeMap::new(),
            waiters: BTreeMap::new(),
            next_waiter: 1,
            decision_waits: Vec::new(),
            audit_waits: Vec::new(),
            epoch_waits: Vec::new(),
            sync_scheduled: false,
            backup: None,
            durable_decisions: BTreeMap::new(),
            attempts: BTreeMap::new(),
            flipped: None,
            resolutions: Vec::new(),
            crashes: 0,
            restores: 0,
            index: BTreeMap::new(),
            index_max: usize::MAX,
            archive_batch: Vec::new(),
            backup_index: None,
            must_hold: BTreeMap::new(),
            outcome_violation: None,
            answer_violation: None,
            unknown_run_queries: 0,
            raises: 0,
            stopped_by_query: false,
        }
    }

    /// Commits the archive batch to the index (one durable write), evicting the oldest beyond
    /// `index_max`, then tells the engine, as the archiver does after its commit.
    fn commit_archive(&mut self, io: &mut Io) {
        if self.archive_batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.archive_batch);
        let mut archived = Vec::new();
        for retained in batch {
            let txid = retained.decision.txid.clone();
            archived.push((txid.clone(), retained.decision.attempt.gtid.clone()));
            // Newer wins, as in the real index.
            if self
                .index
                .get(&txid)
                .is_some_and(|old| old.ended_at_ms > retained.ended_at_ms)
            {
                continue;
            }
            self.index.insert(txid, retained);
        }
        while self.index.len() > self.index_max {
            let Some(oldest) = self
                .index
                .values()
                .min_by_key(|r| (r.ended_at_ms, r.decision.attempt.position))
                .map(|r| r.decision.txid.clone())
            else {
                break;
            };
            if let Some(gone) = self.index.remove(&oldest)
                && self.must_hold.get(&oldest) == Some(&gone.decision.attempt.gtid)
            {
                // Evicted by the budget: forgetting it is allowed.
                self.must_hold.remove(&oldest);
            }
        }
        io.note(|| format!("coordinator archives {} outcomes", archived.len()));
        if !archived.is_empty() {
            self.step(io, Event::Archived { archived });
        }
    }

    /// Every staged outcome is still live or staged in the engine, or durable in the index.
    fn check_outcomes_held(&mut self) {
        let Some(engine) = &self.engine else {
            return;
        };
        let mut superseded = Vec::new();
        for (txid, gtid) in &self.must_hold {
            let in_engine = engine.status(txid).map(|s| s.gtid);
            let in_index = self
                .index
                .get(txid)
                .map(|r| r.decision.attempt.gtid.clone());
            if in_engine.as_ref() == Some(gtid) || in_index.as_ref() == Some(gtid) {
                continue;
            }
            if in_engine.is_some() {
                // A newer attempt of the id is live: the old outcome was superseded.
                superseded.push(txid.clone());
                continue;
            }
            if self.outcome_violation.is_none() {
                self.outcome_violation = Some(format!(
                    "the outcome of {gtid} ({txid}) left staging before it was durable in the \
                     outcome index (index has {in_index:?})"
                ));
            }
        }
        for txid in superseded {
            self.must_hold.remove(&txid);
        }
    }

    pub fn is_up(&self) -> bool {
        self.engine.is_some()
    }

    fn node() -> Node {
        Node::Coordinator
    }

    fn part_index(&self, name: &ParticipantName) -> usize {
        self.participants
            .iter()
            .position(|p| p == name)
            .unwrap_or(usize::MAX)
    }

    fn note_durable(&mut self, records: &[LogRecord]) {
        for record in records {
            let (gtid, txid, decision) = match record {
                LogRecord::Decision(d) => (&d.attempt.gtid, &d.txid, d.decision),
                // An operator's resolution: the world weighs it against what was observed.
                LogRecord::Audit(AuditEntry {
                    action:
                        AuditAction::Resolve {
                            id, gtid, decision, ..
                        },
                    ..
                }) => {
                    self.resolutions.push((gtid.clone(), id.clone(), *decision));
                    continue;
                }
                _ => continue,
            };
            match self.durable_decisions.get(gtid) {
                Some(old) if *old != decision => {
                    self.flipped = Some(format!(
                        "durable decision for {gtid} ({txid}) flipped from {old:?} to {decision:?}"
                    ));
                }
                Some(_) => {}
                None => {
                    self.durable_decisions.insert(gtid.clone(), decision);
                }
            }
        }
    }

    /// An operator resolves an attempt (after the judge allowed it, or not, under a
    /// mutation): the audit record is appended forced and applied once durable, as
    /// `Core::resolve` does. One at a time; `false` when it cannot act now.
    pub fn operator_resolve(
        &mut self,
        io: &mut Io,
        txid: TxId,
        gtid: GlobalTxId,
        decision: Decision,
        evidence: protocol::operator::Evidence,
    ) -> bool {
        self.operator_act(
            io,
            "in doubt after a restore",
            AuditAction::Resolve {
                id: txid,
                gtid,
                decision,
                evidence,
            },
        )
    }

    /// An operator clears the behind mark, as `Core::clear_behind` does; `false` when it
    /// cannot act now or there is no mark.
    pub fn operator_clear_behind(&mut self, io: &mut Io) -> bool {
        let Some(cleared) = self
            .engine
            .as_ref()
            .and_then(|e| e.behind())
            .map(|b| b.evidence.clone())
        else {
            return false;
        };
        self.operator_act(
            io,
            "the restore's loss is accepted",
            AuditAction::ClearBehind { cleared },
        )
    }

    fn operator_act(&mut self, io: &mut Io, reason: &str, action: AuditAction) -> bool {
        let Some(engine) = &self.engine else {
            return false;
        };
        if !self.audit_waits.is_empty() {
            return false;
        }
        let entry = AuditEntry {
            seq: engine.next_audit_seq(),
            at_ms: io.now_ms,
            operator: "sim-operator".into(),
            reason: reason.into(),
            action,
        };
        io.note(|| format!("operator acts: {:?}", entry.action));
        let seq = self.disk.append(LogRecord::Audit(entry.clone()));
        self.audit_waits.push((seq, entry));
        self.schedule_sync(io);
        true
    }

    /// A participant refused a message this run sent at `sent_epoch`: stepped as evidence,
    /// as `Core::fenced` does (the engine decides what to log).
    fn fenced(
        &mut self,
        io: &mut Io,
        participant: ParticipantName,
        what: &str,
        sent_epoch: Epoch,
        refusal: &ErrorBody,
    ) {
        io.note(|| {
            format!(
                "{participant} fences this run out ({what}): {}",
                refusal.message
            )
        });
        self.step(
            io,
            Event::Fenced(Fenced {
                participant,
                evidence: format!(
                    "refused {what} sent at epoch {sent_epoch}: {}: {}",
                    refusal.error, refusal.message
                ),
                sent_epoch,
                highest: refusal.highest_epoch,
                now_ms: io.now_ms,
            }),
        );
    }

    /// Asks participant `index` whether another run passed this one, as `Core::probe` does.
    fn probe(&mut self, io: &mut Io, index: usize) {
        let (Some(engine), Some(identity)) = (&self.engine, &self.identity) else {
            return;
        };
        let Some(attempt) = engine.probe_attempt() else {
            return;
        };
        let rid = io.rid();
        self.calls.insert(rid, Call::Probe(index, identity.epoch));
        io.send(Msg {
            to: Some(Node::Participant(index)),
            body: Body::Decide {
                rid,
                from: self.incarnation,
                decision: Decision::Abort,
                request: DecisionRequest {
                    txid: TxId::new(PROBE_TXID).expect("a constant, valid id"),
                    gtid: attempt.gtid,
                    coordinator_id: identity.coordinator_id.clone(),
                    epoch: identity.epoch,
                    incarnation: identity.incarnation,
                },
            },
        });
        self.timer_after(io, self.delivery_timeout_ms, Timer::RequestTimeout(rid));
    }

    /// The answer `Core::decision_query` gives: the engine's, unless the outcome index holds
    /// the attempt and the engine did not answer from its own record.
    fn answer_query(&self, engine: &Engine, txid: &TxId, query: &DecisionQuery) -> DecisionAnswer {
        let answer = engine.decision_for(txid, Some(query));
        if answer.source == AnswerSource::Record {
            return answer;
        }
        match self.indexed(&query.gtid) {
            Some(retained) => DecisionAnswer::from_index(
                txid,
                &retained.decision.txid,
                &query.gtid,
                retained.decision.decision.into(),
            ),
            None => answer,
        }
    }

    /// The index's entry for attempt `gtid`, under whatever id.
    pub fn indexed(&self, gtid: &GlobalTxId) -> Option<&Retained> {
        self.index
            .values()
            .find(|r| r.decision.attempt.gtid == *gtid)
    }

    /// The invariant on every answer: a decision given for an attempt is the one its log
    /// record or index entry holds, and only under the id it was begun with (the broken
    /// promise, if any).
    fn check_answer(
        &self,
        engine: &Engine,
        txid: &TxId,
        query: &DecisionQuery,
        answer: DecisionStatus,
    ) -> Option<String> {
        let given = match answer {
            DecisionStatus::Commit => Decision::Commit,
            DecisionStatus::Abort => Decision::Abort,
            DecisionStatus::Pending | DecisionStatus::Unknown => return None,
        };
        let held = engine
            .owner_of(&query.gtid)
            .and_then(|owner| {
                let decided = match owner.answer {
                    DecisionStatus::Commit => Some(Decision::Commit),
                    DecisionStatus::Abort => Some(Decision::Abort),
                    DecisionStatus::Pending | DecisionStatus::Unknown => None,
                };
                decided.map(|d| (owner.txid, d))
            })
            .or_else(|| {
                self.indexed(&query.gtid)
                    .map(|r| (r.decision.txid.clone(), r.decision.decision))
            });
        match held {
            Some((owner, _)) if owner != *txid => Some(format!(
                "answered {given:?} for {} asked as {txid}, but it is an attempt of {owner}",
                query.gtid
            )),
            Some((_, decided)) if decided != given => Some(format!(
                "answered {given:?} for {} ({txid}), but its log or index holds {decided:?}",
                query.gtid
            )),
            _ => None,
        }
    }

    /// Whether this run refuses new work because its log is behind.
    pub fn is_behind(&self) -> bool {
        self.stopped_by_query || self.engine.as_ref().is_some_and(|e| e.behind().is_some())
    }

    /// The behind mark (not the mutation's stop), for the operator.
    pub fn is_marked_behind(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| e.behind().is_some())
    }

    /// (Re)starts: replay what the disk holds, log the next epoch durably, finish recovery.
    pub fn start(&mut self, io: &mut Io) {
        self.incarnation += 1;
        let replayed = Engine::replay(
            self.config,
            self.disk.snapshot().cloned(),
            self.disk.records().to_vec(),
        );
        // A fresh incarnation, never one the log holds (as `runtime::start` draws it).
        let incarnation = loop {
            let candidate = protocol::Incarnation(io.rng.u64(..));
            if !replayed.engine.runs().any(|r| r.incarnation == candidate) {
                break candidate;
            }
        };
        let identity = match replayed.identity {
            Some(last) => EpochRecord {
                coordinator_id: last.coordinator_id,
                epoch: last.epoch.next(),
                incarnation,
            },
            None => EpochRecord {
                coordinator_id: CoordinatorId::new(COORDINATOR_ID).expect("a constant, valid id"),
                epoch: Epoch(1),
                incarnation,
            },
        };
        // Opening the log fsyncs what survived; the epoch append is forced and awaited.
        self.disk.append(LogRecord::Epoch(identity.clone()));
        let newly = self.disk.sync();
        self.note_durable(&newly);
        io.note(|| {
            format!(
                "coordinator up, epoch {} incarnation {}",
                identity.epoch, identity.incarnation
            )
        });
        self.identity = Some(identity.clone());
        self.engine = Some(replayed.engine);
        // What replay rebuilt (snapshot and End records) plus the index must hold every
        // outcome that ended before the crash.
        self.check_outcomes_held();
        self.step(
            io,
            Event::RecoveryDone {
                now_ms: io.now_ms,
                identity,
            },
        );
        for index in 0..self.participants.len() {
            self.probe(io, index);
        }
    }

    /// Crashes, keeping the durable records and `extra` of the unsynced ones.
    pub fn crash(&mut self, extra: usize) {
        self.disk.crash(extra);
        self.crashes += 1;
        self.stop();
    }

    fn stop(&mut self) {
        self.engine = None;
        self.calls.clear();
        self.waiters.clear();
        self.decision_waits.clear();
        self.audit_waits.clear();
        self.epoch_waits.clear();
        self.sync_scheduled = false;
        // An uncommitted archive batch dies with the process.
        self.archive_batch.clear();
    }

    /// A clean stop: the log is closed, so everything written becomes durable.
    pub fn shutdown(&mut self) {
        if self.is_up() {
            let newly = self.disk.sync();
            self.note_durable(&newly);
            self.stop();
        }
    }

    /// A clean stop, then a copy of the data directory.
    pub fn backup(&mut self) {
        self.shutdown();
        self.backup = Some(self.disk.clone());
        self.backup_index = Some(self.index.clone());
    }

    /// Stops (however it was running) and puts the operator's copy back; `false` when there is
    /// no copy yet.
    pub fn restore(&mut self) -> bool {
        let Some(backup) = self.backup.clone() else {
            return false;
        };
        self.stop();
        self.disk = backup;
        self.index = self.backup_index.clone().unwrap_or_default();
        // Outcomes after the backup are gone with the log that held them (the restore
        // procedure's known loss); the promise starts again from what was restored.
        self.must_hold.clear();
        self.restores += 1;
        true
    }

    pub fn checkpoint(&mut self, io: &mut Io) {
        let (Some(engine), Some(identity)) = (&self.engine, &self.identity) else {
            return;
        };
        let snapshot = engine.snapshot(identity.clone());
        let newly = self.disk.checkpoint(snapshot);
        self.note_durable(&newly);
        io.note(|| "coordinator checkpoint".into());
        self.resolve_durable(io);
    }

    pub fn disk_synced(&mut self, io: &mut Io) {
        self.sync_scheduled = false;
        if !self.is_up() {
            return;
        }
        let newly = self.disk.sync();
        self.note_durable(&newly);
        self.resolve_durable(io);
        self.commit_archive(io);
    }

    fn resolve_durable(&mut self, io: &mut Io) {
        let durable = self.disk.durable_seq();
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .decision_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.decision_waits = waiting;
        for (_, txid) in ready {
            self.step(io, Event::DecisionDurable { txid });
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .audit_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.audit_waits = waiting;
        if let Some(engine) = &mut self.engine {
            for (_, entry) in ready {
                engine.apply_audit(entry);
            }
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .epoch_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.epoch_waits = waiting;
        for (_, raised) in ready {
            io.note(|| format!("coordinator's raised epoch {} is durable", raised.epoch));
            self.raises += 1;
            self.identity = Some(raised.clone());
            self.step(io, Event::EpochDurable { identity: raised });
            for index in 0..self.participants.len() {
                self.probe(io, index);
            }
        }
    }

    pub fn submit(&mut self, io: &mut Io, order: usize, attempt: u32, tx: &SubmitTx) {
        if self.is_behind() {
            // 503 log_behind: the client hears no outcome and tries again later.
            io.note(|| format!("coordinator refuses {} (log behind)", tx.txid));
            return;
        }
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.insert(waiter, (order, attempt));
        let Some(engine) = &self.engine else {
            return;
        };
        // What a retry must be answered from: staged in the engine, or in the index.
        let recorded = engine
            .status(&tx.txid)
            .filter(|s| s.ended_at_ms.is_some())
            .map(|s| s.gtid)
            .or_else(|| {
                self.index
                    .get(&tx.txid)
                    .map(|r| r.decision.attempt.gtid.clone())
            });
        let recorded_digest = self
            .index
            .get(&tx.txid)
            .map(|r| r.decision.digest)
            .filter(|_| recorded.is_some());
        let archived = self.index.get(&tx.txid).cloned();
        let archive_generation = engine.archive_generation();
        let commands = self.step_collect(
            io,
            Event::Submit {
                waiter,
                wait: tx.wait,
                txid: tx.txid.clone(),
                digest: tx.digest,
                participants: tx.participants.clone(),
                timeout_ms: tx.timeout_ms,
                now_ms: io.now_ms,
                archived,
                archive_generation,
                client: None,
            },
        );
        if let Some(gtid) = recorded {
            for command in &commands {
                let broken = match command {
                    Command::SendPrepare { attempt, .. } => Some(format!(
                        "a retry of {} started attempt {} though outcome {gtid} is recorded",
                        tx.txid, attempt.gtid
                    )),
                    Command::Reply {
                        reply: coordinator::engine::Reply::Outcome(response),
                        ..
                    } if response.gtid != gtid => Some(format!(
                        "a retry of {} was answered from {} though outcome {gtid} is recorded",
                        tx.txid, response.gtid
                    )),
                    Command::Reply {
                        reply: coordinator::engine::Reply::Conflict { .. },
                        ..
                    } if recorded_digest == Some(tx.digest) => Some(format!(
                        "a same-body retry of {} got a conflict; outcome {gtid} is recorded",
                        tx.txid
                    )),
                    _ => None,
                };
                if let Some(broken) = broken
                    && self.outcome_violation.is_none()
                {
                    self.outcome_violation = Some(broken);
                }
            }
        }
    }

    pub fn deliver(&mut self, io: &mut Io, body: Body) {
        if !self.is_up() {
            return;
        }
        match body {
            Body::PrepareAnswer { rid, to, answer } if to == self.incarnation => {
                if let Some(Call::Prepare(txid, participant, sent)) = self.calls.remove(&rid) {
                    let (vote, reason) = match answer {
                        Ok(Vote::Yes) => (VoteKind::Yes, None),
                        Ok(Vote::No { reason }) => (VoteKind::No, Some(reason)),
                        Err(refusal) => {
                            if fences_out(refusal.error) {
                                self.fenced(io, participant.clone(), "a prepare", sent, &refusal);
                            }
                            (VoteKind::Error, Some(refusal.message))
                        }
                    };
                    self.vote(io, txid, participant, vote, reason);
                }
            }
            Body::DecideAnswer { rid, to, answer } if to == self.incarnation => {
                match self.calls.remove(&rid) {
                    Some(Call::Deliver(txid, participant, sent)) => {
                        let event = match answer {
                            Ok(()) => Event::Acked {
                                txid,
                                participant,
                                now_ms: io.now_ms,
                            },
                            Err(refusal) => {
                                // As the runtime: the failure first, then the evidence (a raise
                                // restarts the delivery waiting for its timer).
                                let failed = Event::DeliveryFailed {
                                    txid,
                                    participant: participant.clone(),
                                    error: refusal.message.clone(),
                                    jitter: io.rng.u64(..),
                                };
                                self.step(io, failed);
                                if fences_out(refusal.error) {
                                    self.fenced(io, participant, "a decision", sent, &refusal);
                                }
                                return;
                            }
                        };
                        self.step(io, event);
                    }
                    Some(Call::Probe(index, sent)) => match answer {
                        Ok(()) => io.note(|| format!("participant {index} acknowledges the probe")),
                        Err(refusal) if fences_out(refusal.error) => {
                            let participant = self.participants[index].clone();
                            self.fenced(io, participant, "the epoch probe", sent, &refusal);
                        }
                        Err(_) => self.timer_after(io, PROBE_RETRY_MS, Timer::ProbeDue(index)),
                    },
                    Some(Call::Prepare(..)) | None => {}
                }
            }
            Body::Query {
                rid,
                from,
                txid,
                query,
            } => {
                let (Some(engine), Some(identity)) = (&self.engine, &self.identity) else {
                    return;
                };
                let mut answer = self.answer_query(engine, &txid, &query);
                let response_identity = identity.clone();
                // The mutation: presume abort where the log cannot prove it.
                if io.mutation == Mutation::AbortWhenUnknown
                    && answer.decision == DecisionStatus::Unknown
                {
                    answer.decision = DecisionStatus::Abort;
                }
                let broken = self.check_answer(engine, &txid, &query, answer.decision);
                if self.answer_violation.is_none() {
                    self.answer_violation = broken;
                }
                if answer.unknown_run {
                    // A claim, not evidence: counted.
                    self.unknown_run_queries += 1;
                    if io.mutation == Mutation::BehindFromQuery {
                        // The mutation: the old rule, a query's say-so stops new work.
                        self.stopped_by_query = true;
                    }
                }
                io.send(Msg {
                    to: Some(Node::Participant(from.0)),
                    body: Body::QueryAnswer {
                        rid,
                        to: from.1,
                        answer: DecisionQueryResponse {
                            decision: answer.decision,
                            coordinator_id: Some(response_identity.coordinator_id),
                            epoch: Some(response_identity.epoch),
                            incarnation: Some(response_identity.incarnation),
                            reason: answer.reason,
                        },
                    },
                });
            }
            // Answers for a previous incarnation, and messages that are not for us.
            Body::PrepareAnswer { .. }
            | Body::DecideAnswer { .. }
            | Body::Submit { .. }
            | Body::ClientAnswer { .. }
            | Body::Prepare { .. }
            | Body::Decide { .. }
            | Body::QueryAnswer { .. } => {}
        }
    }

    fn vote(
        &mut self,
        io: &mut Io,
        txid: TxId,
        participant: ParticipantName,
        vote: VoteKind,
        reason: Option<String>,
    ) {
        self.step(
            io,
            Event::VoteReceived {
                txid,
                participant,
                vote,
                reason,
                now_ms: io.now_ms,
            },
        );
    }

    pub fn timer(&mut self, io: &mut Io, incarnation: Incarnation, timer: Timer) {
        if !self.is_up() || incarnation != self.incarnation {
            return;
        }
        match timer {
            Timer::PrepareDeadline(txid) => self.step(
                io,
                Event::PrepareDeadline {
                    txid,
                    now_ms: io.now_ms,
                },
            ),
            Timer::RetryDue(txid, participant) => {
                self.step(io, Event::RetryDue { txid, participant })
            }
            Timer::ProbeDue(index) => self.probe(io, index),
            Timer::RequestTimeout(rid) => match self.calls.remove(&rid) {
                Some(Call::Probe(index, _)) => self.probe(io, index),
                Some(Call::Prepare(txid, participant, _)) => {
                    // The mutation: a prepare that got no answer counts as a yes.
                    let vote = match io.mutation {
                        Mutation::TimeoutCountsAsYes => VoteKind::Yes,
                        Mutation::None
                        | Mutation::PhaseTwoBeforeDurable
                        | Mutation::VoteBeforePreparedDurable
                        | Mutation::AbortWhenUnknown
                        | Mutation::ResolveWithoutEvidence
                        | Mutation::NoEpochBound
                        | Mutation::BehindFromQuery
                        | Mutation::UncheckedClaim
                        | Mutation::NoEpochRaise => VoteKind::Timeout,
                    };
                    self.vote(io, txid, participant, vote, None);
                }
                Some(Call::Deliver(txid, participant, _)) => {
                    let jitter = io.rng.u64(..);
                    self.step(
                        io,
                        Event::DeliveryFailed {
                            txid,
                            participant,
                            error: "timed out".into(),
                            jitter,
                        },
                    );
                }
                None => {}
            },
            Timer::Tick => {}
        }
    }

    /// Steps the engine and executes its commands in order, feeding back what completes at
    /// once.
    fn step(&mut self, io: &mut Io, event: Event) {
        self.step_collect(io, event);
    }

    /// `step`, returning the commands it executed (for the submit checks).
    fn step_collect(&mut self, io: &mut Io, event: Event) -> Vec<Command> {
        let Some(engine) = &mut self.engine else {
            return Vec::new();
        };
        let commands = engine.step(event);
        let mut durable_now = Vec::new();
        for command in commands.clone() {
            self.execute(io, command, &mut durable_now);
        }
        self.check_outcomes_held();
        for txid in durable_now {
            self.step(io, Event::DecisionDurable { txid });
        }
        commands
    }

    fn execute(&mut self, io: &mut Io, command: Command, durable_now: &mut Vec<TxId>) {
        let Some(identity) = self.identity.clone() else {
            return;
        };
        match command {
            Command::AppendForced(record) => {
                io.note(|| format!("coordinator logs (forced) {record:?}"));
                self.disk.append(record);
                self.schedule_sync(io);
            }
            Command::AppendEpoch(_) if io.mutation == Mutation::NoEpochRaise => {
                // The mutation: the evidence is marked, the epoch stays where it was.
                io.note(|| "coordinator does not raise its epoch (mutation)".to_string());
            }
            Command::AppendEpoch(raised) => {
                io.note(|| format!("coordinator raises its epoch to {}", raised.epoch));
                let seq = self.disk.append(LogRecord::Epoch(raised.clone()));
                self.epoch_waits.push((seq, raised));
                self.schedule_sync(io);
            }
            Command::AppendLazy(record) => {
                if let LogRecord::Begin(begin) = &record {
                    self.attempts.insert(
                        begin.attempt.gtid.clone(),
                        (begin.txid.clone(), begin.digest),
                    );
                }
                self.disk.append(record);
            }
            Command::AppendDecision(decision) => {
                let txid = decision.txid.clone();
                io.note(|| format!("coordinator logs {:?} {txid}", decision.decision));
                let seq = self.disk.append(LogRecord::Decision(decision));
                match io.mutation {
                    // The mutation: act on the decision before it is durable.
                    Mutation::PhaseTwoBeforeDurable => durable_now.push(txid),
                    Mutation::None
                    | Mutation::TimeoutCountsAsYes
                    | Mutation::VoteBeforePreparedDurable
                    | Mutation::AbortWhenUnknown
                    | Mutation::ResolveWithoutEvidence
                    | Mutation::NoEpochBound
                    | Mutation::BehindFromQuery
                    | Mutation::UncheckedClaim
                    | Mutation::NoEpochRaise => {
                        self.decision_waits.push((seq, txid));
                        self.schedule_sync(io);
                    }
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
                let rid = io.rid();
                let index = self.part_index(&participant);
                self.calls.insert(
                    rid,
                    Call::Prepare(txid.clone(), participant, identity.epoch),
                );
                io.send(Msg {
                    to: Some(Node::Participant(index)),
                    body: Body::Prepare {
                        rid,
                        from: self.incarnation,
                        request: PrepareRequest {
                            txid,
                            gtid: attempt.gtid,
                            coordinator_id: identity.coordinator_id,
                            epoch: identity.epoch,
                            incarnation: identity.incarnation,
                            position: attempt.position,
                            payload,
                            started_at_ms: Some(started_at_ms),
                            // As the real runtime does: the no arrives before the deadline.
                            lock_wait_ms: Some(timeout_ms.saturating_mul(3) / 4),
                            participants: Some(named),
                        },
                    },
                });
                self.timer_after(io, timeout_ms, Timer::RequestTimeout(rid));
            }
            Command::ArmPrepareDeadline { txid, after_ms } => {
                self.timer_after(io, after_ms, Timer::PrepareDeadline(txid));
            }
            Command::SendDecision {
                txid,
                gtid,
                participant,
                decision,
                attempt: _,
                // An untracked abort's answer is ignored by the engine, like the runtime's.
                tracked: _,
            } => {
                let rid = io.rid();
                let index = self.part_index(&participant);
                self.calls.insert(
                    rid,
                    Call::Deliver(txid.clone(), participant, identity.epoch),
                );
                io.send(Msg {
                    to: Some(Node::Participant(index)),
                    body: Body::Decide {
                        rid,
                        from: self.incarnation,
                        decision,
                        request: DecisionRequest {
                            txid,
                            gtid,
                            coordinator_id: identity.coordinator_id,
                            epoch: identity.epoch,
                            incarnation: identity.incarnation,
                        },
                    },
                });
                self.timer_after(io, self.delivery_timeout_ms, Timer::RequestTimeout(rid));
            }
            Command::ArmRetry {
                txid,
                participant,
                after_ms,
            } => {
                self.timer_after(io, after_ms, Timer::RetryDue(txid, participant));
            }
            Command::Archive(retained) => {
                self.must_hold.insert(
                    retained.decision.txid.clone(),
                    retained.decision.attempt.gtid.clone(),
                );
                self.archive_batch.push(retained);
                self.schedule_sync(io);
            }
            Command::Reply { waiter, reply } => {
                if let Some((order, attempt)) = self.waiters.remove(&waiter) {
                    io.send(Msg {
                        to: None,
                        body: Body::ClientAnswer {
                            order,
                            attempt,
                            reply,
                        },
                    });
                }
            }
        }
    }

    fn timer_after(&self, io: &mut Io, after_ms: u64, timer: Timer) {
        io.after(
            after_ms,
            Ev::Timer {
                node: Self::node(),
                incarnation: self.incarnation,
                timer,
            },
        );
    }

    fn schedule_sync(&mut self, io: &mut Io) {
        if !self.sync_scheduled {
            self.sync_scheduled = true;
            let delay = io.rng.u64(0..=io.sync_max_ms);
            io.after(
                delay,
                Ev::DiskSync {
                    node: Self::node(),
                    incarnation: self.incarnation,
                },
            );
        }
    }
}

/// Whether a participant's error answer proves this run's log is behind what it saw.
fn fences_out(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::StaleEpoch | ErrorCode::IncarnationConflict)
}

/// A client transaction as the coordinator's API hands it to the engine.
#[derive(Debug, Clone)]
pub struct SubmitTx {
    pub txid: TxId,
    pub digest: Digest,
    pub participants: Vec<(ParticipantName, serde_json::Value)>,
    pub timeout_ms: u64,
    pub wait: WaitFor,
}
