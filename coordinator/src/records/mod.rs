//! What the coordinator writes to its log, and the checkpoint snapshot.
//!
//! Each record is one WAL record whose type byte says which kind it is and whose payload is
//! compact JSON (so `twopc wal dump` shows it readably). Decoding checks the type byte against
//! the payload; anything that does not decode is corruption of meaning, reported as such.
//!
//! The map: `transaction` holds the two-phase-commit records (and what the checkpoint keeps
//! of live and ended transactions), `saga` the saga records (and the checkpoint's copy of a
//! saga); this module holds the envelope (`LogRecord` and its type bytes) and the checkpoint
//! (`Snapshot`). Nothing here imports an engine: the engines stand on these types.

mod saga;
mod transaction;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use protocol::operator::{AuditEntry, HandResolution};
use protocol::{Decision, GlobalTxId, TxId};

use crate::leases::{LeaseRecord, LeaseSnapshot};

pub use saga::{
    SagaBeginRecord, SagaEndRecord, SagaIdRecord, SagaOpOutcome, SagaRecord, SagaSnapshot,
    SagaStepOutcome, SagaStepStarted, StepProgress,
};
pub use transaction::{
    AckRecord, Attempt, BeginRecord, BehindRecord, DecisionRecord, EndRecord, EpochRecord,
    LiveDecided, Retained, RunSpan,
};

/// WAL record types owned by the coordinator (1..=127 per the WAL contract).
pub mod record_type {
    pub const EPOCH: u8 = 1;
    pub const BEGIN: u8 = 2;
    pub const DECISION: u8 = 3;
    pub const ACK: u8 = 4;
    pub const END: u8 = 5;
    pub const BEHIND: u8 = 6;
    /// 30..=39: operator actions.
    pub const AUDIT: u8 = 30;
    // Sagas (issue 13): 10..=19.
    pub const SAGA_BEGIN: u8 = 10;
    pub const SAGA_STEP_STARTED: u8 = 11;
    pub const SAGA_STEP_OUTCOME: u8 = 12;
    pub const SAGA_TIMED_OUT: u8 = 13;
    pub const SAGA_END: u8 = 14;
    /// 20-29: leases (`crate::leases::LeaseRecord`: 20 granted, 21 renewed, 22 released).
    pub const LEASES: std::ops::RangeInclusive<u8> = 20..=29;
}

/// One logged fact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LogRecord {
    /// Who this coordinator is and which incarnation is running; forced before anything is sent.
    Epoch(EpochRecord),
    /// A transaction was accepted (lazy): lets recovery abort it at once instead of waiting for
    /// participants to ask.
    Begin(BeginRecord),
    /// The outcome (forced before the client or any participant hears it).
    Decision(DecisionRecord),
    /// One participant acknowledged the decision (lazy).
    Ack(AckRecord),
    /// Every participant acknowledged (lazy); the transaction becomes a retained outcome.
    End(EndRecord),
    /// Participants proved this log is behind what they saw (forced, not awaited): new work
    /// stays refused across restarts, when a higher epoch would hide the evidence.
    Behind(BehindRecord),
    /// An operator action (forced before it is answered or takes effect): who, when, why,
    /// what was known. A resolution is answered to participants in doubt from then on.
    Audit(AuditEntry),
    /// A saga's progress (record types 10..=19; all forced before they are acted on).
    Saga(SagaRecord),
    /// A lease granted, renewed or released (forced before it is answered; docs/leases.md).
    Lease(LeaseRecord),
}

/// One attempt an operator resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedAttempt {
    pub gtid: GlobalTxId,
    pub txid: TxId,
    pub decision: Decision,
    pub audit_seq: u64,
    pub at_ms: u64,
    pub operator: String,
    pub reason: String,
}

/// The checkpoint: everything recovery needs, so older segments can go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub identity: EpochRecord,
    /// Every run this log has held, with how far it holds each (presumed abort is answered
    /// only inside these spans).
    pub runs: Vec<RunSpan>,
    /// Begun, not decided: recovery aborts them.
    pub begun: Vec<BeginRecord>,
    pub decided: Vec<LiveDecided>,
    /// Set once participants proved this log is behind (see `LogRecord::Behind`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind: Option<BehindRecord>,
    /// Ended outcomes still staged (not yet durable in the outcome index).
    pub retained: Vec<Retained>,
    /// Every attempt an operator resolved (answered to participants for ever).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved: Vec<ResolvedAttempt>,
    /// The newest operator actions (`AUDIT_KEPT`), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<AuditEntry>,
    /// The sequence number after the last operator action.
    #[serde(default)]
    pub audit_next_seq: u64,
    /// `needs_attention` sagas an operator settled by hand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hand_resolved_sagas: Vec<(TxId, HandResolution)>,
    /// Every saga the log holds, live and ended (issue 13).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sagas: Vec<SagaSnapshot>,
    /// The lease service's state (absent in checkpoints written before leases).
    #[serde(default, skip_serializing_if = "LeaseSnapshot::is_empty")]
    pub leases: LeaseSnapshot,
}

