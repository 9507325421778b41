//! The saga records (issue 13): a saga's begin, each step's start and outcome, its timeout
//! and its end, and the checkpoint's copy of a saga (what those records folded into).

use serde::{Deserialize, Serialize};

use protocol::TxId;

use crate::digest::Digest;
use crate::saga_facts::Fact;

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
