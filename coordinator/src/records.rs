//! What the coordinator writes to its log, and the checkpoint snapshot.
//!
//! Each record is one WAL record whose type byte says which kind it is and whose payload is
//! compact JSON (so `twopc wal dump` shows it readably). Decoding checks the type byte against
//! the payload; anything that does not decode is corruption of meaning, reported as such.

use serde::{Deserialize, Serialize};

use protocol::{CoordinatorId, Decision, Epoch, ParticipantName, TxId, VoteKind};

use crate::digest::Digest;

/// WAL record types owned by the coordinator (1..=127 per the WAL contract).
pub mod record_type {
    pub const EPOCH: u8 = 1;
    pub const BEGIN: u8 = 2;
    pub const DECISION: u8 = 3;
    pub const ACK: u8 = 4;
    pub const END: u8 = 5;
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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeginRecord {
    pub txid: TxId,
    pub digest: Digest,
    pub participants: Vec<ParticipantName>,
    pub created_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub txid: TxId,
    pub digest: Digest,
    pub decision: Decision,
    pub reason: Option<String>,
    /// Every participant with the vote that counted for it, in request order.
    pub votes: Vec<(ParticipantName, VoteKind)>,
    pub created_at_ms: u64,
    pub decided_at_ms: u64,
    /// A presumed abort made durable: a participant asked about an id this coordinator had no
    /// record of (its `Begin` was lost in a crash). No participants, no digest: whatever body a
    /// client later sends with this id gets this aborted outcome, never a fresh attempt.
    #[serde(default, skip_serializing_if = "is_false")]
    pub presumed: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
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

/// The checkpoint: everything recovery needs, so older segments can go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub identity: EpochRecord,
    /// Begun, not decided: recovery aborts them.
    pub begun: Vec<BeginRecord>,
    pub decided: Vec<LiveDecided>,
    pub retained: Vec<Retained>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ParticipantName {
        ParticipantName::new(s).unwrap()
    }

    #[test]
    fn every_record_round_trips_with_its_type() {
        let txid = TxId::new("t-1").unwrap();
        let decision = DecisionRecord {
            txid: txid.clone(),
            digest: Digest(42),
            decision: Decision::Commit,
            reason: None,
            votes: vec![(name("a"), VoteKind::Yes), (name("b"), VoteKind::Yes)],
            created_at_ms: 1,
            decided_at_ms: 2,
            presumed: false,
        };
        let records = [
            LogRecord::Epoch(EpochRecord {
                coordinator_id: CoordinatorId::new("c-1").unwrap(),
                epoch: Epoch(3),
            }),
            LogRecord::Begin(BeginRecord {
                txid: txid.clone(),
                digest: Digest(42),
                participants: vec![name("a"), name("b")],
                created_at_ms: 1,
            }),
            LogRecord::Decision(decision.clone()),
            LogRecord::Ack(AckRecord {
                txid: txid.clone(),
                participant: name("a"),
            }),
            LogRecord::End(EndRecord {
                txid,
                ended_at_ms: 9,
            }),
        ];
        for (i, record) in records.iter().enumerate() {
            let back = LogRecord::decode(i as u64, record.record_type(), &record.encode()).unwrap();
            assert_eq!(&back, record);
        }
        let snapshot = Snapshot {
            identity: EpochRecord {
                coordinator_id: CoordinatorId::new("c-1").unwrap(),
                epoch: Epoch(3),
            },
            begun: vec![],
            decided: vec![LiveDecided {
                decision: decision.clone(),
                acked: vec![name("a")],
            }],
            retained: vec![Retained {
                decision,
                ended_at_ms: 5,
            }],
        };
        assert_eq!(Snapshot::decode(&snapshot.encode()).unwrap(), snapshot);
    }

    #[test]
    fn a_presumed_abort_round_trips_and_older_decisions_read_as_not_presumed() {
        let presumed = DecisionRecord {
            txid: TxId::new("t-lost").unwrap(),
            digest: Digest(0),
            decision: Decision::Abort,
            reason: Some("presumed abort".into()),
            votes: vec![],
            created_at_ms: 7,
            decided_at_ms: 7,
            presumed: true,
        };
        let record = LogRecord::Decision(presumed.clone());
        let back = LogRecord::decode(1, record_type::DECISION, &record.encode()).unwrap();
        assert_eq!(back, record);
        // An ordinary decision's encoding has no `presumed` field (logs written before it
        // existed read the same), and it decodes as not presumed.
        let ordinary = DecisionRecord {
            presumed: false,
            ..presumed
        };
        let bytes = LogRecord::Decision(ordinary.clone()).encode();
        assert!(!String::from_utf8_lossy(&bytes).contains("presumed\""));
        assert_eq!(
            LogRecord::decode(2, record_type::DECISION, &bytes).unwrap(),
            LogRecord::Decision(ordinary)
        );
    }

    #[test]
    fn wrong_type_or_garbage_is_an_error_not_a_guess() {
        let ack = LogRecord::Ack(AckRecord {
            txid: TxId::new("t").unwrap(),
            participant: name("a"),
        });
        assert!(matches!(
            LogRecord::decode(7, record_type::DECISION, &ack.encode()),
            Err(DecodeError::BadPayload { seq: 7, .. })
        ));
        assert!(matches!(
            LogRecord::decode(8, 99, b"{}"),
            Err(DecodeError::UnknownType {
                seq: 8,
                record_type: 99
            })
        ));
        assert!(Snapshot::decode(b"not json").is_err());
    }
}
