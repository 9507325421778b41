//! A small pool of PostgreSQL sessions, in two sides. A prepare needs one session from `BEGIN`
//! to `PREPARE TRANSACTION`, and may wait on a row lock all that time; phase two, recovery and
//! the health reads need one for a round trip or two and never wait on a row lock. They count
//! against separate limits: were they one, prepares waiting on a lock could hold every session
//! while the `COMMIT PREPARED` that frees that lock waits for one. A session that saw a
//! connection error is dropped instead of returned.
//!
//! A session keeps the statements a prepare sends (the library's own, and the service's that
//! [`super::work::PgWork::prepared_sql`] names) prepared on the server once it has sent them
//! (`Session::statement`): parsing, analysing and planning them on every prepare was a third
//! of the server's CPU per transfer (issue 28, docs/benchmarks.md).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, Statement};

use super::error::{PgError, describe};

/// Who takes a session, and so which limit it counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Phase one: held across the work, which may wait on row locks.
    Prepare,
    /// Phase two, recovery, bookkeeping and health reads: never wait on a row lock.
    Decide,
}

/// Statements prepared on one session (a statement belongs to the session that prepared it).
type Prepared = HashMap<String, Statement>;

/// A session waiting in the pool, with what it has prepared.
struct Idle {
    client: Client,
    statements: Prepared,
}

/// At most `prepare` + `decide` sessions, opened on demand; idle ones serve either side.
pub(crate) struct Pool {
    config: tokio_postgres::Config,
    /// The URL without its password, for messages.
    shown: String,
    idle: Mutex<Vec<Idle>>,
    prepare: Semaphore,
    decide: Semaphore,
}

/// A session taken from the pool; returned when dropped unless marked broken, or dropped while
/// a transaction it began is open (a prepare whose HTTP request was cancelled half-way): the
/// next user must never find itself inside someone else's transaction, so such a session is
/// closed, and PostgreSQL rolls its transaction back.
pub(crate) struct Session<'a> {
    client: Option<Client>,
    /// The statements prepared on this session so far, by their SQL.
    statements: Prepared,
    in_transaction: bool,
    pool: &'a Pool,
    _permit: SemaphorePermit<'a>,
}

impl Pool {
    pub(crate) fn new(url: &str, prepare: usize, decide: usize) -> Result<Self, PgError> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| PgError::Connect {
            url: redact(url),
            message: format!("not a PostgreSQL connection string: {e}"),
        })?;
        Ok(Self {
            config,
            shown: redact(url),
            idle: Mutex::new(Vec::new()),
            prepare: Semaphore::new(prepare.max(1)),
            decide: Semaphore::new(decide.max(1)),
        })
    }

    pub(crate) fn shown_url(&self) -> &str {
        &self.shown
    }

    pub(crate) async fn get(&self, side: Side) -> Result<Session<'_>, PgError> {
        let permits = match side {
            Side::Prepare => &self.prepare,
            Side::Decide => &self.decide,
        };
        let permit = permits.acquire().await.map_err(|_| PgError::Connect {
            url: self.shown.clone(),
            message: "the pool is closed".into(),
        })?;
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let mut found = None;
            while let Some(waiting) = idle.pop() {
                if !waiting.client.is_closed() {
                    found = Some(waiting);
                    break;
                }
            }
            found
        };
        let (client, statements) = match reused {
            Some(Idle { client, statements }) => (client, statements),
            None => (self.connect().await?, Prepared::new()),
        };
        Ok(Session {
            client: Some(client),
            statements,
            in_transaction: false,
            pool: self,
            _permit: permit,
        })
    }

    pub(crate) async fn connect(&self) -> Result<Client, PgError> {
        let (client, connection) =
            self.config
                .connect(NoTls)
                .await
                .map_err(|e| PgError::Connect {
                    url: self.shown.clone(),
                    message: describe(&e),
                })?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(error = %describe(&error), "PostgreSQL session ended");
            }
        });
        Ok(client)
    }
}

impl Session<'_> {
    pub(crate) fn client(&self) -> &Client {
        // Present from creation until drop.
        self.client.as_ref().unwrap_or_else(|| unreachable!())
    }

    /// `sql` prepared on this session with parameters of `types`: sent to the server the first
    /// time this session needs it (a round trip), then kept for the session's life.
    pub(crate) async fn statement(
        &mut self,
        sql: &str,
        types: &[Type],
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client().prepare_typed(sql, types).await?;
        self.statements.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    /// Marks that a transaction is open (or may be) on this session until [`Session::idle`].
    pub(crate) fn busy(&mut self) {
        self.in_transaction = true;
    }

    /// Marks that no transaction is open any more (prepared, committed or rolled back).
    pub(crate) fn idle(&mut self) {
        self.in_transaction = false;
    }

    /// Drops the session instead of returning it (its state is unknown after an error).
    pub(crate) fn discard(mut self) {
        self.client = None;
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
            && !self.in_transaction
        {
            let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.push(Idle {
                client,
                statements: std::mem::take(&mut self.statements),
            });
        }
    }
}

/// `postgres://user:secret@host/db` without the secret (also `password=` in key/value form).
pub fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((userinfo, host)) = rest.split_once('@')
        && let Some((user, _)) = userinfo.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    url.split_whitespace()
        .map(|part| {
            if part.starts_with("password=") {
                "password=***"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://bob:hunter2@127.0.0.1:5432/db"),
            "postgres://bob:***@127.0.0.1:5432/db"
        );
        assert_eq!(
            redact("host=x user=bob password=hunter2 dbname=d"),
            "host=x user=bob password=*** dbname=d"
        );
        assert_eq!(redact("postgres://bob@x/db"), "postgres://bob@x/db");
    }
}
