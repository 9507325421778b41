//! Wire types of the twopc contract (design section 3), shared by the coordinator, the
//! participants, the CLI and the tests.
//!
//! This crate owns the shapes of every JSON body, the id newtypes, the documented limits and
//! the route paths. It must never do I/O, hold state, or depend on either side's crates: both
//! the coordinator and the participants depend on it, never on each other.

pub mod auth;
pub mod cross_site;
pub mod digest;
pub mod error;
pub mod fence_proof;
pub mod ids;
pub mod kv;
pub mod lease;
pub mod limits;
pub mod messages;
pub mod operator;
pub mod routes;
pub mod saga;
pub mod transaction;

pub use error::{ErrorBody, ErrorCode};
pub use ids::{CoordinatorId, Epoch, GlobalTxId, IdError, Incarnation, ParticipantName, TxId};
pub use messages::{
    AckResponse, Decision, DecisionQuery, DecisionQueryResponse, DecisionRequest, DecisionStatus,
    PrepareRequest, Vote, VoteKind,
};
pub use transaction::{
    Outcome, ParticipantRequest, ParticipantResult, ParticipantStatus, RequestError,
    TransactionList, TransactionRequest, TransactionResponse, TransactionState, TransactionStatus,
    ValidRequest,
};
