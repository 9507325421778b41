//! Wire types of the operator actions: the evidence about one attempt, resolving an attempt the
//! coordinator cannot decide on its own, retrying deliveries now, and the audit trail that
//! records each action.

use serde::{Deserialize, Serialize};

use crate::{Decision, ErrorCode, GlobalTxId, ParticipantName, TxId};

/// A saga's status carries its hand resolution, so the type lives with the saga's wire types
/// (which this module's views build on); it is named here too, among the operator actions.
pub use crate::saga::HandResolution;

/// What a participant holds of one attempt (`GET {base}/v1/attempts/{gtid}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Voted yes and waits for the decision, holding its locks.
    Prepared,
    Committed,
    Aborted,
    /// Voted no: nothing was staged; it can never commit here.
    Refused,
    /// It ended here, but its record was dropped by retention: committed or aborted, unknown.
    Forgotten,
    /// Never seen here: no prepare arrived (or an abort overtook it before any record).
    Unknown,
}

/// A participant's answer about one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptStatus {
    pub gtid: GlobalTxId,
    pub state: AttemptState,
    /// The client id it was prepared under, where the participant still knows it (always
    /// while prepared). An operator's resolution under another id is refused on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txid: Option<TxId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared_at_ms: Option<u64>,
    /// Every participant the attempt named, as its prepare said (absent when the prepare came
    /// from a coordinator that did not send the list, or the participant no longer holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participants: Option<Vec<ParticipantName>>,
}

/// `POST /v1/transactions/{id}/resolve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    pub decision: Decision,
    pub operator: String,
    pub reason: String,
    /// The attempt, when the id has several in doubt (otherwise found from the evidence).
    #[serde(default)]
    pub gtid: Option<GlobalTxId>,
    /// Every participant the attempt named, when the coordinator's log no longer holds it (the
    /// restore case): a commit needs each of them prepared, or one committed.
    #[serde(default)]
    pub participants: Option<Vec<ParticipantName>>,
}

/// `POST /v1/transactions/{id}/retry` and `POST /v1/participants/{name}/retry` (body optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    #[serde(default)]
    pub operator: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// The answer of a retry action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryResponse {
    /// Phase-two deliveries started now instead of at their backoff timer.
    pub retried: u64,
    pub audit_seq: u64,
}

/// One participant's part of the evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParticipantEvidence {
    pub participant: ParticipantName,
    /// `None` when the participant could not be asked (`error` says why).
    pub state: Option<AttemptState>,
    /// When it prepared the attempt (Unix ms), while it holds it prepared: its age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The client id the participant holds the attempt under, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txid: Option<TxId>,
    /// The attempt's participants as this participant's prepare named them, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participants: Option<Vec<ParticipantName>>,
}

/// Everything known about one attempt when an operator acted on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub id: TxId,
    pub gtid: GlobalTxId,
    /// What the coordinator's own log says: `commit`, `abort`, `pending` or `unknown: <why>`.
    pub coordinator: String,
    /// The participants the attempt named, when known (from the log or the request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named: Option<Vec<ParticipantName>>,
    pub participants: Vec<ParticipantEvidence>,
}

/// The answer of a resolve that was accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolveResponse {
    pub id: TxId,
    pub gtid: GlobalTxId,
    pub decision: Decision,
    pub audit_seq: u64,
    pub evidence: Evidence,
}

/// A refused operator action: the error and the evidence it was judged on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalBody {
    pub error: ErrorCode,
    pub message: String,
    pub evidence: Evidence,
}

/// What an audited action did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum AuditAction {
    Resolve {
        id: TxId,
        gtid: GlobalTxId,
        decision: Decision,
        evidence: Evidence,
    },
    RetryTransaction {
        id: TxId,
        retried: u64,
    },
    RetryParticipant {
        participant: ParticipantName,
        retried: u64,
    },
    /// A saga waiting for its backoff timer (a failing compensation, a step to ask about)
    /// tried now.
    RetrySaga {
        id: TxId,
    },
    /// A `needs_attention` saga an operator settled outside twopc; it stays listed, marked.
    ResolveSagaByHand {
        id: TxId,
    },
    /// The coordinator's "log behind" mark cleared: it takes new transactions again.
    /// `cleared`: the evidence the mark rested on.
    ClearBehind {
        cleared: String,
    },
}

