//! The embedding trait: what a service implements to take part in 2PC with its own SQL.

use std::future::Future;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

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

    /// The SQL, with its parameter types, that [`PgWork::work_prepared`] runs: the library
    /// prepares each once per session and keeps it there, so PostgreSQL parses and plans it
    /// once instead of on every transaction. Called once, when the participant starts. By
    /// default none (the library calls [`PgWork::work`]).
    fn prepared_sql(&self) -> Vec<(String, Vec<Type>)> {
        Vec::new()
    }

    /// [`PgWork::work`] with the statements of [`PgWork::prepared_sql`] prepared on `client`'s
    /// session, in the same order. By default it ignores them and calls `work`.
    fn work_prepared(
        &self,
        client: &Client,
        prepared: &[Statement],
        payload: &serde_json::Value,
    ) -> impl Future<Output = Result<(), WorkRefusal>> + Send {
        let _ = prepared;
        self.work(client, payload)
    }

    /// A local write's statement (`POST /v1/pg/write`, `super::write`): runs the named
    /// statement with `params` inside the open transaction on `client` and counts its rows;
    /// the library judges the count against [`Ran::expected`]. The ready-made participant's
    /// statements file implements it; by default a service takes no local writes.
    fn run_statement(
        &self,
        client: &Client,
        statement: &str,
        params: &[serde_json::Value],
    ) -> impl Future<Output = Result<Ran, RunError>> + Send {
        let _ = (client, statement, params);
        async {
            Err(RunError::Invalid(
                "this participant runs no statements file, so it takes no local writes".into(),
            ))
        }
    }
}

/// A statement run alone by a local write: its row count, what it returned (each row an object
/// by column name), and the count it declared (`guards_intent`, else `expect_rows`).
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    pub rows: u64,
    pub returned: Vec<serde_json::Value>,
    pub expected: Option<u64>,
}

/// Why a statement run alone gave no row count.
#[derive(Debug)]
pub enum RunError {
    /// Unknown statement or parameters that do not fit (422 `invalid_payload`).
    Invalid(String),
    /// The database refused it.
    Db(tokio_postgres::Error),
}
