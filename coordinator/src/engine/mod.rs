//! The pure two-phase-commit engine: `step(event) -> Vec<Command>`.
//!
//! No I/O, clock or randomness in here: the runtime feeds events (with the time and random
//! numbers they need) and executes the commands in order. The rules it enforces:
//! - commit only if every participant voted yes; a missing, late, malformed, timed-out or no
//!   vote means abort; duplicate and late votes change nothing;
//! - the decision is logged (and must be durable) before anyone hears it;
//! - phase two is retried until every participant acknowledged, never given up.

mod backoff;
mod io;
mod replay;
mod retained;
mod rules;
mod tx;
pub mod view;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use protocol::{Decision, ParticipantName, TxId, VoteKind};

pub use backoff::retry_delay_ms;
pub use io::{Command, Event, Reply, WaitFor, WaiterId};
pub use replay::Replayed;
pub use tx::{Decided, Delivery, PRESUMED_ABORT_REASON, Phase};
pub use view::DecisionLookup;

use crate::records::{AckRecord, BeginRecord, EndRecord, LogRecord, Retained};
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
    /// Most ended outcomes kept (the oldest go first), whatever the retention window.
    pub retained_max: usize,
}

/// Every transaction the coordinator knows: live ones, and ended ones kept for the retention
/// window.
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
    live: BTreeMap<TxId, Tx>,
    retained: RetainedSet,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Engine {
        Engine {
            config,
            live: BTreeMap::new(),
            retained: RetainedSet::new(config.retained_max),
        }
    }

    /// Applies one event; returns what to do, in order.
    pub fn step(&mut self, event: Event) -> Vec<Command> {
        match event {
            Event::Submit {
                waiter,
                wait,
                txid,
                digest,
                participants,
                timeout_ms,
                now_ms,
            } => self.submit(waiter, wait, txid, digest, participants, timeout_ms, now_ms),
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
            Event::RecoveryDone { now_ms } => self.recovery_done(now_ms),
            Event::UnknownIdQueried {
                waiter,
                txid,
                now_ms,
            } => self.unknown_id_queried(waiter, txid, now_ms),
            Event::ExpireRetained {
                now_ms,
                retention_ms,
            } => {
                self.retained.expire(now_ms, retention_ms);
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
    ) -> Vec<Command> {
        if let Some(retained) = self.retained.get(&txid) {
            // A presumed abort answers any body: the one it stands for was lost.
            let reply = if retained.decision.presumed || retained.decision.digest == digest {
                Reply::Outcome(retained_response(&retained.decision))
            } else {
                Reply::Conflict { txid }
            };
            return vec![Command::Reply { waiter, reply }];
        }
        if let Some(tx) = self.live.get_mut(&txid) {
            if !tx.accepts(digest) {
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
                Phase::Decided(_) | Phase::Preparing | Phase::Deciding(_) => {
                    tx.waiters.push((waiter, wait));
                    Vec::new()
                }
            };
        }
        let mut commands = vec![Command::AppendLazy(LogRecord::Begin(BeginRecord {
            txid: txid.clone(),
            digest,
            participants: participants.iter().map(|(name, _)| name.clone()).collect(),
            created_at_ms: now_ms,
        }))];
        for (name, payload) in &participants {
            commands.push(Command::SendPrepare {
                txid: txid.clone(),
                participant: name.clone(),
                payload: payload.clone(),
                timeout_ms,
            });
        }
        commands.push(Command::ArmPrepareDeadline {
            txid: txid.clone(),
            after_ms: timeout_ms,
        });
        let tx = Tx {
            id: txid.clone(),
            digest,
            created_at_ms: now_ms,
            parts: participants
                .into_iter()
                .map(|(name, _)| Part::new(name))
                .collect(),
            phase: Phase::Preparing,
            waiters: vec![(waiter, wait)],
            presumed: false,
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
            // Nobody to tell (a presumed abort has no participants): it ends now.
            commands.extend(self.end(txid, &decided, decided.decided_at_ms));
        }
        commands
    }

    /// A participant asked for the decision on an id that `decision_lookup` reported as
    /// `Unknown` or `PresumingAbort`. Presumed abort is safe to say only once it cannot be
    /// undone: an unknown id gets a forced abort record first (a client retrying the id later
    /// must find it aborted, not start it afresh while the participant acts on "abort"), and
    /// `waiter` hears `abort` after `DecisionDurable`. A query while that record is in flight
    /// joins it (one record, however many ask). Any other id is answered from what is known:
    /// at once if decided, or once its decision is durable.
    fn unknown_id_queried(&mut self, waiter: WaiterId, txid: TxId, now_ms: u64) -> Vec<Command> {
        if let Some(retained) = self.retained.get(&txid) {
            return vec![Command::Reply {
                waiter,
                reply: Reply::Outcome(retained_response(&retained.decision)),
            }];
        }
        if let Some(tx) = self.live.get_mut(&txid) {
            return match &tx.phase {
                Phase::Decided(decided) => vec![Command::Reply {
                    waiter,
                    reply: Reply::Outcome(response(tx, decided)),
                }],
                Phase::LogFailed { error } => vec![Command::Reply {
                    waiter,
                    reply: Reply::LogFailed {
                        error: error.clone(),
                    },
                }],
                Phase::Preparing | Phase::Deciding(_) => {
                    tx.waiters.push((waiter, WaitFor::Decision));
                    Vec::new()
                }
            };
        }
        let (tx, record) = Tx::presumed_abort(txid.clone(), waiter, now_ms);
        self.live.insert(txid, tx);
        vec![Command::AppendDecision(record)]
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
        self.retained.insert(Retained {
            decision: tx.decision_record(decided),
            ended_at_ms: now_ms,
        });
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
        let Some(part) = tx.part_mut(participant) else {
            return Vec::new();
        };
        match part.delivery {
            Delivery::RetryArmed if !part.acked => {}
            Delivery::RetryArmed | Delivery::Idle | Delivery::InFlight => return Vec::new(),
        }
        vec![start_delivery(txid, part, decision)]
    }

    /// After replay: abort what was begun and never decided, resend what was decided and not
    /// acknowledged, end what was fully acknowledged.
    fn recovery_done(&mut self, now_ms: u64) -> Vec<Command> {
        let mut commands = Vec::new();
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
                Phase::Decided(decided) => commands.extend(send_decisions(tx, decided.decision)),
                // Neither exists right after replay: replay builds only Preparing and Decided.
                Phase::Deciding(_) | Phase::LogFailed { .. } => {}
            }
        }
        commands
    }
}
