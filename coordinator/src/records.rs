//! What the coordinator writes to its log, and the checkpoint snapshot.
//!
//! Each record is one WAL record whose type byte says which kind it is and whose payload is
//! compact JSON (so `twopc wal dump` shows it readably). Decoding checks the type byte against
//! the payload; anything that does not decode is corruption of meaning, reported as such.

use serde::{Deserialize, Serialize};

use protocol::{
    CoordinatorId, Decision, Epoch, GlobalTxId, Incarnation, ParticipantName, TxId, VoteKind,
};

use crate::digest::Digest;
use crate::leases::{LeaseRecord, LeaseSnapshot};
use crate::saga::facts::Fact;
use protocol::operator::AuditEntry;

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

/// What the saga engine logs. Every step's start and outcome is durable before the next
/// message is sent; replay folds them with the planner's rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SagaRecord {
    /// The saga was accepted, with its whole definition (the idempotency digest covers it).
    Begin(SagaBeginRecord),
    /// An action or compensation attempt is about to be sent (its outcome is unknown until
    /// an outcome record follows).
    StepStarted(SagaStepStarted),
    /// What an action, compensation or op query answered.
    StepOutcome(SagaStepOutcome),
    /// The saga's deadline passed: compensation starts (unless a pivot succeeded).
    TimedOut(SagaIdRecord),
    /// The saga reached a terminal state.
    End(SagaEndRecord),
}

impl SagaRecord {
    /// How long the saga had run (on the coordinator's monotonic clocks, downtime not
    /// counted) when this record was logged; a begin is at 0. Records logged before this
    /// was kept say 0 (docs/sagas.md, "Deadlines").
    pub fn elapsed_ms(&self) -> u64 {
        match self {
            SagaRecord::Begin(_) => 0,
            SagaRecord::StepStarted(r) => r.elapsed_ms,
            SagaRecord::StepOutcome(r) => r.elapsed_ms,
            SagaRecord::TimedOut(r) => r.elapsed_ms,
            SagaRecord::End(r) => r.elapsed_ms,
        }
    }

    /// Stamps the saga's elapsed time on the record (a begin carries none: it is at 0).
    pub fn set_elapsed_ms(&mut self, elapsed_ms: u64) {
        match self {
            SagaRecord::Begin(_) => {}
            SagaRecord::StepStarted(r) => r.elapsed_ms = elapsed_ms,
            SagaRecord::StepOutcome(r) => r.elapsed_ms = elapsed_ms,
            SagaRecord::TimedOut(r) => r.elapsed_ms = elapsed_ms,
            SagaRecord::End(r) => r.elapsed_ms = elapsed_ms,
        }
    }

