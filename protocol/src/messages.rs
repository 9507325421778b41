//! The participant protocol (design 3.2): prepare, vote, decision, ack, and the decision query
//! a participant in doubt sends to the coordinator.

use serde::{Deserialize, Serialize};

use crate::ids::{CoordinatorId, Epoch, GlobalTxId, Incarnation, ParticipantName, TxId};

/// `POST {base}/2pc/prepare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareRequest {
    /// The client's id (its idempotency key at the coordinator). Shown, never used as a key:
    /// a client may reuse it once its outcome is forgotten.
    pub txid: TxId,
    /// This attempt's identity, unique and never reused: what the participant keys by.
    pub gtid: GlobalTxId,
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    /// The run of the coordinator that sends this (and that began the attempt).
    pub incarnation: Incarnation,
    /// Where the attempt stands in that run's sequence of begun transactions; a decision query
    /// names it so the coordinator can tell whether its log covers the attempt.
    pub position: u64,
    /// Opaque to the coordinator; the participant validates it.
    pub payload: serde_json::Value,
    /// When the coordinator began this attempt (its `created_at_ms`). With the gtid it orders
    /// attempts identically at every participant, so a prepare that meets a locked key waits
    /// only for older attempts (no deadlock). Absent from older coordinators: the participant
    /// then uses the prepare's arrival time. Serialized only when set, because a participant
    /// built before this field refuses unknown fields: upgrade participants first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    /// How long the participant may queue this prepare behind locks before voting no
    /// (`lock_timeout: ...`); capped by the participant's own maximum. The coordinator sets it
    /// below its prepare deadline so the no arrives before it gives up. Absent: the
    /// participant's maximum applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_wait_ms: Option<u64>,
    /// Every participant the attempt names (this one among them), so that each can vouch for
    /// the list when the coordinator's log no longer holds it (a restore): an operator's
    /// commit needs every one of them prepared, and the list must come from the attempt, not
    /// from the operator. Absent from older coordinators; serialized only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participants: Option<Vec<ParticipantName>>,
}

/// The answer to a prepare. A yes is a promise: the prepared state is durable and the
/// participant will obey whatever decision comes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "vote", rename_all = "snake_case")]
pub enum Vote {
    Yes,
    No {
        #[serde(default)]
        reason: String,
    },
}

/// A vote as the coordinator records it: a participant's answer or what stood in for it.
/// Only `Yes` counts toward commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VoteKind {
    Yes,
    No,
    /// No answer before the prepare deadline.
    Timeout,
    /// A transport error, a non-200 status or a malformed body.
    Error,
}

/// The outcome of phase one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Commit,
    Abort,
}

/// `POST {base}/2pc/commit` and `POST {base}/2pc/abort`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    pub txid: TxId,
    /// The attempt decided (as in its prepare).
    pub gtid: GlobalTxId,
    pub coordinator_id: CoordinatorId,
    /// The sender's epoch and incarnation (a recovered coordinator resends the decisions of
    /// attempts an earlier run began).
    pub epoch: Epoch,
    pub incarnation: Incarnation,
}

/// The answer to a commit or abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckResponse {
    pub ack: bool,
}

/// What the coordinator says to a participant in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionStatus {
    Commit,
    Abort,
    /// Still in phase one: ask again later.
    Pending,
    /// The coordinator's log cannot prove either outcome: the attempt was begun by a run (an
    /// incarnation) that this log does not hold, or past the point this log holds of it (a
    /// restored backup, a log rolled back). Stay prepared and ask again; an operator resolves
    /// it from the participants' evidence if it never changes.
    Unknown,
}

impl From<Decision> for DecisionStatus {
    fn from(decision: Decision) -> Self {
        match decision {
            Decision::Commit => DecisionStatus::Commit,
            Decision::Abort => DecisionStatus::Abort,
        }
    }
}

/// The query string of `GET {coordinator}/v1/transactions/{txid}/decision`: the attempt asked
/// about and what it was prepared under (all from the prepare). A query without them can only
/// be answered `unknown`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionQuery {
    pub gtid: GlobalTxId,
    pub incarnation: Incarnation,
    pub epoch: Epoch,
    pub position: u64,
}

