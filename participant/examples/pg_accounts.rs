//! Embedding the PostgreSQL backend: an accounts service whose transfers join a twopc
//! transaction, doing its own SQL inside the library's open transaction. Quoted in
//! docs/participants.md.
//!
//! `cargo run -p twopc-participant --example pg_accounts -- postgres://postgres@127.0.0.1:5432/bank 127.0.0.1:7201`
//! (the database needs `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)`).

use participant::finish;
use participant::postgres::{PgConfig, PgParticipant, PgWork, WorkRefusal};
use serde::Deserialize;
use serde_json::Value;
use tokio_postgres::Client;

/// A payload: `{"account": "u1", "delta": -10}` (negative: a debit).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    account: String,
    delta: i64,
}

/// The service's work; it holds nothing, PostgreSQL holds the accounts.
#[derive(Debug)]
struct Accounts;

impl PgWork for Accounts {
    /// Runs inside the transaction the library opened; after `Ok` the library writes its
    /// outcome row and sends `PREPARE TRANSACTION`. A database error (`?`) votes no with the
    /// database's message; `WorkRefusal::No` votes no with ours; `Invalid` is a 422.
    async fn work(&self, client: &Client, payload: &Value) -> Result<(), WorkRefusal> {
        let change =
            Change::deserialize(payload).map_err(|e| WorkRefusal::Invalid(e.to_string()))?;
        let row = client
            .query_opt(
                "UPDATE accounts SET balance = balance + $2 WHERE id = $1 RETURNING balance",
                &[&change.account, &change.delta],
            )
            .await?;
        match row.map(|row| row.get::<_, i64>(0)) {
            None => Err(WorkRefusal::No(format!("no account {}", change.account))),
            Some(balance) if balance < 0 => Err(WorkRefusal::No(format!(
                "account {} would go to {balance}",
                change.account
            ))),
            Some(_) => Ok(()),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: pg_accounts POSTGRES_URL LISTEN_ADDR")?;
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:7201".into());
    let mut config = PgConfig::new(url, "accounts");
    config.coordinator_urls = vec!["http://127.0.0.1:7000".into()];
    // Refuses max_prepared_transactions = 0, creates the bookkeeping tables.
    let participant = PgParticipant::start(config, Accounts).await?;
    // In-doubt transactions left by an earlier run are asked about at once.
    let _resolver = participant.spawn_resolver();
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("accounts participant on http://{listen}");
    axum::serve(listener, finish(participant.router())).await?;
    Ok(())
}
