//! Saga wire types (issue 13): the client's `POST /v1/sagas` body and its answer, and the
//! participant's `/saga/action`, `/saga/compensate` and `/saga/ops/{op_id}` messages.
//!
//! A saga id follows the transaction id rules (it is the idempotency key); a step name follows
//! them too, without ':', so that an op id (`saga id:step:action|compensation`) names exactly
//! one step of one saga of one coordinator: saga ids are only unique within a coordinator id,
//! so a participant keeps each step's ops under (coordinator id, saga id, step), and a
//! coordinator's question about an op names who asks ([`OpQuery`]).

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::ErrorCode;
use crate::ids::{CoordinatorId, Epoch, ParticipantName, TxId};
use crate::limits::{PAYLOAD_BYTES_MAX, TXID_LEN_MAX};
use crate::transaction::RequestError;

/// Most steps in one saga: each is logged with its payloads in the saga's first record.
pub const SAGA_STEPS_MAX: usize = 32;
/// Longest saga timeout: sagas hold no locks, so they may be long, but not unbounded.
pub const SAGA_TIMEOUT_MS_MAX: u64 = 24 * 60 * 60 * 1000;
/// The saga timeout when the request gives none.
pub const SAGA_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// `POST /v1/sagas`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaRequest {
    pub id: TxId,
    pub steps: Vec<SagaStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// One step: an action at a participant and the compensation that undoes it (`null`: the step
/// cannot be undone, a pivot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaStep {
    pub name: String,
    pub participant: ParticipantName,
    pub action: serde_json::Value,
    /// Required, and may be `null`: an absent field must not silently make a step a pivot
    /// (serde would take a missing `Option` as `None`; `deserialize_with` makes it required).
    #[serde(deserialize_with = "Option::deserialize")]
    pub compensation: Option<serde_json::Value>,
}

impl SagaStep {
    pub fn compensable(&self) -> bool {
        self.compensation.is_some()
    }
}

