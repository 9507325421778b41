//! The participant protocol (design 3.2): prepare, vote, decision, ack, and the decision query
//! a participant in doubt sends to the coordinator.

use serde::{Deserialize, Serialize};

use crate::ids::{CoordinatorId, Epoch, TxId};

/// `POST {base}/2pc/prepare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareRequest {
    pub txid: TxId,
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    /// Opaque to the coordinator; the participant validates it.
    pub payload: serde_json::Value,
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
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
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
}

impl From<Decision> for DecisionStatus {
    fn from(decision: Decision) -> Self {
        match decision {
            Decision::Commit => DecisionStatus::Commit,
            Decision::Abort => DecisionStatus::Abort,
        }
    }
}

/// `GET {coordinator}/v1/transactions/{txid}/decision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionQueryResponse {
    pub decision: DecisionStatus,
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
            coordinator_id: CoordinatorId::new("c-1a2b").unwrap(),
            epoch: Epoch(3),
            payload: json!({"ops": [{"op": "put", "key": "k", "value": "v"}]}),
        };
        round_trip(
            &msg,
            json!({"txid": "order-42", "coordinator_id": "c-1a2b", "epoch": 3,
                   "payload": {"ops": [{"op": "put", "key": "k", "value": "v"}]}}),
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
            coordinator_id: CoordinatorId::new("c").unwrap(),
            epoch: Epoch(1),
        };
        round_trip(
            &msg,
            json!({"txid": "t", "coordinator_id": "c", "epoch": 1}),
        );
        round_trip(&AckResponse { ack: true }, json!({"ack": true}));
        round_trip(
            &DecisionQueryResponse {
                decision: DecisionStatus::Pending,
                coordinator_id: None,
            },
            json!({"decision": "pending"}),
        );
        round_trip(
            &DecisionQueryResponse {
                decision: DecisionStatus::Commit,
                coordinator_id: Some(CoordinatorId::new("c-9").unwrap()),
            },
            json!({"decision": "commit", "coordinator_id": "c-9"}),
        );
        assert_eq!(
            DecisionStatus::from(Decision::Commit),
            DecisionStatus::Commit
        );
    }

    #[test]
    fn unknown_fields_and_bad_ids_are_rejected() {
        let extra = json!({"txid": "t", "coordinator_id": "c", "epoch": 1, "url": "http://x"});
        assert!(serde_json::from_value::<DecisionRequest>(extra).is_err());
        let bad = json!({"txid": "a/b", "coordinator_id": "c", "epoch": 1});
        assert!(serde_json::from_value::<DecisionRequest>(bad).is_err());
    }
}
