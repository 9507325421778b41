//! The pure two-phase-commit engine: `step(event) -> Vec<Command>`.
//!
//! No I/O, clock or randomness in here: the runtime feeds events (with the time and random
//! numbers they need) and executes the commands in order. The rules it enforces:
//! - commit only if every participant voted yes; a missing, late, malformed, timed-out or no
//!   vote means abort; duplicate and late votes change nothing;
//! - the decision is logged (and must be durable) before anyone hears it;
//! - phase two is retried until every participant acknowledged, never given up.

mod backoff;
mod epoch;
mod io;
pub mod judge;
mod load;
mod operator;
mod replay;
mod retained;
mod rules;
mod tx;
pub mod view;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_admission;
#[cfg(test)]
mod tests_attempts;
#[cfg(test)]
mod tests_epoch;
#[cfg(test)]
mod tests_staging;

use std::collections::BTreeMap;

use protocol::{Decision, Incarnation, ParticipantName, TxId, VoteKind};

pub use backoff::retry_delay_ms;
pub use epoch::{EPOCH_RAISE_MAX, EPOCH_RAISES_MAX, EpochState, Fenced};
pub use io::{Command, Event, Reply, WaitFor, WaiterId};
pub use load::{Bounds, Load};
pub use operator::{AUDIT_KEPT, OperatorSnapshot};
pub use replay::Replayed;
pub use tx::{Decided, Delivery, Phase};
pub use view::{AnswerSource, DecisionAnswer, Owner};

use crate::records::{
    AckRecord, Attempt, BeginRecord, BehindRecord, EndRecord, EpochRecord, LogRecord, Retained,
    RunSpan,
};
use load::Loads;
use operator::OperatorState;
use retained::RetainedSet;
use rules::{decide, send_decisions, start_delivery};
use tx::{Part, Tx, response, retained_response};

/// The engine's tunables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// First phase-two retry delay; doubles per failure.
    pub retry_base_ms: u64,
    /// Cap on the phase-two retry delay.
    pub retry_max_ms: u64,
    /// Most ended outcomes staged (ended, not yet durable in the outcome index); beyond it
    /// new attempts are refused (`Reply::Busy`) until the archiver catches up.
    pub retained_max: usize,
    /// Admission control: past these, new transactions naming that participant are refused
    /// (`Reply::Overloaded`), and a retry past the waiters bound too.
    pub bounds: Bounds,
}

/// Every transaction the coordinator knows: live ones, and ended ones not yet durable in the
/// outcome index (staging; the index, outside the engine, holds the rest of the retention
/// window); and every run (incarnation) its log holds, with how far it holds each.
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
    live: BTreeMap<TxId, Tx>,
    retained: RetainedSet,
    /// This run's identity: `None` between replay and `RecoveryDone`, when nothing is begun.
    identity: Option<EpochRecord>,
    /// The position the next attempt of this run gets (1, 2, ...).
    next_position: u64,
    runs: BTreeMap<Incarnation, RunSpan>,
    /// Proof that this log is behind what participants saw, once learned (durable).
    behind: Option<BehindRecord>,
    /// Raises of this run's epoch past a run that claimed it (`epoch`).
    epoch: EpochState,
    /// What each participant holds in `live`, kept in step with it by `step`.
    loads: Loads,
    /// Counts `Archived` events: a submit whose index lookup predates one must look again.
    archive_generation: u64,
    /// Attempts operators resolved by hand, and the audit trail.
    operator: OperatorState,
    /// Operator actions whose records are submitted and not yet durable (applied to
    /// `operator` only once durable, so nothing shows them before): a checkpoint taken
    /// meanwhile covers their records, so its copy includes them.
    audit_in_flight: Vec<protocol::operator::AuditEntry>,
}

impl Engine {
    /// An engine for a new, empty log whose run is `identity`.
    pub fn new(config: EngineConfig, identity: EpochRecord) -> Engine {
        let mut engine = Engine::empty(config);
        engine.begin_run(identity);
        engine
    }

    fn empty(config: EngineConfig) -> Engine {
        Engine {
            config,
            live: BTreeMap::new(),
            retained: RetainedSet::new(),
            identity: None,
            next_position: 1,
            runs: BTreeMap::new(),
            behind: None,
            epoch: EpochState::default(),
            loads: Loads::default(),
            archive_generation: 0,
            operator: OperatorState::default(),
            audit_in_flight: Vec::new(),
        }
    }

    /// What `participant` holds here now (admission control, metrics).
    pub fn load(&self, participant: &ParticipantName) -> Load {
        self.loads.get(participant)
    }