impl SagaRequest {
    /// Checks everything but whether the participants are configured (the coordinator does).
    pub fn validate(&self) -> Result<(), RequestError> {
        let bad = |code, message: String| Err(RequestError { code, message });
        if self.steps.is_empty() {
            return bad(
                ErrorCode::NoParticipants,
                "a saga needs at least one step".into(),
            );
        }
        if self.steps.len() > SAGA_STEPS_MAX {
            return bad(
                ErrorCode::TooManyParticipants,
                format!("{} steps: at most {SAGA_STEPS_MAX}", self.steps.len()),
            );
        }
        if let Some(timeout) = self.timeout_ms
            && !(1..=SAGA_TIMEOUT_MS_MAX).contains(&timeout)
        {
            return bad(
                ErrorCode::InvalidTimeout,
                format!("timeout_ms {timeout}: expected 1..={SAGA_TIMEOUT_MS_MAX}"),
            );
        }
        for (i, step) in self.steps.iter().enumerate() {
            if let Err(e) = check_step_name(&step.name) {
                return bad(ErrorCode::InvalidId, format!("step {i}: {e}"));
            }
            if self.steps[..i].iter().any(|s| s.name == step.name) {
                return bad(
                    ErrorCode::DuplicateParticipant,
                    format!("step name {:?} appears twice", step.name),
                );
            }
            for (what, payload) in [
                ("action", Some(&step.action)),
                ("compensation", step.compensation.as_ref()),
            ] {
                let size = payload.map_or(0, |p| serde_json::to_vec(p).map_or(0, |b| b.len()));
                if size > PAYLOAD_BYTES_MAX {
                    return bad(
                        ErrorCode::PayloadTooLarge,
                        format!(
                            "step {:?}: {what} is {size} bytes, over {PAYLOAD_BYTES_MAX}",
                            step.name
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(SAGA_TIMEOUT_MS_DEFAULT)
    }
}

/// A step name: id characters without ':' (see the module doc).
pub fn check_step_name(name: &str) -> Result<(), String> {
    if name.contains(':') {
        return Err(format!("step name {name:?} contains ':'"));
    }
    TxId::new(name)
        .map(|_| ())
        .map_err(|e| format!("step name {name:?}: {e}"))?;
    if name.len() > TXID_LEN_MAX / 2 {
        return Err(format!(
            "step name {name:?} is longer than {}",
            TXID_LEN_MAX / 2
        ));
    }
    Ok(())
}

/// Which of a step's two operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Action,
    Compensation,
}

/// The stable id of one operation: the same on every retry and after every restart.
pub fn op_id(saga: &TxId, step: &str, kind: OpKind) -> String {
    let kind = match kind {
        OpKind::Action => "action",
        OpKind::Compensation => "compensation",
    };
    format!("{saga}:{step}:{kind}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SagaState {
    Running,
    Compensating,
    Completed,
    Compensated,
    NeedsAttention,
}

impl SagaState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            SagaState::Completed | SagaState::Compensated | SagaState::NeedsAttention
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SagaState::Running => "running",
            SagaState::Compensating => "compensating",
            SagaState::Completed => "completed",
            SagaState::Compensated => "compensated",
            SagaState::NeedsAttention => "needs_attention",
        }
    }

    pub const ALL: [SagaState; 5] = [
        SagaState::Running,
        SagaState::Compensating,
        SagaState::Completed,
        SagaState::Compensated,
        SagaState::NeedsAttention,
    ];

    pub fn parse(text: &str) -> Option<SagaState> {
        SagaState::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
    Compensating,
    Compensated,
    CompensationFailing,
}

/// One step in a saga's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaStepStatus {
    pub name: String,
    pub participant: ParticipantName,
    pub status: StepStatus,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub op_id: String,
    /// What the action answered with `done` (recorded), if it gave a result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

/// The answer of `POST /v1/sagas` and `GET /v1/sagas/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaResponse {
    pub id: TxId,
    pub state: SagaState,
    pub reason: Option<String>,
    pub steps: Vec<SagaStepStatus>,
    pub created_at_ms: u64,
    /// Milliseconds since the saga was accepted (until it ended, for an ended one).
    pub age_ms: u64,
    /// Set when an operator settled this `needs_attention` saga by hand (it stays listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_by_hand: Option<HandResolution>,
    /// The name on the client token that submitted the saga; absent with authentication off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// How a saga was settled by hand, as its status shows it (`POST /v1/sagas/{id}/resolve`,
/// an audited operator action).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandResolution {
    pub operator: String,
    pub reason: String,
    pub at_ms: u64,
    pub audit_seq: u64,
}

/// `GET /v1/sagas`: stuck sagas first (needs_attention, then compensating, then running, each
/// oldest first), then ended ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaList {
    pub sagas: Vec<SagaResponse>,
}

/// The body of `POST {base}/saga/action` and `POST {base}/saga/compensate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaOpRequest {
    pub saga_id: TxId,
    pub step: String,
    pub op_id: String,
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub payload: serde_json::Value,
}

/// A participant's 200 answer to an action or a compensation. Anything else is unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SagaOpAnswer {
    Done {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<serde_json::Value>,
    },
    Failed {
        reason: String,
    },
}

/// What `GET {base}/saga/ops/{op_id}` knows of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpStatus {
    Done,
    Failed,
    Compensated,
    NotFound,
}

/// The query string of `GET {base}/saga/ops/{op_id}` (both parameters optional on the wire,
/// for coordinators older than them; `routes::saga_op_query_path` writes it).
///
/// - `coordinator_id`: whose op it is. The participant answers only from that coordinator's
///   records of the step: another coordinator (or this one's data directory wiped, which makes
///   a new coordinator id) may have used the same saga id. A query without it is answered
///   `not_found` only when no coordinator's op on that step is recorded at all; otherwise it is
///   refused 422 `coordinator_id_required`, never answered from an entry that may be another
///   coordinator's (docs/participants.md, "Sagas").
/// - `payload_digest`: [`Digest::of_payload`] of the payload the asker sent under this op id.
///   When the participant recorded the op with another payload, the answer is 409
///   `op_id_conflict`: the asker's op was never applied there, and the recorded answer is not
///   its answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_id: Option<CoordinatorId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_digest: Option<Digest>,
}

impl OpQuery {
    /// A coordinator's question, with the digest of the payload it sent when it has it.
    pub fn from_coordinator(
        coordinator_id: &CoordinatorId,
        payload: Option<&serde_json::Value>,
    ) -> OpQuery {
        OpQuery {
            coordinator_id: Some(coordinator_id.clone()),
            payload_digest: payload.map(Digest::of_payload),
        }
    }
}

