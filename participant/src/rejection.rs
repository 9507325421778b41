//! Protocol requests the participant refuses to process, each with its error code.

use protocol::{CoordinatorId, Epoch, ErrorCode, GlobalTxId, Incarnation};

/// A request answered with an error instead of a vote or an ack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error(
        "epoch {got} of coordinator {coordinator_id} is older than epoch {highest}, already seen"
    )]
    StaleEpoch {
        coordinator_id: CoordinatorId,
        got: Epoch,
        highest: Epoch,
    },
    #[error(
        "epoch {epoch} of coordinator {coordinator_id} was already claimed by its run \
         {claimed_by}; this message comes from run {got}, which runs on a rolled-back copy of \
         that coordinator's log (a restored backup?)"
    )]
    IncarnationConflict {
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        claimed_by: Incarnation,
        got: Incarnation,
    },
    #[error("transaction {gtid} {why}")]
    NotPrepared { gtid: GlobalTxId, why: String },
    #[error("attempt {gtid} does not belong to coordinator {coordinator_id}")]
    ForeignAttempt {
        gtid: GlobalTxId,
        coordinator_id: CoordinatorId,
    },
    #[error(
        "epoch {got} of coordinator {coordinator_id} is more than {max_jump} above the highest \
         held here ({highest}); a real coordinator rises one per start. Refused unless the \
         sender authenticates as a peer (docs/security.md)"
    )]
    EpochTooHigh {
        coordinator_id: CoordinatorId,
        got: Epoch,
        highest: Epoch,
        max_jump: u64,
    },
    #[error("invalid payload: {0}")]
    InvalidPayload(String),
    #[error("payload is {len} bytes; the limit is {max}")]
    PayloadTooLarge { len: usize, max: usize },
    #[error("key {key:?} is locked by prepared transaction {holder}; retry after its decision")]
    KeyLocked { key: String, holder: GlobalTxId },
    #[error(
        "op_id {op_id:?} was already used for another write (another key, value, resource or \
         token); its answer is not this write's: use a new op id for a new write"
    )]
    OpIdConflict { op_id: String },
    /// A fence claim the resource cannot trust: no valid proof, or a token too far above
    /// every token accepted here (`crate::fence::policy`). Stale tokens are answered, not
    /// rejected (`crate::fence::FencedAnswer::Stale`).
    #[error("{0}")]
    FenceRefused(crate::fence::FenceRefusal),
    /// An operator's fence reset that does not apply.
    #[error("{0}")]
    ResetRefused(crate::fence::ResetRefused),
    /// A write's condition (a `check` op) does not hold: nothing written, no intent recorded.
    #[error("condition failed: {0}")]
    ConditionFailed(String),
    /// A write's intents cannot be recorded as given (ids, count, duplicates, size).
    #[error("next: {0}")]
    InvalidIntent(crate::outbox::IntentProblem),
    #[error(
        "event_id {event_id:?} was already recorded by write {op_id:?}; an intent's id names \
         one intent for ever: use a new event_id"
    )]
    EventIdConflict { event_id: String, op_id: String },
    #[error("no intent {event_id:?} in this outbox (never written, or settled past retention)")]
    IntentUnknown { event_id: String },
    #[error(
        "intent {event_id:?} is seq {seq} of aggregate {aggregate:?}, but its seq {earlier_seq} \
         ({earlier:?}) is still open: intents of one aggregate are delivered in order"
    )]
    IntentOutOfOrder {
        event_id: String,
        aggregate: String,
        seq: u64,
        earlier: String,
        earlier_seq: u64,
    },
    #[error("intent {event_id:?} is {state}; {action} takes {takes} intents only")]
    IntentNotPending {
        event_id: String,
        state: &'static str,
        action: &'static str,
        takes: &'static str,
    },
    /// A mark without `state: delivered|abandoned`.
    #[error("{0}")]
    InvalidMark(String),
    /// An operator action without operator or reason, or with one too long.
    #[error("{0}")]
    InvalidOperator(String),
}

impl Rejection {
    /// For the fencing refusals, the highest epoch this participant holds for the sender's
    /// coordinator id (0 when it holds none): the error body names it (`highest_epoch`) so a
    /// coordinator whose epoch was passed, or claimed by another run, can log one above it
    /// and be obeyed again without a restart.
    pub fn highest_epoch(&self) -> Option<Epoch> {
        match self {
            Rejection::StaleEpoch { highest, .. } | Rejection::EpochTooHigh { highest, .. } => {
                Some(*highest)
            }
            // The conflicting epoch is the highest held: another run claimed it.
            Rejection::IncarnationConflict { epoch, .. } => Some(*epoch),
            Rejection::NotPrepared { .. }
            | Rejection::ForeignAttempt { .. }
            | Rejection::InvalidPayload(_)
            | Rejection::PayloadTooLarge { .. }
            | Rejection::KeyLocked { .. }
            | Rejection::OpIdConflict { .. }
            | Rejection::FenceRefused(_)
            | Rejection::ResetRefused(_)
            | Rejection::ConditionFailed(_)
            | Rejection::InvalidIntent(_)
            | Rejection::EventIdConflict { .. }
            | Rejection::IntentUnknown { .. }
            | Rejection::IntentOutOfOrder { .. }
            | Rejection::IntentNotPending { .. }
            | Rejection::InvalidMark(_)
            | Rejection::InvalidOperator(_) => None,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Rejection::StaleEpoch { .. } => ErrorCode::StaleEpoch,
            Rejection::IncarnationConflict { .. } => ErrorCode::IncarnationConflict,
            Rejection::ForeignAttempt { .. } => ErrorCode::InvalidId,
            Rejection::NotPrepared { .. } => ErrorCode::NotPrepared,
            Rejection::InvalidPayload(_) => ErrorCode::InvalidPayload,
            Rejection::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Rejection::KeyLocked { .. } => ErrorCode::KeyLocked,
            Rejection::EpochTooHigh { .. } => ErrorCode::EpochTooHigh,
            Rejection::OpIdConflict { .. } => ErrorCode::OpIdConflict,
            Rejection::FenceRefused(refusal) => match refusal {
                crate::fence::FenceRefusal::Stale(_) => ErrorCode::StaleToken,
                crate::fence::FenceRefusal::Unproven { .. } => ErrorCode::InvalidFenceProof,
                crate::fence::FenceRefusal::TooHigh { .. } => ErrorCode::TokenTooHigh,
            },
            Rejection::ResetRefused(refused) => match refused {
                crate::fence::ResetRefused::Unknown { .. } => ErrorCode::NotFound,
                crate::fence::ResetRefused::Changed { .. } => ErrorCode::FenceChanged,
                crate::fence::ResetRefused::NotLower { .. } => ErrorCode::InvalidReset,
            },
            Rejection::ConditionFailed(_) => ErrorCode::ConditionFailed,
            Rejection::InvalidIntent(crate::outbox::IntentProblem::Id(_)) => ErrorCode::InvalidId,
            Rejection::InvalidIntent(crate::outbox::IntentProblem::Shape(_)) => {
                ErrorCode::InvalidPayload
            }
            Rejection::EventIdConflict { .. } => ErrorCode::IdConflict,
            Rejection::IntentUnknown { .. } => ErrorCode::NotFound,
            Rejection::IntentOutOfOrder { .. } => ErrorCode::IntentOutOfOrder,
            Rejection::IntentNotPending { .. } => ErrorCode::NotPending,
            Rejection::InvalidMark(_) => ErrorCode::InvalidPayload,
            Rejection::InvalidOperator(_) => ErrorCode::InvalidOperator,
        }
    }
}
