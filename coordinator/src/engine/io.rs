//! The engine's inputs (events) and outputs (commands). Time and randomness arrive as event
//! data, so the same events always give the same commands.

use protocol::{Decision, GlobalTxId, ParticipantName, TransactionResponse, TxId, VoteKind};

use crate::digest::Digest;
use crate::records::{Attempt, DecisionRecord, EpochRecord, LogRecord, Retained};

/// Names a client request waiting for an answer; the runtime maps it to a channel.
pub type WaiterId = u64;

/// What a client waits for before it hears back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// The outcome is durable (the default).
    Decision,
    /// The outcome is durable and every participant acknowledged it (`?wait=acked`).
    Acked,
}

/// Something that happened.
// Events are built once and moved into `step`, never stored in bulk: a large `Submit` costs a
// copy per request, which boxing would only trade for an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A valid client request (shape checked, participants known to the configuration).
    Submit {
        waiter: WaiterId,
        wait: WaitFor,
        txid: TxId,
        digest: Digest,
        participants: Vec<(ParticipantName, serde_json::Value)>,
        timeout_ms: u64,
        now_ms: u64,
        /// What the outcome index held for `txid` (inside the window), looked up by the
        /// runtime before this event, outside the engine lock.
        archived: Option<Retained>,
        /// `Engine::archive_generation` as the runtime read it before that lookup: if an
        /// `Archived` event came in between, an outcome may have left staging after the lookup
        /// missed it, so the engine asks for the lookup again instead of starting an attempt.
        archive_generation: u64,
        /// The client's name from its token (`None` with authentication off).
        client: Option<String>,
    },
    /// A participant answered a prepare, or the runtime stands in for an answer that was not a
    /// vote (`Timeout` for no answer in time, `Error` for transport errors, non-200 or malformed).
    VoteReceived {
        txid: TxId,
        participant: ParticipantName,
        vote: VoteKind,
        reason: Option<String>,
        now_ms: u64,
    },
    /// The prepare deadline of a transaction passed.
    PrepareDeadline { txid: TxId, now_ms: u64 },
    /// The decision record is durable.
    DecisionDurable { txid: TxId },
    /// The decision record could not be made durable: the log is poisoned.
    DecisionFailed { txid: TxId, error: String },
    /// A participant acknowledged the decision.
    Acked {
        txid: TxId,
        participant: ParticipantName,
        now_ms: u64,
    },
    /// A phase-two delivery failed; `jitter` is a random number the runtime drew.
    DeliveryFailed {
        txid: TxId,
        participant: ParticipantName,
        error: String,
        jitter: u64,
    },
    /// A phase-two retry timer fired.
    RetryDue {
        txid: TxId,
        participant: ParticipantName,
    },
    /// An operator asked for pending deliveries now: of one transaction, to one participant,
    /// or both (`None` matches all). Only deliveries waiting for their backoff timer start.
    RetryNow {
        txid: Option<TxId>,
        participant: Option<ParticipantName>,
    },
    /// Recovery replayed the log and this run's epoch record (`identity`, with its fresh
    /// incarnation) is durable: this run begins, and finishes what the last runs left.
    RecoveryDone { now_ms: u64, identity: EpochRecord },
    /// Forget ended outcomes older than the retention window.
    ExpireRetained { now_ms: u64, retention_ms: u64 },
    /// These outcomes (id and attempt) are durable in the outcome index: they leave staging,
    /// unless a newer outcome of the same id (another attempt) replaced them meanwhile.
    Archived { archived: Vec<(TxId, GlobalTxId)> },
    /// A participant refused a message this run sent with `stale_epoch` or
    /// `incarnation_conflict` (`engine::epoch`).
    Fenced(crate::engine::Fenced),
    /// A raised epoch of this run (`Command::AppendEpoch`) is durable.
    EpochDurable { identity: EpochRecord },
}