    /// The saga the record is about.
    pub fn saga_id(&self) -> &TxId {
        match self {
            SagaRecord::Begin(r) => &r.id,
            SagaRecord::StepStarted(r) => &r.id,
            SagaRecord::StepOutcome(r) => &r.id,
            SagaRecord::TimedOut(r) => &r.id,
            SagaRecord::End(r) => &r.id,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaBeginRecord {
    pub id: TxId,
    pub digest: Digest,
    pub request: protocol::saga::SagaRequest,
    pub created_at_ms: u64,
    /// `created_at_ms + timeout_ms`, for people reading the log: the deadline itself is
    /// measured on the saga's elapsed time, never against a wall clock (docs/sagas.md).
    pub deadline_ms: u64,
    /// The submitting client's name from its token; absent with authentication off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaStepStarted {
    pub id: TxId,
    pub step: u32,
    pub kind: protocol::saga::OpKind,
    pub attempt: u32,
    /// The saga's elapsed time when this was logged (see [`SagaRecord::elapsed_ms`]).
    #[serde(default)]
    pub elapsed_ms: u64,
}

/// How one operation ended, as the engine classified the answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SagaOpOutcome {
    Done {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<serde_json::Value>,
    },
    Failed {
        reason: String,
    },
    Unknown {
        error: String,
    },
    /// An op query proved the action never applied.
    NotFound,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaStepOutcome {
    pub id: TxId,
    pub step: u32,
    pub kind: protocol::saga::OpKind,
    pub outcome: SagaOpOutcome,
    /// The saga's elapsed time when this was logged (see [`SagaRecord::elapsed_ms`]).
    #[serde(default)]
    pub elapsed_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaIdRecord {
    pub id: TxId,
    /// The saga's elapsed time when this was logged (see [`SagaRecord::elapsed_ms`]).
    #[serde(default)]
    pub elapsed_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaEndRecord {
    pub id: TxId,
    pub state: protocol::saga::SagaState,
    pub reason: Option<String>,
    pub ended_at_ms: u64,
    /// The saga's elapsed time when this was logged (see [`SagaRecord::elapsed_ms`]).
    #[serde(default)]
    pub elapsed_ms: u64,
}

/// Per-step counters and the last thing learned, for the answer (kept in the checkpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepProgress {
    pub attempts: u32,
    pub compensation_attempts: u32,
    pub last_error: Option<String>,
    pub result: Option<serde_json::Value>,
}

/// One saga as the checkpoint keeps it: what its records folded into, without what only a
/// running process has (in flight, waiters, backoff), which the saga engine adds on replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaSnapshot {
    pub begin: SagaBeginRecord,
    pub facts: Vec<Fact>,
    pub progress: Vec<StepProgress>,
    pub timed_out: bool,
    /// Successes counted so far (the planner's order numbers).
    pub successes: u32,
    pub ended: Option<SagaEndRecord>,
    /// How long the saga had run as of its last record or checkpoint (downtime not counted):
    /// where its clock resumes after a restart. 0 in checkpoints written before it was kept,
    /// so such a saga gets its whole timeout again from the restart.
    #[serde(default)]
    pub elapsed_ms: u64,
}

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
    pub hand_resolved_sagas: Vec<(TxId, protocol::operator::HandResolution)>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ParticipantName {
        ParticipantName::new(s).unwrap()
    }

    fn identity() -> EpochRecord {
        EpochRecord {
            coordinator_id: CoordinatorId::new("c-1").unwrap(),
            epoch: Epoch(3),
            incarnation: Incarnation(0xfeed),
        }
    }

    #[test]
    fn every_record_round_trips_with_its_type() {
        let txid = TxId::new("t-1").unwrap();
        let attempt = Attempt::new(&identity().coordinator_id, Incarnation(0xfeed), 7);
        let decision = DecisionRecord {
            txid: txid.clone(),
            attempt: attempt.clone(),
            digest: Digest(42),
            decision: Decision::Commit,
            reason: None,
            votes: vec![(name("a"), VoteKind::Yes), (name("b"), VoteKind::Yes)],
            created_at_ms: 1,
            decided_at_ms: 2,
            client: Some("shop".to_string()),
        };
        let records = [
            LogRecord::Epoch(identity()),
            LogRecord::Begin(BeginRecord {
                txid: txid.clone(),
                attempt,
                digest: Digest(42),
                participants: vec![name("a"), name("b")],
                created_at_ms: 1,
                client: Some("shop".to_string()),
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
            LogRecord::Behind(BehindRecord {
                evidence: "inventory: incarnation_conflict".into(),
                at_ms: 10,
            }),
            LogRecord::Audit(AuditEntry {
                seq: 1,
                at_ms: 11,
                operator: "ana".into(),
                reason: "inventory came back".into(),
                action: protocol::operator::AuditAction::RetryParticipant {
                    participant: name("a"),
                    retried: 2,
                },
            }),
        ];
        for (i, record) in records.iter().enumerate() {
            let back = LogRecord::decode(i as u64, record.record_type(), &record.encode()).unwrap();
            assert_eq!(&back, record);
        }
        let snapshot = Snapshot {
            identity: identity(),
            runs: vec![RunSpan {
                incarnation: Incarnation(0xfeed),
                epoch: Epoch(3),
                reach: 7,
            }],
            begun: vec![],
            decided: vec![LiveDecided {
                decision: decision.clone(),
                acked: vec![name("a")],
            }],
            behind: None,
            retained: vec![Retained {
                decision,
                ended_at_ms: 5,
            }],
            resolved: vec![ResolvedAttempt {
                gtid: attempt_gtid(),
                txid: TxId::new("t-0").unwrap(),
                decision: Decision::Abort,
                audit_seq: 1,
                at_ms: 4,
                operator: "ana".into(),
                reason: "restore".into(),
            }],
            audit: vec![],
            audit_next_seq: 2,
            hand_resolved_sagas: vec![],
            sagas: vec![],
            leases: LeaseSnapshot {
                last_token: 9,
                held: vec![],
            },
        };
        assert_eq!(Snapshot::decode(&snapshot.encode()).unwrap(), snapshot);
    }

    fn attempt_gtid() -> GlobalTxId {
        GlobalTxId::new("c-1:000000000000feed:3").unwrap()
    }

    #[test]
    fn an_attempt_is_logged_with_its_global_id_and_position() {
        let attempt = Attempt::new(&identity().coordinator_id, Incarnation(0xfeed), 7);
        assert_eq!(attempt.gtid.as_str(), "c-1:000000000000feed:7");
        let bytes = LogRecord::Epoch(identity()).encode();
        assert!(
            String::from_utf8_lossy(&bytes).contains("\"incarnation\":\"000000000000feed\""),
            "the run's incarnation is in its epoch record"
        );
        // A log written before attempts existed does not decode: it is refused, not guessed.
        let old = br#"{"txid":"t","digest":"0000000000000000000000000000002a","participants":[],"created_at_ms":1}"#;
        assert!(LogRecord::decode(3, record_type::BEGIN, old).is_err());
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
