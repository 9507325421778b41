//! What goes into the saga engine and what comes out: its tunables, the events the shell
//! feeds it (with the time and the answers), and the commands and replies it returns.

use protocol::TxId;
use protocol::saga::{OpKind, SagaRequest, SagaResponse};

use crate::digest::Digest;
use crate::engine::WaiterId;
use crate::records::{LogRecord, SagaOpOutcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SagaConfig {
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// How long one action, compensation or op query may take before it counts as unknown.
    pub step_timeout_ms: u64,
}

/// What a client waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SagaWait {
    /// A terminal state (the default).
    Terminal,
    /// Only the durable acceptance (`?wait=none`, 202).
    Accepted,
}

/// What `GET {base}/saga/ops/{op_id}` said, or that it said nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    Done(Option<serde_json::Value>),
    Failed(String),
    Compensated,
    NotFound,
    NoAnswer(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum SagaEvent {
    /// A valid request (shape checked, participants configured).
    Submit {
        waiter: WaiterId,
        wait: SagaWait,
        request: SagaRequest,
        digest: Digest,
        now_ms: u64,
        /// The client's name from its token (`None` with authentication off).
        client: Option<String>,
    },
    /// An action or compensation came back; the shell classified the answer.
    OpAnswered {
        id: TxId,
        step: usize,
        kind: OpKind,
        outcome: SagaOpOutcome,
        now_ms: u64,
        jitter: u64,
    },
    /// An op query came back.
    ProbeAnswered {
        id: TxId,
        step: usize,
        answer: ProbeAnswer,
        now_ms: u64,
        jitter: u64,
    },
    RetryDue {
        id: TxId,
        now_ms: u64,
    },
    DeadlineDue {
        id: TxId,
        now_ms: u64,
    },
    /// The log is replayed and this run's epoch is durable: resume every live saga.
    Recovered {
        now_ms: u64,
    },
    /// The records of one step are durable: one id per record, as appended.
    Durable {
        ids: Vec<TxId>,
        now_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum SagaCommand {
    /// Forced append; later commands of the same step wait until it is durable.
    Append(LogRecord),
    Send {
        id: TxId,
        step: usize,
        kind: OpKind,
        participant: protocol::ParticipantName,
        op_id: String,
        payload: serde_json::Value,
        attempt: u32,
        timeout_ms: u64,
    },
    Probe {
        id: TxId,
        step: usize,
        participant: protocol::ParticipantName,
        op_id: String,
        timeout_ms: u64,
    },
    ArmRetry {
        id: TxId,
        after_ms: u64,
    },
    ArmDeadline {
        id: TxId,
        after_ms: u64,
    },
    Reply {
        waiter: WaiterId,
        reply: SagaReply,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum SagaReply {
    /// 200: the saga as it stands (terminal unless the client asked for less).
    Saga(SagaResponse),
    /// 202 (`?wait=none`): accepted durably, running.
    Accepted(SagaResponse),
    /// 409: the id is known with another body.
    Conflict(TxId),
}
