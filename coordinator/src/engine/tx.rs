//! One live transaction as the engine holds it.

use protocol::{
    Decision, Outcome, ParticipantName, ParticipantResult, TransactionResponse, TxId, VoteKind,
};

use crate::digest::Digest;
use crate::engine::io::{WaitFor, WaiterId};
use crate::records::DecisionRecord;

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
    pub digest: Digest,
    pub created_at_ms: u64,
    pub parts: Vec<Part>,
    pub phase: Phase,
    pub waiters: Vec<(WaiterId, WaitFor)>,
    /// A presumed abort being made durable (or made durable): no participants, no digest.
    pub presumed: bool,
}

/// The reason a presumed abort records, and what a client retrying that id is told.
pub const PRESUMED_ABORT_REASON: &str = "presumed abort: a participant asked about this id after \
     the coordinator lost it (its start was not yet durable when the coordinator crashed); \
     use a new id to try again";

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
            presumed: self.presumed,
        }
    }

    /// A presumed abort for an id with no record, and its decision record to log (forced):
    /// `waiter` (the participant that asked) hears `abort` only once that record is durable.
    pub fn presumed_abort(txid: TxId, waiter: WaiterId, now_ms: u64) -> (Tx, DecisionRecord) {
        let decided = Decided {
            decision: Decision::Abort,
            reason: Some(PRESUMED_ABORT_REASON.to_string()),
            decided_at_ms: now_ms,
        };
        let tx = Tx {
            id: txid,
            // No request body is known; `presumed` makes any body get this outcome.
            digest: Digest(0),
            created_at_ms: now_ms,
            parts: Vec::new(),
            phase: Phase::Deciding(decided.clone()),
            waiters: vec![(waiter, WaitFor::Decision)],
            presumed: true,
        };
        let record = tx.decision_record(&decided);
        (tx, record)
    }

    /// Whether a client request with `digest` is this transaction's request (a retry) rather
    /// than another request reusing the id. Any request matches a presumed abort: its body was
    /// lost, and the id's outcome is settled either way.
    pub fn accepts(&self, digest: Digest) -> bool {
        self.presumed || self.digest == digest
    }

    /// A live transaction rebuilt from its decision record (recovery).
    pub fn from_decision(record: &DecisionRecord) -> Tx {
        Tx {
            id: record.txid.clone(),
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
            presumed: record.presumed,
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
