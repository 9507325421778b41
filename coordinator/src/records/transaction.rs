//! The two-phase-commit records: who this run is, each attempt's begin, decision,
//! acknowledgements and end, the "log behind" mark, and what a checkpoint keeps of live and
//! ended transactions.

use serde::{Deserialize, Serialize};

use protocol::{
    CoordinatorId, Decision, Epoch, GlobalTxId, Incarnation, ParticipantName, TxId, VoteKind,
};

use crate::digest::Digest;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BehindRecord {
    pub evidence: String,
    pub at_ms: u64,
}

/// Who this coordinator is and which run this is. The incarnation is drawn at random at every
/// start, so a run started on a restored copy of the log never looks like the run it replaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub incarnation: Incarnation,
}

/// One attempt of a client transaction: the `position`th transaction the run `incarnation`
/// began, and the global id participants know it by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub gtid: GlobalTxId,
    pub incarnation: Incarnation,
    pub position: u64,
}

impl Attempt {
    pub fn new(coordinator_id: &CoordinatorId, incarnation: Incarnation, position: u64) -> Self {
        Attempt {
            gtid: GlobalTxId::compose(coordinator_id, incarnation, position),
            incarnation,
            position,
        }
    }
}

/// How far the log holds one run: every attempt that run began up to `reach` (its positions
/// are given out in log order, so holding one means holding every earlier one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpan {
    pub incarnation: Incarnation,
    pub epoch: Epoch,
    pub reach: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeginRecord {
    pub txid: TxId,
    pub attempt: Attempt,
    pub digest: Digest,
    pub participants: Vec<ParticipantName>,
    pub created_at_ms: u64,
    /// The submitting client's name from its token; absent when authentication is off (and in
    /// logs written before names were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub txid: TxId,
    pub attempt: Attempt,
    pub digest: Digest,
    pub decision: Decision,
    pub reason: Option<String>,
    /// Every participant with the vote that counted for it, in request order.
    pub votes: Vec<(ParticipantName, VoteKind)>,
    pub created_at_ms: u64,
    pub decided_at_ms: u64,
    /// Copied from the attempt's begin record, so the name outlives the live transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckRecord {
    pub txid: TxId,
    pub participant: ParticipantName,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndRecord {
    pub txid: TxId,
    pub ended_at_ms: u64,
}

/// A decided transaction whose acknowledgements are not all in, as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveDecided {
    pub decision: DecisionRecord,
    pub acked: Vec<ParticipantName>,
}

/// An ended transaction kept for the retention window so that client retries get the same
/// answer (idempotency) and participants get the real outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retained {
    pub decision: DecisionRecord,
    pub ended_at_ms: u64,
}