    /// Whether the incremental loads equal a count from scratch (the property tests' check).
    #[cfg(test)]
    pub(crate) fn loads_mirror_the_table(&self) -> bool {
        let mut fresh = Loads::default();
        fresh.recount(self.live.values());
        fresh == self.loads
    }

    /// Every participant holding anything here, with its load.
    pub fn loads(&self) -> impl Iterator<Item = (&ParticipantName, &Load)> {
        self.loads.iter()
    }

    /// How many `Archived` events this engine applied (see `Event::Submit`).
    pub fn archive_generation(&self) -> u64 {
        self.archive_generation
    }

    /// This run starts: later attempts are numbered from 1 under its incarnation.
    fn begin_run(&mut self, identity: EpochRecord) {
        assert!(
            !self.runs.contains_key(&identity.incarnation),
            "incarnation {} is already in this log: incarnations must never repeat",
            identity.incarnation
        );
        self.note_run(&identity);
        self.identity = Some(identity);
        self.next_position = 1;
    }

    /// A run's epoch record: the log holds that run from here on.
    /// A run's later epoch record (a raise) moves its span's epoch up, never down.
    fn note_run(&mut self, identity: &EpochRecord) {
        let span = self.runs.entry(identity.incarnation).or_insert(RunSpan {
            incarnation: identity.incarnation,
            epoch: identity.epoch,
            reach: 0,
        });
        span.epoch = span.epoch.max(identity.epoch);
    }

    /// The log holds `attempt`, so (positions being given in log order) every earlier attempt
    /// of its run too.
    fn note_attempt(&mut self, attempt: &Attempt) {
        let span = self.runs.entry(attempt.incarnation).or_insert(RunSpan {
            incarnation: attempt.incarnation,
            epoch: protocol::Epoch(0),
            reach: 0,
        });
        span.reach = span.reach.max(attempt.position);
    }

    /// This run's identity, once recovery began it.
    pub fn identity(&self) -> Option<&EpochRecord> {
        self.identity.as_ref()
    }

    /// Applies one event; returns what to do, in order.
    pub fn step(&mut self, event: Event) -> Vec<Command> {
        // Every event changes at most the one transaction it names (recovery changes all):
        // take its load out before and put it back after, so the counts mirror the table.
        let touched = event.txid().cloned();
        if let Some(tx) = touched.as_ref().and_then(|txid| self.live.get(txid)) {
            self.loads.account(tx, false);
        }
        let recovery = matches!(event, Event::RecoveryDone { .. });
        let commands = self.apply(event);
        if recovery {
            self.loads.recount(self.live.values());
        } else if let Some(tx) = touched.as_ref().and_then(|txid| self.live.get(txid)) {
            self.loads.account(tx, true);
        }
        commands
    }

