//! The client API of the coordinator (design 3.1): the transaction request and its shape
//! checks, the response, and the status an operator reads.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;
use crate::ids::{GlobalTxId, ParticipantName, TxId};
use crate::limits::{PARTICIPANTS_MAX, PAYLOAD_BYTES_MAX, TIMEOUT_MS_MAX, TIMEOUT_MS_MIN};
use crate::messages::VoteKind;

/// `POST /v1/transactions`, as received. Ids and names are plain strings here so that
/// `validate` can answer each problem with its own error code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransactionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub participants: Vec<ParticipantRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// One participant's part of a transaction request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParticipantRequest {
    pub name: String,
    pub payload: serde_json::Value,
}

/// A request whose shape passed every check of the contract. Whether the participants are
/// registered is the coordinator's to check.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub id: Option<TxId>,
    pub participants: Vec<(ParticipantName, serde_json::Value)>,
    pub timeout_ms: Option<u64>,
}

/// A request that breaks the contract, with the error code to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub code: ErrorCode,
    pub message: String,
}

impl RequestError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl TransactionRequest {
    /// Checks every limit of the contract, first failure first.
    pub fn validate(self) -> Result<ValidRequest, RequestError> {
        let id = match self.id {
            None => None,
            Some(raw) => Some(
                TxId::new(raw)
                    .map_err(|e| RequestError::new(ErrorCode::InvalidId, e.to_string()))?,
            ),
        };
        if self.participants.is_empty() {
            return Err(RequestError::new(
                ErrorCode::NoParticipants,
                "a transaction needs at least one participant",
            ));
        }
        if self.participants.len() > PARTICIPANTS_MAX {
            return Err(RequestError::new(
                ErrorCode::TooManyParticipants,
                format!(
                    "{} participants given; the limit is {PARTICIPANTS_MAX}",
                    self.participants.len()
                ),
            ));
        }
        if let Some(timeout_ms) = self.timeout_ms
            && !(TIMEOUT_MS_MIN..=TIMEOUT_MS_MAX).contains(&timeout_ms)
        {
            return Err(RequestError::new(
                ErrorCode::InvalidTimeout,
                format!(
                    "timeout_ms is {timeout_ms}; it must be between {TIMEOUT_MS_MIN} and {TIMEOUT_MS_MAX}"
                ),
            ));
        }
        let mut seen = HashSet::new();
        let mut participants = Vec::with_capacity(self.participants.len());
        for part in self.participants {
            let name = ParticipantName::new(part.name)
                .map_err(|e| RequestError::new(ErrorCode::InvalidId, e.to_string()))?;
            if !seen.insert(name.clone()) {
                return Err(RequestError::new(
                    ErrorCode::DuplicateParticipant,
                    format!("participant \"{name}\" is listed twice"),
                ));
            }
            let size = payload_size(&part.payload);
            if size > PAYLOAD_BYTES_MAX {
                return Err(RequestError::new(
                    ErrorCode::PayloadTooLarge,
                    format!(
                        "payload for \"{name}\" is {size} bytes; the limit is {PAYLOAD_BYTES_MAX}"
                    ),
                ));
            }
            participants.push((name, part.payload));
        }
        Ok(ValidRequest {
            id,
            participants,
            timeout_ms: self.timeout_ms,
        })
    }
}

/// The size of a payload as it is sent and logged: its compact JSON encoding.
pub fn payload_size(payload: &serde_json::Value) -> usize {
    serde_json::to_vec(payload).map_or(usize::MAX, |bytes| bytes.len())
}

/// The outcome of a decided transaction, as the client hears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Committed,
    Aborted,
}

/// The answer to `POST /v1/transactions`, given once the outcome is durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionResponse {
    pub id: TxId,
    /// The attempt that produced this outcome, as participants know it.
    pub gtid: GlobalTxId,
    pub outcome: Outcome,
    /// Why it aborted (`null` when committed).
    pub reason: Option<String>,
    pub participants: Vec<ParticipantResult>,
}

/// One participant's vote and whether it has acknowledged the decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParticipantResult {
    pub name: ParticipantName,
    pub vote: VoteKind,
    pub acked: bool,
}

/// Where a transaction is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransactionState {
    /// Phase one: prepares sent, votes coming in.
    Preparing,
    /// Commit decided and durable; waiting for acknowledgements.
    Committing,
    /// Abort decided; waiting for acknowledgements.
    Aborting,
    /// Commit decided and acknowledged by every participant.
    Committed,
    /// Abort decided and acknowledged by every participant.
    Aborted,
}

impl TransactionState {
    pub fn as_str(self) -> &'static str {
        match self {
            TransactionState::Preparing => "preparing",
            TransactionState::Committing => "committing",
            TransactionState::Aborting => "aborting",
            TransactionState::Committed => "committed",
            TransactionState::Aborted => "aborted",
        }
    }
}

