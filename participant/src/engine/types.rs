//! The engine's vocabulary: configuration, events in, commands out, prepared transactions.

use protocol::{
    CoordinatorId, DecisionQuery, DecisionQueryResponse, DecisionRequest, Epoch, GlobalTxId,
    Incarnation, PrepareRequest, TxId, Vote,
};

use crate::record::Record;
use crate::rejection::Rejection;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// A prepared transaction with no decision for this long asks the coordinator.
    pub in_doubt_after_ms: u64,
    /// First wait between decision queries after an unhelpful answer.
    pub decision_backoff_base_ms: u64,
    /// Cap on the wait between decision queries (jitter of up to half is added on top).
    pub decision_backoff_max_ms: u64,
    /// How long a decided transaction is remembered.
    pub tombstone_retention_ms: u64,
    /// Most decided transactions remembered.
    pub tombstones_max: usize,
    /// Longest a prepare may queue for locks held by older attempts before voting no
    /// (`lock_timeout: ...`); the request's `lock_wait_ms` can only shorten it. 0: never wait,
    /// a conflicting prepare votes no at once (`lock_conflict: ...`).
    pub lock_wait_max_ms: u64,
    /// Most prepares queued at once; past it a conflicting prepare votes no at once, so a
    /// burst on one hot key cannot grow the queue (and each release's scan) without bound.
    pub lock_waiters_max: usize,
    /// Most an epoch may rise above the highest held for its coordinator in one message
    /// (`crate::epoch_bound`). `None` when peers authenticate: only they reach the engine.
    pub epoch_jump_max: Option<u64>,
    /// Which fencing tokens are taken at all: with the lease service's key, only proven ones;
    /// without, none that jumps too far (`crate::fence::policy`).
    pub fence: crate::fence::FencePolicy,
    /// How long fenced resources' highest tokens and op ids' answers are kept.
    pub fence_retention: crate::fence::table::FenceRetention,
    /// How long delivered and abandoned intents are kept (pending and failed: always).
    pub outbox_retention: crate::outbox::OutboxRetention,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            in_doubt_after_ms: 5_000,
            decision_backoff_base_ms: 100,
            decision_backoff_max_ms: 10_000,
            tombstone_retention_ms: 24 * 60 * 60 * 1000,
            tombstones_max: 1_000_000,
            lock_wait_max_ms: 2_000,
            lock_waiters_max: 4_096,
            epoch_jump_max: Some(crate::epoch_bound::EPOCH_JUMP_MAX_DEFAULT),
            fence: crate::fence::FencePolicy::default(),
            fence_retention: crate::fence::table::FenceRetention::default(),
            outbox_retention: crate::outbox::OutboxRetention::default(),
        }
    }
}

/// Something that happened to the participant.
#[derive(Debug, Clone)]
pub enum Event {
    /// `waiter` names this request for a later [`Command::Deliver`]: a prepare that queues
    /// for locks gets no reply in this step. The shell assigns it, unique among open requests.
    Prepare {
        request: PrepareRequest,
        now_ms: u64,
        waiter: u64,
    },
    Commit {
        request: DecisionRequest,
        now_ms: u64,
    },
    Abort {
        request: DecisionRequest,
        now_ms: u64,
    },
    /// Time passed: prepared transactions in doubt for too long ask the coordinator, and
    /// prepares queued for locks past their deadline vote no.
    Tick { now_ms: u64 },
    /// The coordinator's answer to a decision query; `None` when it could not be asked or gave
    /// no usable answer. The engine obeys only a `commit` or `abort` from the coordinator id
    /// that prepared the attempt, at an epoch no lower than the highest it holds for that id.
    /// `entropy` is any random number (it picks the jitter).
    DecisionAnswer {
        gtid: GlobalTxId,
        answer: Option<DecisionQueryResponse>,
        now_ms: u64,
        entropy: u64,
    },
    /// A write outside 2PC guarded by a fencing token (`crate::fence`).
    FencedWrite {
        write: crate::fence::FencedWrite,
        now_ms: u64,
    },
    /// A write outside 2PC, fenced or not, with the intents it records (`crate::outbox`).
    Write {
        write: crate::outbox::Write,
        now_ms: u64,
    },
    /// A relay's report on an intent, or an operator's action on it (`crate::outbox`).
    Intent {
        event_id: String,
        request: crate::outbox::IntentRequest,
        now_ms: u64,
    },
    /// An operator lowers a fenced resource's highest token (audited; `crate::fence::table`).
    ResetFence {
        request: crate::fence::FenceResetRequest,
        now_ms: u64,
    },
}

