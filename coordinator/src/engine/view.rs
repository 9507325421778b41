//! Read-only views of the table: status, listing, the decision for participants in doubt, and
//! the counts the metrics show.

use protocol::{
    DecisionStatus, Outcome, ParticipantStatus, TransactionState, TransactionStatus, TxId,
};

use crate::engine::Engine;
use crate::engine::tx::{Delivery, Phase, Tx, outcome_of};
use crate::records::Retained;

/// The answer to a participant's decision query, as far as the table knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionLookup {
    /// Commit or abort (durable), or pending (not decided or not durable yet).
    Known(DecisionStatus),
    /// A presumed abort for this id is being logged: wait for it (`Event::UnknownIdQueried`).
    PresumingAbort,
    /// No record at all: presume abort, durably first (`Event::UnknownIdQueried`).
    Unknown,
}

/// Counts for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    pub preparing: u64,
    pub committing: u64,
    pub aborting: u64,
    pub retained: u64,
    /// Participants that have not acknowledged a durable decision.
    pub pending_acks: u64,
}

impl Engine {
    pub fn status(&self, txid: &TxId) -> Option<TransactionStatus> {
        if let Some(tx) = self.live.get(txid) {
            return Some(live_status(tx));
        }
        self.retained.get(txid).map(retained_status)
    }

    /// Transactions in `state` (all when `None`), at most `limit`: live ones first, oldest
    /// created first, then ended ones, oldest ended first. Cost follows `limit` and the live
    /// set, not the number of retained outcomes (this runs under the engine lock).
    pub fn list(&self, state: Option<TransactionState>, limit: usize) -> Vec<TransactionStatus> {
        let wanted = |s: &TransactionStatus| state.is_none_or(|w| s.state == w);
        let mut out: Vec<TransactionStatus> =
            self.live.values().map(live_status).filter(wanted).collect();
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        out.truncate(limit);
        let ended_wanted = state
            .is_none_or(|w| matches!(w, TransactionState::Committed | TransactionState::Aborted));
        if ended_wanted && out.len() < limit {
            let room = limit - out.len();
            out.extend(
                self.retained
                    .iter()
                    .map(retained_status)
                    .filter(wanted)
                    .take(room),
            );
        }
        out
    }

    /// What a participant in doubt can be told without writing anything. An id with no
    /// record is `pending` here, not `abort`: presumed abort is only safe once a record of it
    /// is durable (see `Event::UnknownIdQueried`), or a client retrying the id could start it
    /// afresh and commit it while the participant acts on "abort".
    pub fn decision_query(&self, txid: &TxId) -> DecisionStatus {
        match self.decision_lookup(txid) {
            DecisionLookup::Known(status) => status,
            DecisionLookup::PresumingAbort | DecisionLookup::Unknown => DecisionStatus::Pending,
        }
    }

    /// What is known about `txid` for a participant's decision query.
    pub fn decision_lookup(&self, txid: &TxId) -> DecisionLookup {
        if let Some(tx) = self.live.get(txid) {
            return match &tx.phase {
                Phase::Decided(decided) => DecisionLookup::Known(decided.decision.into()),
                Phase::Deciding(_) if tx.presumed => DecisionLookup::PresumingAbort,
                // Not durable yet (or unknowable after a log failure): ask again.
                Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => {
                    DecisionLookup::Known(DecisionStatus::Pending)
                }
            };
        }
        match self.retained.get(txid) {
            Some(retained) => DecisionLookup::Known(retained.decision.decision.into()),
            None => DecisionLookup::Unknown,
        }
    }

    pub fn gauges(&self) -> Gauges {
        let mut gauges = Gauges {
            retained: self.retained.len() as u64,
            ..Gauges::default()
        };
        for tx in self.live.values() {
            match live_state(tx) {
                TransactionState::Preparing => gauges.preparing += 1,
                TransactionState::Committing => gauges.committing += 1,
                TransactionState::Aborting => gauges.aborting += 1,
                TransactionState::Committed | TransactionState::Aborted => {}
            }
            if let Phase::Decided(_) = tx.phase {
                gauges.pending_acks += tx.parts.iter().filter(|p| !p.acked).count() as u64;
            }
        }
        gauges
    }

    /// Participants with a phase-two delivery waiting for its retry timer (for tests).
    pub fn retrying(&self) -> usize {
        self.live
            .values()
            .flat_map(|tx| &tx.parts)
            .filter(|p| p.delivery == Delivery::RetryArmed)
            .count()
    }
}

fn live_state(tx: &Tx) -> TransactionState {
    match &tx.phase {
        Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => {
            TransactionState::Preparing
        }
        Phase::Decided(decided) => match outcome_of(decided.decision) {
            Outcome::Committed => TransactionState::Committing,
            Outcome::Aborted => TransactionState::Aborting,
        },
    }
}

fn live_status(tx: &Tx) -> TransactionStatus {
    let (outcome, reason, decided_at_ms) = match &tx.phase {
        Phase::Decided(decided) => (
            Some(outcome_of(decided.decision)),
            decided.reason.clone(),
            Some(decided.decided_at_ms),
        ),
        Phase::LogFailed { error } => (None, Some(format!("log failed: {error}")), None),
        Phase::Preparing | Phase::Deciding(_) => (None, None, None),
    };
    TransactionStatus {
        id: tx.id.clone(),
        state: live_state(tx),
        outcome,
        reason,
        participants: tx
            .parts
            .iter()
            .map(|p| ParticipantStatus {
                name: p.name.clone(),
                vote: p.vote,
                acked: p.acked,
                attempts: p.attempts,
                last_error: p.last_error.clone(),
            })
            .collect(),
        created_at_ms: tx.created_at_ms,
        decided_at_ms,
        ended_at_ms: None,
    }
}

fn retained_status(retained: &Retained) -> TransactionStatus {
    let record = &retained.decision;
    let outcome = outcome_of(record.decision);
    TransactionStatus {
        id: record.txid.clone(),
        state: match outcome {
            Outcome::Committed => TransactionState::Committed,
            Outcome::Aborted => TransactionState::Aborted,
        },
        outcome: Some(outcome),
        reason: record.reason.clone(),
        participants: record
            .votes
            .iter()
            .map(|(name, vote)| ParticipantStatus {
                name: name.clone(),
                vote: Some(*vote),
                acked: true,
                attempts: 0,
                last_error: None,
            })
            .collect(),
        created_at_ms: record.created_at_ms,
        decided_at_ms: Some(record.decided_at_ms),
        ended_at_ms: Some(retained.ended_at_ms),
    }
}
