//! A live transaction's way through the protocol: votes come in (or the prepare deadline
//! passes), the decision is logged and, once durable, answered and sent; acknowledgements come
//! in until every participant has one, and then it ends and is staged for the index.

use protocol::{ParticipantName, TxId, VoteKind};

use crate::engine::Engine;
use crate::engine::io::{Command, Reply, WaitFor};
use crate::engine::rules::{decide, send_decisions};
use crate::engine::tx::{Decided, Delivery, Phase, response};
use crate::records::{AckRecord, EndRecord, LogRecord, Retained};

impl Engine {
    pub(super) fn vote(
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

    pub(super) fn prepare_deadline(&mut self, txid: &TxId, now_ms: u64) -> Vec<Command> {
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

    pub(super) fn decision_durable(&mut self, txid: &TxId) -> Vec<Command> {
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

    pub(super) fn decision_failed(&mut self, txid: &TxId, error: String) -> Vec<Command> {
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

    pub(super) fn acked(
        &mut self,
        txid: &TxId,
        participant: &ParticipantName,
        now_ms: u64,
    ) -> Vec<Command> {
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
    pub(super) fn end(&mut self, txid: &TxId, decided: &Decided, now_ms: u64) -> Vec<Command> {
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
}