impl Event {
    /// The time this event happened.
    pub fn now_ms(&self) -> u64 {
        match self {
            Event::Prepare { now_ms, .. }
            | Event::Commit { now_ms, .. }
            | Event::Abort { now_ms, .. }
            | Event::Tick { now_ms }
            | Event::DecisionAnswer { now_ms, .. }
            | Event::FencedWrite { now_ms, .. }
            | Event::Write { now_ms, .. }
            | Event::Intent { now_ms, .. }
            | Event::ResetFence { now_ms, .. } => *now_ms,
        }
    }
}

/// What the shell must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Append `record`. When `forced`, the reply that follows must wait until it is durable.
    Log { record: Record, forced: bool },
    /// Answer the request that caused this step.
    Reply(Reply),
    /// Answer a prepare that queued for locks in an earlier step (its `waiter`). Like a reply,
    /// it leaves only once every forced record before it in this list is durable (a yes
    /// follows its `Prepared` record). A waiter id the shell no longer knows (its client left)
    /// is dropped.
    Deliver { waiter: u64, reply: Reply },
    /// Ask the coordinator for this attempt's decision
    /// (`GET /v1/transactions/{txid}/decision?{query}`), then feed back `DecisionAnswer`.
    AskDecision { txid: TxId, query: DecisionQuery },
}

/// The answer to a protocol request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Vote(Vote),
    Ack,
    Reject(Rejection),
    /// A fenced write's answer (the first one, for a repeated op id).
    Fenced(crate::fence::FencedAnswer),
    /// An operator's reset, as logged.
    FenceReset(crate::fence::FenceReset),
    /// An intent as it stands after a report or an operator's action.
    Intent(Box<protocol::outbox::OutboxEntry>),
}

/// A transaction holding its locks between prepare and decision.
#[derive(Debug)]
pub struct PreparedTx<S> {
    /// The client's id, as the coordinator sent it (for the decision query's path and logs).
    pub txid: TxId,
    pub coordinator_id: CoordinatorId,
    /// The epoch, run and position the attempt was prepared under.
    pub epoch: Epoch,
    pub incarnation: Incarnation,
    pub position: u64,
    pub payload: serde_json::Value,
    /// The payload's digest, kept in the tombstone once the attempt ends.
    pub digest: protocol::digest::Digest,
    pub staged: S,
    pub keys: Vec<String>,
    pub prepared_at_ms: u64,
    /// Its place in the lock-wait order (the coordinator's start time, or the prepare's
    /// arrival here when the coordinator sent none); logged so a restart keeps it.
    pub started_at_ms: u64,
    /// Every participant the attempt named, as its prepare said (`None`: not sent).
    pub participants: Option<Vec<protocol::ParticipantName>>,
    pub(super) next_ask_at_ms: u64,
    pub(super) asks: u32,
    pub(super) asking: bool,
    /// The coordinator's last answer that did not decide it, with its reason (`unknown: ...`).
    pub last_answer: Option<String>,
}

/// Why the log cannot be replayed into the engine.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("prepared attempt {gtid}: its logged payload no longer parses: {reason}")]
    Payload { gtid: GlobalTxId, reason: String },
    #[error("snapshot: {0}")]
    Snapshot(String),
    #[error("fenced write {op_id}: its logged payload no longer parses: {reason}")]
    FencedWrite { op_id: String, reason: String },
}