/// A record or snapshot whose bytes passed the WAL's CRC but do not mean anything to us.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("record {seq}: unknown coordinator record type {record_type}")]
    UnknownType { seq: u64, record_type: u8 },
    #[error("record {seq} (type {record_type}): payload does not decode: {source}")]
    BadPayload {
        seq: u64,
        record_type: u8,
        source: serde_json::Error,
    },
    #[error("checkpoint snapshot does not decode: {0}")]
    BadSnapshot(serde_json::Error),
}

impl LogRecord {
    pub fn record_type(&self) -> u8 {
        match self {
            LogRecord::Epoch(_) => record_type::EPOCH,
            LogRecord::Begin(_) => record_type::BEGIN,
            LogRecord::Decision(_) => record_type::DECISION,
            LogRecord::Ack(_) => record_type::ACK,
            LogRecord::End(_) => record_type::END,
            LogRecord::Behind(_) => record_type::BEHIND,
            LogRecord::Audit(_) => record_type::AUDIT,
            LogRecord::Saga(SagaRecord::Begin(_)) => record_type::SAGA_BEGIN,
            LogRecord::Saga(SagaRecord::StepStarted(_)) => record_type::SAGA_STEP_STARTED,
            LogRecord::Saga(SagaRecord::StepOutcome(_)) => record_type::SAGA_STEP_OUTCOME,
            LogRecord::Saga(SagaRecord::TimedOut(_)) => record_type::SAGA_TIMED_OUT,
            LogRecord::Saga(SagaRecord::End(_)) => record_type::SAGA_END,
            LogRecord::Lease(r) => r.record_type(),
        }
    }

    /// The payload bytes (the type goes in the WAL frame).
    pub fn encode(&self) -> Vec<u8> {
        let encoded = match self {
            LogRecord::Epoch(r) => serde_json::to_vec(r),
            LogRecord::Begin(r) => serde_json::to_vec(r),
            LogRecord::Decision(r) => serde_json::to_vec(r),
            LogRecord::Ack(r) => serde_json::to_vec(r),
            LogRecord::End(r) => serde_json::to_vec(r),
            LogRecord::Behind(r) => serde_json::to_vec(r),
            LogRecord::Audit(r) => serde_json::to_vec(r),
            LogRecord::Saga(SagaRecord::Begin(r)) => serde_json::to_vec(r),
            LogRecord::Saga(SagaRecord::StepStarted(r)) => serde_json::to_vec(r),
            LogRecord::Saga(SagaRecord::StepOutcome(r)) => serde_json::to_vec(r),
            LogRecord::Saga(SagaRecord::TimedOut(r)) => serde_json::to_vec(r),
            LogRecord::Saga(SagaRecord::End(r)) => serde_json::to_vec(r),
            LogRecord::Lease(r) => r.encode(),
        };
        // These structs hold only strings, numbers and enums: serialization cannot fail.
        encoded.unwrap_or_default()
    }

    pub fn decode(seq: u64, record_type: u8, payload: &[u8]) -> Result<LogRecord, DecodeError> {
        let bad = |source| DecodeError::BadPayload {
            seq,
            record_type,
            source,
        };
        match record_type {
            record_type::EPOCH => serde_json::from_slice(payload).map(LogRecord::Epoch),
            record_type::BEGIN => serde_json::from_slice(payload).map(LogRecord::Begin),
            record_type::DECISION => serde_json::from_slice(payload).map(LogRecord::Decision),
            record_type::ACK => serde_json::from_slice(payload).map(LogRecord::Ack),
            record_type::END => serde_json::from_slice(payload).map(LogRecord::End),
            record_type::BEHIND => serde_json::from_slice(payload).map(LogRecord::Behind),
            record_type::AUDIT => serde_json::from_slice(payload).map(LogRecord::Audit),
            record_type::SAGA_BEGIN => {
                serde_json::from_slice(payload).map(|r| LogRecord::Saga(SagaRecord::Begin(r)))
            }
            record_type::SAGA_STEP_STARTED => {
                serde_json::from_slice(payload).map(|r| LogRecord::Saga(SagaRecord::StepStarted(r)))
            }
            record_type::SAGA_STEP_OUTCOME => {
                serde_json::from_slice(payload).map(|r| LogRecord::Saga(SagaRecord::StepOutcome(r)))
            }
            record_type::SAGA_TIMED_OUT => {
                serde_json::from_slice(payload).map(|r| LogRecord::Saga(SagaRecord::TimedOut(r)))
            }
            record_type::SAGA_END => {
                serde_json::from_slice(payload).map(|r| LogRecord::Saga(SagaRecord::End(r)))
            }
            other if record_type::LEASES.contains(&other) => {
                match LeaseRecord::decode(other, payload) {
                    Some(decoded) => decoded.map(LogRecord::Lease),
                    None => {
                        return Err(DecodeError::UnknownType {
                            seq,
                            record_type: other,
                        });
                    }
                }
            }
            other => {
                return Err(DecodeError::UnknownType {
                    seq,
                    record_type: other,
                });
            }
        }
        .map_err(bad)
    }
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Snapshot, DecodeError> {
        serde_json::from_slice(bytes).map_err(DecodeError::BadSnapshot)
    }
}
