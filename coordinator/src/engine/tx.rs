//! One live transaction as the engine holds it.

use protocol::{
    Decision, Outcome, ParticipantName, ParticipantResult, TransactionResponse, TxId, VoteKind,
};

use crate::digest::Digest;
use crate::engine::io::{WaitFor, WaiterId};
use crate::records::{Attempt, DecisionRecord};

/// Where a live transaction is.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Prepares out, votes coming in. A transaction known only from a `Begin` record (after a
    /// restart) is here too, without payloads; recovery aborts it.
    Preparing,
    /// The decision record is submitted but not yet durable: nobody hears it yet.
    Deciding(Decided),
    /// The decision is durable: phase two, until every participant acknowledged.
    Decided(Decided),
    /// The decision record could not be made durable (the log failed). The outcome is unknown
    /// until a restart replays the log, so this answers `pending` to participants.
    LogFailed { error: String },
}

/// A decision and what goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    pub decision: Decision,
    pub reason: Option<String>,
    pub decided_at_ms: u64,
}

/// Whether a phase-two message is on its way to a participant, so timers and answers never
/// start a second concurrent delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Idle,
    InFlight,
    RetryArmed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub name: ParticipantName,
    pub vote: Option<VoteKind>,
    pub reason: Option<String>,
    pub acked: bool,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub delivery: Delivery,
}

impl Part {
    pub fn new(name: ParticipantName) -> Part {
        Part {
            name,
            vote: None,
            reason: None,
            acked: false,
            attempts: 0,
            last_error: None,
            delivery: Delivery::Idle,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tx {
    pub id: TxId,
    /// The attempt participants know; a client id has at most one live attempt.
    pub attempt: Attempt,
    pub digest: Digest,
    pub created_at_ms: u64,
    pub parts: Vec<Part>,
    pub phase: Phase,
    pub waiters: Vec<(WaiterId, WaitFor)>,
    /// The submitting client's name (from its token), if authentication is on.
    pub client: Option<String>,
}

impl Tx {
    pub fn part_mut(&mut self, name: &ParticipantName) -> Option<&mut Part> {
        self.parts.iter_mut().find(|p| &p.name == name)
    }

    pub fn all_acked(&self) -> bool {
        self.parts.iter().all(|p| p.acked)
    }

    pub fn decision_record(&self, decided: &Decided) -> DecisionRecord {
        DecisionRecord {
            txid: self.id.clone(),
            attempt: self.attempt.clone(),
            digest: self.digest,
            decision: decided.decision,
            reason: decided.reason.clone(),
            votes: self
                .parts
                .iter()
                .map(|p| (p.name.clone(), p.vote.unwrap_or(VoteKind::Timeout)))
                .collect(),
            created_at_ms: self.created_at_ms,
            decided_at_ms: decided.decided_at_ms,
            client: self.client.clone(),
        }
    }

    /// A live transaction rebuilt from its decision record (recovery).
    pub fn from_decision(record: &DecisionRecord) -> Tx {
        Tx {
            id: record.txid.clone(),
            attempt: record.attempt.clone(),
            digest: record.digest,
            created_at_ms: record.created_at_ms,
            parts: record
                .votes
                .iter()
                .map(|(name, vote)| {
                    let mut part = Part::new(name.clone());
                    part.vote = Some(*vote);
                    part
                })
                .collect(),
            phase: Phase::Decided(Decided {
                decision: record.decision,
                reason: record.reason.clone(),
                decided_at_ms: record.decided_at_ms,
            }),
            waiters: Vec::new(),
            client: record.client.clone(),
        }
    }
}

pub fn outcome_of(decision: Decision) -> Outcome {
    match decision {
        Decision::Commit => Outcome::Committed,
        Decision::Abort => Outcome::Aborted,
    }
}

/// The client's answer for a decided transaction.
pub fn response(tx: &Tx, decided: &Decided) -> TransactionResponse {
    TransactionResponse {
        id: tx.id.clone(),
        gtid: tx.attempt.gtid.clone(),
        outcome: outcome_of(decided.decision),
        reason: decided.reason.clone(),
        participants: tx
            .parts
            .iter()
            .map(|p| ParticipantResult {
                name: p.name.clone(),
                vote: p.vote.unwrap_or(VoteKind::Timeout),
                acked: p.acked,
            })
            .collect(),
    }
}

/// The client's answer for an ended transaction: everyone acknowledged.
pub fn retained_response(record: &DecisionRecord) -> TransactionResponse {
    TransactionResponse {
        id: record.txid.clone(),
        gtid: record.attempt.gtid.clone(),
        outcome: outcome_of(record.decision),
        reason: record.reason.clone(),
        participants: record
            .votes
            .iter()
            .map(|(name, vote)| ParticipantResult {
                name: name.clone(),
                vote: *vote,
                acked: true,
            })
            .collect(),
    }
}