/// `GET {coordinator}/v1/transactions/{txid}/decision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionQueryResponse {
    pub decision: DecisionStatus,
    /// The answering coordinator's epoch: a participant ignores an answer from an epoch lower
    /// than the highest it holds for that coordinator id (a stale process, or a restored copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<Incarnation>,
    /// Why the answer is `unknown` (or a presumed abort), for the participant's logs and its
    /// `/v1/prepared` listing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The answering coordinator's id. A participant obeys only an answer from the coordinator
    /// that prepared the transaction: another coordinator (one whose data directory was wiped,
    /// or a misconfigured URL) has no record of it and would presume abort, which may
    /// contradict a commit the real one decided. Optional on the wire for coordinators that
    /// predate it; twopc's coordinator always sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_id: Option<CoordinatorId>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip<T>(value: &T, expected: serde_json::Value)
    where
        T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
    {
        let encoded = serde_json::to_value(value).unwrap();
        assert_eq!(encoded, expected);
        let decoded: T = serde_json::from_value(encoded).unwrap();
        assert_eq!(&decoded, value);
    }

    #[test]
    fn prepare_round_trips() {
        let msg = PrepareRequest {
            txid: TxId::new("order-42").unwrap(),
            gtid: GlobalTxId::new("c-1a2b:000000000000000a:7").unwrap(),
            coordinator_id: CoordinatorId::new("c-1a2b").unwrap(),
            epoch: Epoch(3),
            incarnation: Incarnation(10),
            position: 7,
            payload: json!({"ops": [{"op": "put", "key": "k", "value": "v"}]}),
            started_at_ms: None,
            lock_wait_ms: None,
            participants: None,
        };
        // Without the lock-wait fields the body is what older participants accept.
        round_trip(
            &msg,
            json!({"txid": "order-42", "gtid": "c-1a2b:000000000000000a:7",
                   "coordinator_id": "c-1a2b", "epoch": 3,
                   "incarnation": "000000000000000a", "position": 7,
                   "payload": {"ops": [{"op": "put", "key": "k", "value": "v"}]}}),
        );
        let timed = PrepareRequest {
            started_at_ms: Some(1_700_000_000_000),
            lock_wait_ms: Some(1_500),
            ..msg
        };
        round_trip(
            &timed,
            json!({"txid": "order-42", "gtid": "c-1a2b:000000000000000a:7",
                   "coordinator_id": "c-1a2b", "epoch": 3,
                   "incarnation": "000000000000000a", "position": 7,
                   "payload": {"ops": [{"op": "put", "key": "k", "value": "v"}]},
                   "started_at_ms": 1_700_000_000_000u64, "lock_wait_ms": 1_500}),
        );
    }

    #[test]
    fn votes_round_trip() {
        round_trip(&Vote::Yes, json!({"vote": "yes"}));
        round_trip(
            &Vote::No {
                reason: "insufficient stock".into(),
            },
            json!({"vote": "no", "reason": "insufficient stock"}),
        );
        let no: Vote = serde_json::from_value(json!({"vote": "no"})).unwrap();
        assert_eq!(no, Vote::No { reason: "".into() });
        assert!(serde_json::from_value::<Vote>(json!({"vote": "maybe"})).is_err());
    }

    #[test]
    fn decision_messages_round_trip() {
        let msg = DecisionRequest {
            txid: TxId::new("t").unwrap(),
            gtid: GlobalTxId::new("c:0000000000000001:1").unwrap(),
            coordinator_id: CoordinatorId::new("c").unwrap(),
            epoch: Epoch(1),
            incarnation: Incarnation(1),
        };
        round_trip(
            &msg,
            json!({"txid": "t", "gtid": "c:0000000000000001:1", "coordinator_id": "c",
                   "epoch": 1, "incarnation": "0000000000000001"}),
        );
        round_trip(&AckResponse { ack: true }, json!({"ack": true}));
        round_trip(
            &DecisionQueryResponse {
                decision: DecisionStatus::Pending,
                epoch: None,
                incarnation: None,
                reason: None,
                coordinator_id: None,
            },
            json!({"decision": "pending"}),
        );
        round_trip(
            &DecisionQueryResponse {
                decision: DecisionStatus::Unknown,
                epoch: Some(Epoch(4)),
                incarnation: Some(Incarnation(2)),
                reason: Some("not in this log".into()),
                coordinator_id: Some(CoordinatorId::new("c-9").unwrap()),
            },
            json!({"decision": "unknown", "coordinator_id": "c-9", "epoch": 4,
                   "incarnation": "0000000000000002", "reason": "not in this log"}),
        );
        assert_eq!(
            DecisionStatus::from(Decision::Commit),
            DecisionStatus::Commit
        );
    }

    #[test]
    fn unknown_fields_and_bad_ids_are_rejected() {
        let extra = json!({"txid": "t", "gtid": "g", "coordinator_id": "c", "epoch": 1,
                           "incarnation": "0000000000000001", "url": "http://x"});
        assert!(serde_json::from_value::<DecisionRequest>(extra).is_err());
        let bad = json!({"txid": "a/b", "gtid": "g", "coordinator_id": "c", "epoch": 1,
                         "incarnation": "0000000000000001"});
        assert!(serde_json::from_value::<DecisionRequest>(bad).is_err());
    }
}