impl std::str::FromStr for TransactionState {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "preparing" => Ok(TransactionState::Preparing),
            "committing" => Ok(TransactionState::Committing),
            "aborting" => Ok(TransactionState::Aborting),
            "committed" => Ok(TransactionState::Committed),
            "aborted" => Ok(TransactionState::Aborted),
            other => Err(format!(
                "unknown state {other:?}; expected preparing, committing, aborting, committed or aborted"
            )),
        }
    }
}

/// `GET /v1/transactions/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionStatus {
    pub id: TxId,
    /// The attempt's global id: what participants key it by and report in `/v1/prepared`.
    pub gtid: GlobalTxId,
    pub state: TransactionState,
    /// Set once decided.
    pub outcome: Option<Outcome>,
    pub reason: Option<String>,
    pub participants: Vec<ParticipantStatus>,
    /// Unix milliseconds.
    pub created_at_ms: u64,
    pub decided_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    /// The name of the client whose token submitted it (absent when authentication is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// One participant's part of a transaction's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParticipantStatus {
    pub name: ParticipantName,
    /// `null` while the vote is outstanding.
    pub vote: Option<VoteKind>,
    pub acked: bool,
    /// Phase-two deliveries tried so far.
    pub attempts: u32,
    pub last_error: Option<String>,
}

/// `GET /v1/transactions?state=...&limit=...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionList {
    pub transactions: Vec<TransactionStatus>,
    /// Pass as `after=` for the next page of ended transactions; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(value: serde_json::Value) -> TransactionRequest {
        serde_json::from_value(value).unwrap()
    }

    fn two() -> serde_json::Value {
        json!([{"name": "inventory", "payload": {"ops": []}},
               {"name": "payments", "payload": {"ops": []}}])
    }

    #[test]
    fn valid_request_passes() {
        let valid = request(json!({"id": "order-42", "participants": two(), "timeout_ms": 5000}))
            .validate()
            .unwrap();
        assert_eq!(valid.id, Some(TxId::new("order-42").unwrap()));
        assert_eq!(valid.participants.len(), 2);
        assert_eq!(valid.timeout_ms, Some(5000));
    }

    #[test]
    fn each_shape_error_has_its_code() {
        let many: Vec<_> = (0..=PARTICIPANTS_MAX)
            .map(|i| json!({"name": format!("p{i}"), "payload": {}}))
            .collect();
        let big = json!({"blob": "x".repeat(PAYLOAD_BYTES_MAX)});
        let cases = [
            (
                json!({"id": "a/b", "participants": two()}),
                ErrorCode::InvalidId,
            ),
            (
                json!({"id": "x".repeat(200), "participants": two()}),
                ErrorCode::InvalidId,
            ),
            (json!({"participants": []}), ErrorCode::NoParticipants),
            (
                json!({"participants": many}),
                ErrorCode::TooManyParticipants,
            ),
            (
                json!({"participants": two(), "timeout_ms": 0}),
                ErrorCode::InvalidTimeout,
            ),
            (
                json!({"participants": two(), "timeout_ms": TIMEOUT_MS_MAX + 1}),
                ErrorCode::InvalidTimeout,
            ),
            (
                json!({"participants": [{"name": "a", "payload": 1}, {"name": "a", "payload": 2}]}),
                ErrorCode::DuplicateParticipant,
            ),
            (
                json!({"participants": [{"name": "a b", "payload": 1}]}),
                ErrorCode::InvalidId,
            ),
            (
                json!({"participants": [{"name": "a", "payload": big}]}),
                ErrorCode::PayloadTooLarge,
            ),
        ];
        for (body, code) in cases {
            let err = request(body.clone()).validate().unwrap_err();
            assert_eq!(err.code, code, "{body}: {err}");
            assert!(!err.message.is_empty());
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let body = json!({"participants": two(), "url": "http://evil"});
        assert!(serde_json::from_value::<TransactionRequest>(body).is_err());
    }

    #[test]
    fn response_round_trips_in_contract_shape() {
        let response = TransactionResponse {
            id: TxId::new("order-42").unwrap(),
            gtid: GlobalTxId::new("c-1:00000000000000aa:3").unwrap(),
            outcome: Outcome::Committed,
            reason: None,
            participants: vec![ParticipantResult {
                name: ParticipantName::new("inventory").unwrap(),
                vote: VoteKind::Yes,
                acked: false,
            }],
        };
        let value = serde_json::to_value(&response).unwrap();
        assert_eq!(
            value,
            json!({"id": "order-42", "gtid": "c-1:00000000000000aa:3",
                   "outcome": "committed", "reason": null,
                   "participants": [{"name": "inventory", "vote": "yes", "acked": false}]})
        );
        assert_eq!(
            serde_json::from_value::<TransactionResponse>(value).unwrap(),
            response
        );
    }

    #[test]
    fn states_parse_from_their_names() {
        for state in [
            TransactionState::Preparing,
            TransactionState::Committing,
            TransactionState::Aborting,
            TransactionState::Committed,
            TransactionState::Aborted,
        ] {
            assert_eq!(state.as_str().parse::<TransactionState>(), Ok(state));
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{}\"", state.as_str())
            );
        }
        assert!("stuck".parse::<TransactionState>().is_err());
    }
}
