//! Protocol requests the participant refuses to process, each with its error code.

use protocol::{CoordinatorId, Epoch, ErrorCode, TxId};

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
    #[error("transaction {txid} {why}")]
    NotPrepared { txid: TxId, why: String },
    #[error("invalid payload: {0}")]
    InvalidPayload(String),
    #[error("payload is {len} bytes; the limit is {max}")]
    PayloadTooLarge { len: usize, max: usize },
}

impl Rejection {
    pub fn code(&self) -> ErrorCode {
        match self {
            Rejection::StaleEpoch { .. } => ErrorCode::StaleEpoch,
            Rejection::NotPrepared { .. } => ErrorCode::NotPrepared,
            Rejection::InvalidPayload(_) => ErrorCode::InvalidPayload,
            Rejection::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
        }
    }
}
