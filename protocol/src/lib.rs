//! Wire types of the twopc contract (design section 3), shared by the coordinator, the
//! participants, the CLI and the tests.
//!
//! This crate owns the shapes of every JSON body, the id newtypes, the documented limits and
//! the route paths. It must never do I/O, hold state, or depend on either side's crates: both
//! the coordinator and the participants depend on it, never on each other.
//!
//! The map, floor by floor; a module imports only from floors below its own:
//! 1. `limits`, `error` (the error body and codes), `kv`, `auth` (tokens, their files, who may
//!    call what).
//! 2. `ids`.
//! 3. `messages` (prepare, decision, vote), then `batch` (many of them in one request),
//!    `lease`, `fence_proof`, `cross_site`, then `outbox` (a write's next intents and their
//!    delivery).
//! 4. `transaction` (the client's request and answers), then `digest` (the idempotency digest
//!    of a request).
//! 5. `saga` (the saga wire types, including a saga's hand resolution).
//! 6. `routes` (the paths) and `operator` (operator actions, the audit trail, the cluster
//!    view).

pub mod auth;
pub mod batch;
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
pub mod outbox;
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
