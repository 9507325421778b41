//! The participant's log records and their encoding (JSON inside a WAL record).
//!
//! Every record carries the coordinator id and epoch of the message that caused it, so that
//! replaying the log also restores the highest epoch seen per coordinator.

use protocol::{CoordinatorId, Epoch, GlobalTxId, Incarnation, TxId};
use serde::{Deserialize, Serialize};
use wal::RecordType;

/// One log record. Attempts are keyed by their global id (`gtid`); `coordinator_id`, `epoch`
/// and `incarnation` are those of the message that caused the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    /// The prepared state behind a yes vote; forced before the vote leaves. `position` is
    /// where the attempt stands in its coordinator run (`incarnation`), for decision queries.
    Prepared {
        gtid: GlobalTxId,
        txid: TxId,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        incarnation: Incarnation,
        position: u64,
        payload: serde_json::Value,
        prepared_at_ms: u64,
        /// Its place in the lock-wait order; absent in records written before lock waits
        /// (replay then uses `prepared_at_ms`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started_at_ms: Option<u64>,
        /// Every participant the attempt named, as its prepare said; what this participant
        /// vouches for when an operator resolves an attempt the coordinator's log lost.
        /// Absent from older records and from prepares of coordinators that do not send it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        participants: Option<Vec<protocol::ParticipantName>>,
    },
    /// The commit decision; forced before the ack.
    Committed {
        gtid: GlobalTxId,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        incarnation: Incarnation,
        at_ms: u64,
    },
    /// The abort decision, or a tombstone when the abort came before (or without) a prepare;
    /// forced before the ack.
    Aborted {
        gtid: GlobalTxId,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        incarnation: Incarnation,
        at_ms: u64,
    },
    /// A no vote, so a duplicate prepare answers the same. Lazy: losing it is harmless (the
    /// prepare is evaluated again).
    Refused {
        gtid: GlobalTxId,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        incarnation: Incarnation,
        reason: String,
        at_ms: u64,
    },
    /// A raised epoch with no other record to carry it; also serves as a durability barrier for
    /// answers given from state whose own record may still be in flight.
    Fence {
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        incarnation: Incarnation,
    },
    /// A saga action or compensation through the barrier (issue 13; type 10): the guard and,
    /// when `answer` is `done`, the effect (`payload`, applied again on replay). Forced before
    /// the answer leaves.
    SagaOp {
        saga_id: TxId,
        step: String,
        op_id: String,
        kind: protocol::saga::OpKind,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        answer: crate::saga_barrier::BarrierAnswer,
        payload: serde_json::Value,
        at_ms: u64,
    },
    /// A fenced write outside 2PC (type 20): the token check's result (the resource's highest
    /// token becomes at least `token`), the value (`payload`, applied at replay) and the op's
    /// answer (`receipt`), in one record forced before the answer.
    ///
    /// The same record carries an unfenced write (`unfenced`: `resource` and `token` are then
    /// empty and 0, only its op id guards it) and the write's `next` intents with the seqs they
    /// got (the outbox, issue 29): the state change and its intents are one fact. Both fields
    /// are absent from older records, which replay as fenced writes without intents.
    FencedWrite {
        op_id: String,
        resource: String,
        token: u64,
        payload: serde_json::Value,
        receipt: serde_json::Value,
        at_ms: u64,
        #[serde(default, skip_serializing_if = "is_false")]
        unfenced: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        next: Vec<crate::outbox::RecordedIntent>,
    },
    /// A barrier (type 21) before an answer that rests on earlier records (a fenced write's
    /// repeated op id or stale-token refusal; a repeated saga op or a saga op's status):
    /// forced, so the answer leaves only once they are durable. Replay ignores it.
    FencedRepeat { op_id: String },
    /// A fenced write refused `stale_token` (type 23): forced before the answer (it is the
    /// barrier that makes the writes behind the refusal durable first), so the refusal
    /// outlives a crash even if an operator's reset later lowers the highest token: a write
    /// told stale is never applied afterwards by a retry or a late copy.
    FencedStale {
        op_id: String,
        refusal: crate::fence::StaleToken,
        digest: protocol::digest::Digest,
        at_ms: u64,
    },
    /// An operator's reset of a fenced resource's highest token (type 22): who, why, from
    /// what to what. Forced before the answer; replay lowers the highest token again.
    FenceReset(crate::fence::FenceReset),
    /// A change to one outbox intent (type 24): a relay's delivered or attempt report, or an
    /// operator's retry or mark (who and why in it). Forced before the answer; replay applies
    /// it again.
    Intent {
        event_id: String,
        change: crate::outbox::IntentChange,
        at_ms: u64,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The highest epoch seen from one coordinator id, and the run that claimed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub epoch: Epoch,
    pub incarnation: Incarnation,
}

/// Why a log record could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("record {seq}: type {record_type} is not a participant record")]
    UnknownType { seq: u64, record_type: u8 },
    #[error("record {seq}: undecodable participant record: {source}")]
    Json {
        seq: u64,
        #[source]
        source: serde_json::Error,
    },
    #[error("record {seq}: type {record_type} does not match its body ({body})")]
    TypeMismatch {
        seq: u64,
        record_type: u8,
        body: &'static str,
    },
}