    fn apply(&mut self, event: Event) -> Vec<Command> {
        match event {
            Event::Submit {
                waiter,
                wait,
                txid,
                digest,
                participants,
                timeout_ms,
                now_ms,
                archived,
                archive_generation,
                client,
            } => self.submit(
                waiter,
                wait,
                txid,
                digest,
                participants,
                timeout_ms,
                now_ms,
                (archived, archive_generation),
                client,
            ),
            Event::VoteReceived {
                txid,
                participant,
                vote,
                reason,
                now_ms,
            } => self.vote(&txid, &participant, vote, reason, now_ms),
            Event::PrepareDeadline { txid, now_ms } => self.prepare_deadline(&txid, now_ms),
            Event::DecisionDurable { txid } => self.decision_durable(&txid),
            Event::DecisionFailed { txid, error } => self.decision_failed(&txid, error),
            Event::Acked {
                txid,
                participant,
                now_ms,
            } => self.acked(&txid, &participant, now_ms),
            Event::DeliveryFailed {
                txid,
                participant,
                error,
                jitter,
            } => self.delivery_failed(&txid, &participant, error, jitter),
            Event::RetryDue { txid, participant } => self.retry_due(&txid, &participant),
            Event::RetryNow { txid, participant } => {
                self.retry_now(txid.as_ref(), participant.as_ref())
            }
            Event::RecoveryDone { now_ms, identity } => {
                self.begin_run(identity);
                self.recovery_done(now_ms)
            }
            Event::ExpireRetained {
                now_ms,
                retention_ms,
            } => {
                self.retained.expire(now_ms, retention_ms);
                Vec::new()
            }
            Event::Fenced(fenced) => self.fenced(fenced),
            Event::EpochDurable { identity } => self.epoch_durable(identity),
            Event::Archived { archived } => {
                for (txid, gtid) in &archived {
                    self.retained.remove_archived(txid, gtid);
                }
                self.archive_generation += 1;
                Vec::new()
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        waiter: WaiterId,
        wait: WaitFor,
        txid: TxId,
        digest: crate::digest::Digest,
        participants: Vec<(ParticipantName, serde_json::Value)>,
        timeout_ms: u64,
        now_ms: u64,
        (archived, archive_generation): (Option<Retained>, u64),
        client: Option<String>,
    ) -> Vec<Command> {
        if let Some(retained) = self.retained.get(&txid) {
            let reply = if retained.decision.digest == digest {
                Reply::Outcome(retained_response(&retained.decision))
            } else {
                Reply::Conflict { txid }
            };
            return vec![Command::Reply { waiter, reply }];
        }
        if let Some(tx) = self.live.get_mut(&txid) {
            if tx.digest != digest {
                return vec![Command::Reply {
                    waiter,
                    reply: Reply::Conflict { txid },
                }];
            }
            // A retry of a request we are still working on: answer now if its wait is over,
            // otherwise join the waiters. Never a second prepare.
            return match &tx.phase {
                Phase::Decided(decided) if wait == WaitFor::Decision => vec![Command::Reply {
                    waiter,
                    reply: Reply::Outcome(response(tx, decided)),
                }],
                Phase::LogFailed { error } => vec![Command::Reply {
                    waiter,
                    reply: Reply::LogFailed {
                        error: error.clone(),
                    },
                }],
                Phase::Decided(_) | Phase::Preparing | Phase::Deciding(_)
                    if tx.waiters.len() >= self.config.bounds.waiters_per_transaction =>
                {
                    vec![Command::Reply {
                        waiter,
                        reply: Reply::Overloaded {
                            participant: tx.parts[0].name.clone(),
                            message: format!(
                                "{} requests already wait for transaction {txid} (the bound is \
                                 {}); retry later",
                                tx.waiters.len(),
                                self.config.bounds.waiters_per_transaction
                            ),
                        },
                    }]
                }
                Phase::Decided(_) | Phase::Preparing | Phase::Deciding(_) => {
                    tx.waiters.push((waiter, wait));
                    Vec::new()
                }
            };
        }
        // Not live, not staged: the index's answer, if it had one, is the recorded outcome.
        if let Some(retained) = archived.filter(|r| r.decision.txid == txid) {
            let reply = if retained.decision.digest == digest {
                Reply::Outcome(retained_response(&retained.decision))
            } else {
                Reply::Conflict { txid }
            };
            return vec![Command::Reply { waiter, reply }];
        }
        if archive_generation != self.archive_generation {
            // Something left staging for the index since the runtime looked there: this id's
            // outcome may be among it. Look again rather than start a second attempt.
            return vec![Command::Reply {
                waiter,
                reply: Reply::LookAgain,
            }];
        }
        if self.retained.len() >= self.config.retained_max {
            return vec![Command::Reply {
                waiter,
                reply: Reply::Busy {
                    staged: self.retained.len(),
                },
            }];
        }
        if let Some(overload) = self.loads.refusal(
            &self.config.bounds,
            participants.iter().map(|(name, _)| name),
        ) {
            return vec![Command::Reply {
                waiter,
                reply: Reply::Overloaded {
                    participant: overload.participant,
                    message: overload.message,
                },
            }];
        }
        let Some(identity) = &self.identity else {
            // The runtime takes no transaction before recovery began this run.
            debug_assert!(false, "a transaction submitted before RecoveryDone");
            return vec![Command::Reply {
                waiter,
                reply: Reply::LogFailed {
                    error: "the coordinator has not finished recovery".to_string(),
                },
            }];
        };
        let attempt = Attempt::new(
            &identity.coordinator_id,
            identity.incarnation,
            self.next_position,
        );
        self.next_position += 1;
        self.note_attempt(&attempt);
        let mut commands = vec![Command::AppendLazy(LogRecord::Begin(BeginRecord {
            txid: txid.clone(),
            attempt: attempt.clone(),
            digest,
            participants: participants.iter().map(|(name, _)| name.clone()).collect(),
            created_at_ms: now_ms,
            client: client.clone(),
        }))];
        let named: Vec<ParticipantName> =
            participants.iter().map(|(name, _)| name.clone()).collect();
        for (name, payload) in &participants {
            commands.push(Command::SendPrepare {
                txid: txid.clone(),
                attempt: attempt.clone(),
                participant: name.clone(),
                payload: payload.clone(),
                timeout_ms,
                started_at_ms: now_ms,
                named: named.clone(),
            });
        }
        commands.push(Command::ArmPrepareDeadline {
            txid: txid.clone(),
            after_ms: timeout_ms,
        });
        let tx = Tx {
            id: txid.clone(),
            attempt,
            digest,
            created_at_ms: now_ms,
            parts: participants
                .into_iter()
                .map(|(name, _)| Part::new(name))
                .collect(),
            phase: Phase::Preparing,
            waiters: vec![(waiter, wait)],
            client,
        };
        self.live.insert(txid, tx);
        commands
    }

    fn vote(
        &mut self,
        txid: &TxId,
        participant: &ParticipantName,
        vote: VoteKind,
        reason: Option<String>,
        now_ms: u64,
    ) -> Vec<Command> {
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        match tx.phase {
            Phase::Preparing => {}
            // Late votes after the decision change nothing.
            Phase::Deciding(_) | Phase::Decided(_) | Phase::LogFailed { .. } => return Vec::new(),
        }
        let Some(part) = tx.part_mut(participant) else {
            return Vec::new();
        };
        if part.vote.is_some() {
            // A duplicate vote never counts twice, nor replaces the first.
            return Vec::new();
        }
        part.vote = Some(vote);
        part.reason = reason;
        if tx.parts.iter().all(|p| p.vote.is_some()) {
            decide(tx, now_ms)
        } else {
            Vec::new()
        }
    }

    fn prepare_deadline(&mut self, txid: &TxId, now_ms: u64) -> Vec<Command> {
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        match tx.phase {
            Phase::Preparing => {
                for part in tx.parts.iter_mut().filter(|p| p.vote.is_none()) {
                    part.vote = Some(VoteKind::Timeout);
                }
                decide(tx, now_ms)
            }
            Phase::Deciding(_) | Phase::Decided(_) | Phase::LogFailed { .. } => Vec::new(),
        }
    }

    fn decision_durable(&mut self, txid: &TxId) -> Vec<Command> {
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        let decided = match &tx.phase {
            Phase::Deciding(decided) => decided.clone(),
            Phase::Preparing | Phase::Decided(_) | Phase::LogFailed { .. } => return Vec::new(),
        };
        tx.phase = Phase::Decided(decided.clone());
        let mut commands = Vec::new();
        let answer = response(tx, &decided);
        tx.waiters.retain(|(waiter, wait)| match wait {
            WaitFor::Decision => {
                commands.push(Command::Reply {
                    waiter: *waiter,
                    reply: Reply::Outcome(answer.clone()),
                });
                false
            }
            WaitFor::Acked => true,
        });
        commands.extend(send_decisions(tx, decided.decision));
        if tx.all_acked() {
            // Nobody left to tell: it ends now.
            commands.extend(self.end(txid, &decided, decided.decided_at_ms));
        }
        commands
    }

    fn decision_failed(&mut self, txid: &TxId, error: String) -> Vec<Command> {
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        match tx.phase {
            Phase::Deciding(_) => {}
            Phase::Preparing | Phase::Decided(_) | Phase::LogFailed { .. } => return Vec::new(),
        }
        tx.phase = Phase::LogFailed {
            error: error.clone(),
        };
        tx.waiters
            .drain(..)
            .map(|(waiter, _)| Command::Reply {
                waiter,
                reply: Reply::LogFailed {
                    error: error.clone(),
                },
            })
            .collect()
    }

    fn acked(&mut self, txid: &TxId, participant: &ParticipantName, now_ms: u64) -> Vec<Command> {
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        let decided = match &tx.phase {
            Phase::Decided(decided) => decided.clone(),
            Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => return Vec::new(),
        };
        let Some(part) = tx.part_mut(participant) else {
            return Vec::new();
        };
        if part.acked {
            return Vec::new();
        }
        part.acked = true;
        part.delivery = Delivery::Idle;
        part.last_error = None;
        if tx.all_acked() {
            // End says every participant acknowledged: the last Ack would be redundant.
            return self.end(txid, &decided, now_ms);
        }
        vec![Command::AppendLazy(LogRecord::Ack(AckRecord {
            txid: txid.clone(),
            participant: participant.clone(),
        }))]
    }

    /// Every participant acknowledged: log End, answer whoever waits, keep the outcome.
    fn end(&mut self, txid: &TxId, decided: &Decided, now_ms: u64) -> Vec<Command> {
        let Some(tx) = self.live.remove(txid) else {
            return Vec::new();
        };
        let mut commands = vec![Command::AppendLazy(LogRecord::End(EndRecord {
            txid: txid.clone(),
            ended_at_ms: now_ms,
        }))];
        let answer = response(&tx, decided);
        for (waiter, _) in &tx.waiters {
            commands.push(Command::Reply {
                waiter: *waiter,
                reply: Reply::Outcome(answer.clone()),
            });
        }
        let retained = Retained {
            decision: tx.decision_record(decided),
            ended_at_ms: now_ms,
        };
        // Staged until the index holds it (`Archived`); the archive is the last command, after
        // the End append, though nothing depends on that order.
        commands.push(Command::Archive(retained.clone()));
        self.retained.insert(retained);
        commands
    }

    fn delivery_failed(
        &mut self,
        txid: &TxId,
        participant: &ParticipantName,
        error: String,
        jitter: u64,
    ) -> Vec<Command> {
        let config = self.config;
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        match tx.phase {
            Phase::Decided(_) => {}
            Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => return Vec::new(),
        }
        let Some(part) = tx.part_mut(participant) else {
            return Vec::new();
        };
        match part.delivery {
            Delivery::InFlight if !part.acked => {}
            Delivery::InFlight | Delivery::Idle | Delivery::RetryArmed => return Vec::new(),
        }
        part.last_error = Some(error);
        part.delivery = Delivery::RetryArmed;
        vec![Command::ArmRetry {
            txid: txid.clone(),
            participant: participant.clone(),
            after_ms: retry_delay_ms(
                part.attempts,
                config.retry_base_ms,
                config.retry_max_ms,
                jitter,
            ),
        }]
    }

    fn retry_due(&mut self, txid: &TxId, participant: &ParticipantName) -> Vec<Command> {
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        let decision = match &tx.phase {
            Phase::Decided(decided) => decided.decision,
            Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => return Vec::new(),
        };
        let gtid = tx.attempt.gtid.clone();
        let Some(part) = tx.part_mut(participant) else {
            return Vec::new();
        };
        match part.delivery {
            Delivery::RetryArmed if !part.acked => {}
            Delivery::RetryArmed | Delivery::Idle | Delivery::InFlight => return Vec::new(),
        }
        vec![start_delivery(txid, &gtid, part, decision)]
    }

    /// An operator's "retry now": every delivery of `txid` (or to `participant`, or both)
    /// that waits for its backoff timer starts at once. The timer, when it fires, finds the
    /// delivery in flight and does nothing.
    fn retry_now(
        &mut self,
        txid: Option<&TxId>,
        participant: Option<&ParticipantName>,
    ) -> Vec<Command> {
        let mut commands = Vec::new();
        for tx in self.live.values_mut() {
            if txid.is_some_and(|t| *t != tx.id) {
                continue;
            }
            let Phase::Decided(decided) = &tx.phase else {
                continue;
            };
            let decision = decided.decision;
            for part in &mut tx.parts {
                if part.acked
                    || part.delivery != Delivery::RetryArmed
                    || participant.is_some_and(|p| *p != part.name)
                {
                    continue;
                }
                commands.push(start_delivery(&tx.id, &tx.attempt.gtid, part, decision));
            }
        }
        commands
    }

    /// After replay: abort what was begun and never decided, resend what was decided and not
    /// acknowledged, end what was fully acknowledged.
    fn recovery_done(&mut self, now_ms: u64) -> Vec<Command> {
        // Everything staged (from the snapshot and the End records replayed) is archived
        // again: some of it may be in the index already, and upserts make that harmless.
        let mut commands: Vec<Command> = self
            .retained
            .iter()
            .cloned()
            .map(Command::Archive)
            .collect();
        let ids: Vec<TxId> = self.live.keys().cloned().collect();
        for txid in ids {
            let Some(tx) = self.live.get_mut(&txid) else {
                continue;
            };
            match tx.phase.clone() {
                Phase::Preparing => {
                    for part in tx.parts.iter_mut().filter(|p| p.vote.is_none()) {
                        part.vote = Some(VoteKind::Timeout);
                    }
                    let decided = Decided {
                        decision: Decision::Abort,
                        reason: Some("the coordinator restarted before deciding".into()),
                        decided_at_ms: now_ms,
                    };
                    commands.push(Command::AppendDecision(tx.decision_record(&decided)));
                    tx.phase = Phase::Deciding(decided);
                }
                Phase::Decided(decided) if tx.all_acked() => {
                    commands.extend(self.end(&txid, &decided, now_ms));
                }
                Phase::Decided(decided) => {
                    commands.extend(send_decisions(tx, decided.decision));
                    // An abort nobody voted yes to is owed to nobody: it ends now.
                    if tx.all_acked() {
                        commands.extend(self.end(&txid, &decided, now_ms));
                    }
                }
                // Neither exists right after replay: replay builds only Preparing and Decided.
                Phase::Deciding(_) | Phase::LogFailed { .. } => {}
            }
        }
        commands
    }
}
