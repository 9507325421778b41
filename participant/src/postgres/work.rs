//! The embedding trait: what a service implements to take part in 2PC with its own SQL.

use std::future::Future;

use tokio_postgres::Client;

use super::error::describe;

/// Why a transaction's work did not run to the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkRefusal {
    /// The payload cannot be understood (answered 422 `invalid_payload`, not as a vote).
    Invalid(String),
    /// The transaction cannot commit: the participant votes no with this reason.
    No(String),
}

impl From<tokio_postgres::Error> for WorkRefusal {
    /// A database error (constraint violation, serialization failure, a lost connection...)
    /// is a no vote carrying the database's message.
    fn from(error: tokio_postgres::Error) -> Self {
        WorkRefusal::No(describe(&error))
    }
}

/// A service's transactional work, run by the library inside its open transaction.
///
/// The library has sent `BEGIN` and the outcome row on `client`'s session before calling
/// [`PgWork::work`], without waiting for their answers: what the work sends first goes out in
/// the same round trip (PostgreSQL runs it after them, in order). Statements the work issues
/// together without awaiting each (e.g. `execute_typed` futures polled together) share a round
/// trip too; a query given as a `&str` to `execute` or `query` costs a round trip more to
/// prepare it. After the work returns `Ok`, the library sends `PREPARE TRANSACTION` on the same
/// session, then votes yes. On `Err` it rolls back. The work must not end the transaction
/// itself (no `COMMIT`, `ROLLBACK` or `PREPARE TRANSACTION`) and must not keep `client` beyond
/// the call.
pub trait PgWork: Send + Sync + 'static {
    /// Runs this transaction's SQL for `payload`.
    fn work(
        &self,
        client: &Client,
        payload: &serde_json::Value,
    ) -> impl Future<Output = Result<(), WorkRefusal>> + Send;
}