/// `POST /v1/log-behind/clear`: an operator clears a mistaken (or accepted) "log behind"
/// mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearBehindRequest {
    pub operator: String,
    pub reason: String,
}

/// The answer of a clear: the evidence the mark rested on and the audit entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearBehindResponse {
    pub cleared: String,
    pub audit_seq: u64,
}

/// `POST /v1/sagas/{id}/resolve`: a `needs_attention` saga settled by hand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SagaResolveRequest {
    pub operator: String,
    pub reason: String,
}

/// One audit record (`GET /v1/audit`): who did what, when, why, and what was known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Increases by one per action, for ever (across restarts).
    pub seq: u64,
    pub at_ms: u64,
    pub operator: String,
    pub reason: String,
    #[serde(flatten)]
    pub action: AuditAction,
}

/// `GET /v1/audit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditList {
    pub audit: Vec<AuditEntry>,
}

/// Longest operator name and reason accepted, in characters (Unicode scalar values, what
/// JSON Schema's `maxLength` counts).
pub const OPERATOR_LEN_MAX: usize = 128;
pub const REASON_LEN_MAX: usize = 1024;

/// What is wrong with an operator action's `operator` and `reason` (both required, not blank,
/// bounded in characters), for a 422 `invalid_operator`; `None` when nothing is. One rule for
/// every audited action, at the coordinator and at the participants.
pub fn operator_fields_problem(operator: &str, reason: &str) -> Option<String> {
    if operator.trim().is_empty() || reason.trim().is_empty() {
        return Some(
            "\"operator\" and \"reason\" are required: the audit trail records who did this and \
             why"
            .to_string(),
        );
    }
    if operator.chars().count() > OPERATOR_LEN_MAX || reason.chars().count() > REASON_LEN_MAX {
        return Some(format!(
            "\"operator\" is at most {OPERATOR_LEN_MAX} characters and \"reason\" at most \
             {REASON_LEN_MAX}"
        ));
    }
    None
}

/// One attempt a participant holds in doubt, as the cluster view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InDoubt {
    pub txid: TxId,
    pub gtid: GlobalTxId,
    pub coordinator_id: crate::CoordinatorId,
    pub epoch: crate::Epoch,
    /// How long it has been prepared, in ms.
    pub age_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer: Option<String>,
}

/// One participant in the cluster view: what it holds in doubt, or why it could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParticipantView {
    pub name: ParticipantName,
    pub reachable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub in_doubt: Vec<InDoubt>,
}

/// `GET /v1/cluster`: everything stuck or in doubt, from the coordinator and the participants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    pub now_ms: u64,
    pub coordinator_id: crate::CoordinatorId,
    pub epoch: crate::Epoch,
    /// Why the coordinator takes no new work, if it learned its log is behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_behind: Option<String>,
    /// Live transactions, oldest first (at most `LIVE_SHOWN`); `live_total` counts them all.
    pub live: Vec<crate::TransactionStatus>,
    pub live_total: u64,
    pub participants: Vec<ParticipantView>,
    /// Sagas not ended well: needs_attention (hand-resolved last), compensating, running;
    /// at most `SAGAS_SHOWN`.
    #[serde(default)]
    pub sagas: Vec<crate::saga::SagaResponse>,
    /// Every lease held now.
    #[serde(default)]
    pub leases: Vec<crate::lease::Lease>,
    /// The newest operator actions.
    pub audit: Vec<AuditEntry>,
}

/// Sagas the cluster view lists.
pub const SAGAS_SHOWN: usize = 100;

/// Live transactions the cluster view lists (the oldest: the stuck ones).
pub const LIVE_SHOWN: usize = 200;

/// One saga step's evidence: the coordinator's status and what its participant says of the
/// step's action (`GET {base}/saga/ops/{op_id}`: done, failed, compensated, not_found).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaStepEvidence {
    pub name: String,
    pub participant: ParticipantName,
    pub op_id: String,
    pub coordinator_says: crate::saga::StepStatus,
    /// `None` when the participant could not be asked (`error` says why).
    pub participant_says: Option<crate::saga::OpStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/sagas/{id}/evidence`: the saga as the coordinator's log has it, and each step's
/// action as its participant reports it, asked now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SagaEvidence {
    pub saga: crate::saga::SagaResponse,
    pub steps: Vec<SagaStepEvidence>,
}