impl Record {
    /// The WAL record type of this variant (owners use 1..=127).
    pub fn record_type(&self) -> RecordType {
        RecordType(match self {
            Record::Prepared { .. } => 1,
            Record::Committed { .. } => 2,
            Record::Aborted { .. } => 3,
            Record::Refused { .. } => 4,
            Record::Fence { .. } => 5,
            Record::SagaOp { .. } => 10,
            Record::FencedWrite { .. } => 20,
            Record::FencedRepeat { .. } => 21,
            Record::FenceReset(_) => 22,
            Record::FencedStale { .. } => 23,
            Record::Intent { .. } => 24,
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Record::Prepared { .. } => "prepared",
            Record::Committed { .. } => "committed",
            Record::Aborted { .. } => "aborted",
            Record::Refused { .. } => "refused",
            Record::Fence { .. } => "fence",
            Record::SagaOp { .. } => "saga_op",
            Record::FencedWrite { .. } => "fenced_write",
            Record::FencedRepeat { .. } => "fenced_repeat",
            Record::FenceReset(_) => "fence_reset",
            Record::FencedStale { .. } => "fenced_stale",
            Record::Intent { .. } => "intent",
        }
    }

    /// The coordinator and the fence (epoch, incarnation) this record carries; none for saga
    /// ops (their messages carry no incarnation, and op ids make them idempotent instead) and
    /// none for a fenced write, which no coordinator sent.
    pub fn fence(&self) -> Option<(&CoordinatorId, Fence)> {
        let (coordinator_id, epoch, incarnation) = match self {
            Record::SagaOp { .. } => return None,
            Record::Prepared {
                coordinator_id,
                epoch,
                incarnation,
                ..
            }
            | Record::Committed {
                coordinator_id,
                epoch,
                incarnation,
                ..
            }
            | Record::Aborted {
                coordinator_id,
                epoch,
                incarnation,
                ..
            }
            | Record::Refused {
                coordinator_id,
                epoch,
                incarnation,
                ..
            }
            | Record::Fence {
                coordinator_id,
                epoch,
                incarnation,
            } => (coordinator_id, epoch, incarnation),
            Record::FencedWrite { .. }
            | Record::FencedRepeat { .. }
            | Record::FenceReset(_)
            | Record::FencedStale { .. }
            | Record::Intent { .. } => return None,
        };
        Some((
            coordinator_id,
            Fence {
                epoch: *epoch,
                incarnation: *incarnation,
            },
        ))
    }

    /// The WAL payload.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing these types cannot fail: every field is a string, number or JSON value.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a WAL record, checking that its type matches its body.
    pub fn decode(
        seq: u64,
        record_type: RecordType,
        payload: &[u8],
    ) -> Result<Record, DecodeError> {
        if !(1..=5).contains(&record_type.0)
            && record_type.0 != 10
            && !(20..=24).contains(&record_type.0)
        {
            return Err(DecodeError::UnknownType {
                seq,
                record_type: record_type.0,
            });
        }
        let record: Record =
            serde_json::from_slice(payload).map_err(|source| DecodeError::Json { seq, source })?;
        if record.record_type().0 != record_type.0 {
            return Err(DecodeError::TypeMismatch {
                seq,
                record_type: record_type.0,
                body: record.name(),
            });
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_type_is_checked() {
        let record = Record::Committed {
            gtid: GlobalTxId::new("c:0000000000000001:1").unwrap(),
            coordinator_id: CoordinatorId::new("c").unwrap(),
            epoch: Epoch(2),
            incarnation: Incarnation(1),
            at_ms: 5,
        };
        let bytes = record.encode();
        assert_eq!(
            Record::decode(1, record.record_type(), &bytes).unwrap(),
            record
        );
        assert!(matches!(
            Record::decode(1, RecordType(3), &bytes),
            Err(DecodeError::TypeMismatch { .. })
        ));
        assert!(matches!(
            Record::decode(1, RecordType(9), &bytes),
            Err(DecodeError::UnknownType { .. })
        ));
        // Every fence record decodes under its own type (type 22 and 23 were refused as "not
        // a participant record" when they were added, and only a restart showed it).
        let fence_records = [
            Record::FenceReset(crate::fence::FenceReset {
                resource: "r".into(),
                from: 9,
                to: 1,
                operator: "alice".into(),
                reason: "typo".into(),
                at_ms: 3,
            }),
            Record::FencedStale {
                op_id: "w-1".into(),
                refusal: crate::fence::StaleToken {
                    resource: "r".into(),
                    token: 1,
                    highest: 9,
                },
                digest: protocol::digest::Digest(7),
                at_ms: 4,
            },
            Record::FencedRepeat {
                op_id: "w-1".into(),
            },
            Record::Intent {
                event_id: "e-1".into(),
                change: crate::outbox::IntentChange::Attempt {
                    error: "timeout".into(),
                    permanent: false,
                },
                at_ms: 5,
            },
        ];
        for record in fence_records {
            let bytes = record.encode();
            assert_eq!(
                Record::decode(1, record.record_type(), &bytes).unwrap(),
                record
            );
        }
        // A fenced write logged before the outbox replays as a fenced write without intents.
        let old = br#"{"type":"fenced_write","op_id":"w","resource":"r","token":3,"payload":{},"receipt":null,"at_ms":1}"#;
        assert!(matches!(
            Record::decode(1, RecordType(20), old),
            Ok(Record::FencedWrite { unfenced: false, ref next, .. }) if next.is_empty()
        ));
        // A record written before attempts had global ids is refused by name, never guessed.
        let old = br#"{"type":"committed","txid":"t1","coordinator_id":"c","epoch":2,"at_ms":5}"#;
        assert!(matches!(
            Record::decode(1, RecordType(2), old),
            Err(DecodeError::Json { .. })
        ));
    }
}