/// The body of `GET {base}/saga/ops/{op_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpStatusResponse {
    pub op_id: String,
    pub status: OpStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: serde_json::Value) -> SagaRequest {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_issue_example_parses_and_validates() {
        let r = request(serde_json::json!({"id":"order-7", "steps":[
            {"name":"reserve","participant":"inventory","action":{"a":1},"compensation":{"c":1}},
            {"name":"email","participant":"mailer","action":{},"compensation":null}],
            "timeout_ms":30000}));
        r.validate().unwrap();
        assert!(!r.steps[1].compensable());
        assert_eq!(
            op_id(&r.id, "email", OpKind::Action),
            "order-7:email:action"
        );
    }

    #[test]
    fn compensation_is_required_but_may_be_null() {
        let missing = serde_json::json!({"id":"s","steps":[
            {"name":"a","participant":"p","action":{}}]});
        let err = serde_json::from_value::<SagaRequest>(missing).unwrap_err();
        assert!(
            err.to_string().contains("missing field `compensation`"),
            "{err}"
        );
        let pivot = request(serde_json::json!({"id":"s","steps":[
            {"name":"a","participant":"p","action":{},"compensation":null}]}));
        assert!(!pivot.steps[0].compensable());
        let undoable = request(serde_json::json!({"id":"s","steps":[
            {"name":"a","participant":"p","action":{},"compensation":{"undo":1}}]}));
        assert!(undoable.steps[0].compensable());
    }

    #[test]
    fn bad_steps_are_named() {
        let step = |name: &str| serde_json::json!({"name":name,"participant":"p","action":{},"compensation":null});
        let e = request(serde_json::json!({"id":"s","steps":[step("a:b")]}))
            .validate()
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidId);
        let e = request(serde_json::json!({"id":"s","steps":[step("a"), step("a")]}))
            .validate()
            .unwrap_err();
        assert!(e.message.contains("twice"), "{}", e.message);
        let e = request(serde_json::json!({"id":"s","steps":[]}))
            .validate()
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NoParticipants);
        let e = request(serde_json::json!({"id":"s","steps":[step("a")],"timeout_ms":0}))
            .validate()
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidTimeout);
    }

    #[test]
    fn an_op_query_names_the_coordinator_and_the_payload_digest() {
        let coordinator = CoordinatorId::new("c-1a2b").unwrap();
        let payload = serde_json::json!({"ops": [{"op": "add", "key": "k", "delta": 1}]});
        let query = OpQuery::from_coordinator(&coordinator, Some(&payload));
        let digest = String::from(Digest::of_payload(&payload));
        assert_eq!(
            crate::routes::saga_op_query_path("s:reserve:action", &query),
            format!("/saga/ops/s:reserve:action?coordinator_id=c-1a2b&payload_digest={digest}")
        );
        let without_digest = OpQuery::from_coordinator(&coordinator, None);
        assert_eq!(
            crate::routes::saga_op_query_path("s:reserve:action", &without_digest),
            "/saga/ops/s:reserve:action?coordinator_id=c-1a2b"
        );
        assert_eq!(
            crate::routes::saga_op_query_path("s:reserve:action", &OpQuery::default()),
            "/saga/ops/s:reserve:action",
            "an older coordinator's question, as it was"
        );
    }

    #[test]
    fn answers_have_the_contract_shapes() {
        let done: SagaOpAnswer =
            serde_json::from_str(r#"{"status":"done","result":{"x":1}}"#).unwrap();
        assert!(matches!(done, SagaOpAnswer::Done { result: Some(_) }));
        let failed: SagaOpAnswer =
            serde_json::from_str(r#"{"status":"failed","reason":"no stock"}"#).unwrap();
        assert_eq!(
            failed,
            SagaOpAnswer::Failed {
                reason: "no stock".into()
            }
        );
        assert_eq!(
            serde_json::to_string(&OpStatus::NotFound).unwrap(),
            "\"not_found\""
        );
        assert_eq!(
            serde_json::to_string(&StepStatus::CompensationFailing).unwrap(),
            "\"compensation_failing\""
        );
        assert_eq!(
            SagaState::parse("needs_attention"),
            Some(SagaState::NeedsAttention)
        );
    }
}
