//! What can go wrong between the participant and PostgreSQL, with the context an operator needs.

use super::gid::GidError;

/// A PostgreSQL backend failure.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("cannot connect to PostgreSQL at {url}: {message}")]
    Connect { url: String, message: String },
    #[error(
        "max_prepared_transactions is 0 on this PostgreSQL server, so PREPARE TRANSACTION is \
         disabled: set max_prepared_transactions (e.g. 100, at least the transactions prepared \
         at once on this server) in postgresql.conf or with ALTER SYSTEM, then restart \
         PostgreSQL (the setting only takes effect at server start)"
    )]
    PreparedTransactionsDisabled,
    #[error("{context}: {message}")]
    Db { context: String, message: String },
    #[error(transparent)]
    Gid(#[from] GidError),
    #[error("cannot build the decision client: {0}")]
    Client(#[from] net::outbound::BuildError),
}

impl PgError {
    pub(crate) fn db(context: impl Into<String>, error: tokio_postgres::Error) -> Self {
        PgError::Db {
            context: context.into(),
            message: describe(&error),
        }
    }
}

/// The database's own message with its SQLSTATE, or the client error for connection faults.
pub fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(&format!(": {detail}"));
            }
            text
        }
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}