/// What the engine asks the runtime to do, in this order.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Append without waiting for fsync (Begin, Ack, End): losing it is harmless (a lost
    /// Begin leaves its attempt outside the log's span of its run, so participants that ask
    /// about it hear `unknown`, never a guess).
    AppendLazy(LogRecord),
    /// Append and fsync; nobody waits for it (the behind mark: losing it in a crash only
    /// means learning it again).
    AppendForced(LogRecord),
    /// Append and fsync a raised epoch of this run; answer with `EpochDurable`. No message
    /// carries the epoch before that.
    AppendEpoch(EpochRecord),
    /// Append and fsync the decision; answer with `DecisionDurable` or `DecisionFailed`.
    /// Nothing that depends on the decision happens before that answer.
    AppendDecision(DecisionRecord),
    SendPrepare {
        txid: TxId,
        attempt: Attempt,
        participant: ParticipantName,
        payload: serde_json::Value,
        timeout_ms: u64,
        /// The attempt's `created_at_ms`: participants order lock waits by it (oldest first).
        started_at_ms: u64,
        /// Every participant the attempt names, sent with the prepare so that each can vouch
        /// for the list if this log is ever lost (an operator's resolution needs it).
        named: Vec<ParticipantName>,
    },
    /// Send `PrepareDeadline` after this long.
    ArmPrepareDeadline { txid: TxId, after_ms: u64 },
    SendDecision {
        txid: TxId,
        gtid: GlobalTxId,
        participant: ParticipantName,
        decision: Decision,
        attempt: u32,
        /// `false` for an abort sent once to a participant that did not vote yes: nothing is
        /// owed to it (if it prepared after all, it asks and hears the presumed abort), so its
        /// answer, or the lack of one, changes nothing.
        tracked: bool,
    },
    /// Send `RetryDue` after this long.
    ArmRetry {
        txid: TxId,
        participant: ParticipantName,
        after_ms: u64,
    },
    /// Answer a waiting client.
    Reply { waiter: WaiterId, reply: Reply },
    /// Write this ended outcome to the outcome index; answer with `Archived` once the write is
    /// durable (never before: until then staging is the only copy outside the log).
    Archive(Retained),
}

/// The answer a waiting client gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Outcome(TransactionResponse),
    /// The id is known with another request body.
    Conflict {
        txid: TxId,
    },
    /// The decision could not be logged; the outcome is unknown to the client.
    LogFailed {
        error: String,
    },
    /// Admission control refused a new transaction (or one more waiter): `participant` holds
    /// as much work here as the bounds allow. Nothing was begun; retry later.
    Overloaded {
        participant: ParticipantName,
        message: String,
    },
    /// Runtime-internal, never shown to a client: an outcome was archived between the
    /// runtime's index lookup and this step; look the id up again and resubmit.
    LookAgain,
    /// The outcome archiver is behind by `staged` outcomes (at least `retained_max`): new
    /// attempts wait until it catches up (503), so memory stays bounded and nothing that
    /// ended is dropped before it is durable in the index.
    Busy {
        staged: usize,
    },
    /// Runtime-made: the outcome index could not be read, so whether this id already has an
    /// outcome is unknown; nothing was started (503, retry with the same id).
    IndexUnavailable {
        error: String,
    },
}

impl Event {
    /// The one transaction this event is about, if it is about one.
    pub fn txid(&self) -> Option<&TxId> {
        match self {
            Event::Submit { txid, .. }
            | Event::VoteReceived { txid, .. }
            | Event::PrepareDeadline { txid, .. }
            | Event::DecisionDurable { txid }
            | Event::DecisionFailed { txid, .. }
            | Event::Acked { txid, .. }
            | Event::DeliveryFailed { txid, .. }
            | Event::RetryDue { txid, .. } => Some(txid),
            Event::RetryNow { txid, .. } => txid.as_ref(),
            Event::RecoveryDone { .. }
            | Event::ExpireRetained { .. }
            | Event::Archived { .. }
            | Event::Fenced(_)
            | Event::EpochDurable { .. } => None,
        }
    }
}
