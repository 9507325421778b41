//! The participant's bookkeeping in the participant's own database, and the checks made before
//! serving: the setting PREPARE TRANSACTION needs and the tables.
//!
//! Three small tables in schema `twopc` (created if absent):
//! - `twopc.pg_outcomes(gid, outcome)`: `committed` rows are inserted *inside* the prepared
//!   transaction, so one exists exactly when that transaction committed; `aborted` rows are
//!   tombstones for aborts that arrived before any prepare. This is the durable record that
//!   tells "already committed" from "never prepared" when `COMMIT PREPARED` finds no gid.
//! - `twopc.pg_intents(gid, txid, ...)`: written (autocommit) before `BEGIN`, it carries what a
//!   decision query needs (the client's txid, the epoch, incarnation and position), which does
//!   not fit in a 199-byte gid. The prepared transaction deletes it, so it stays visible while
//!   prepared and goes when the transaction commits; after a rollback the participant drops it.
//! - `twopc.pg_epochs(coordinator_id, epoch)`: the highest epoch seen per coordinator (fencing).

use tokio_postgres::Client;

use super::error::PgError;

/// Creates the bookkeeping tables if absent (idempotent; safe with several participants on one
/// database, each with its own gid prefix).
pub const CREATE_SQL: &str = "\
CREATE SCHEMA IF NOT EXISTS twopc;
CREATE TABLE IF NOT EXISTS twopc.pg_outcomes (
    gid text PRIMARY KEY,
    outcome text NOT NULL CHECK (outcome IN ('committed', 'aborted')),
    recorded_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS twopc.pg_intents (
    gid text PRIMARY KEY,
    txid text NOT NULL,
    coordinator_id text NOT NULL,
    epoch bigint NOT NULL,
    incarnation text NOT NULL,
    position bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS twopc.pg_epochs (
    coordinator_id text PRIMARY KEY,
    epoch bigint NOT NULL);";

/// Refuses a server with PREPARE TRANSACTION disabled, then creates the tables.
pub async fn check_and_create(client: &Client) -> Result<i64, PgError> {
    let row = client
        .query_one(
            "SELECT current_setting('max_prepared_transactions')::bigint",
            &[],
        )
        .await
        .map_err(|e| PgError::db("reading max_prepared_transactions", e))?;
    let max_prepared: i64 = row.get(0);
    if max_prepared == 0 {
        return Err(PgError::PreparedTransactionsDisabled);
    }
    // Serialise concurrent first starts: CREATE ... IF NOT EXISTS can still race on catalogs.
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(727063); {CREATE_SQL} COMMIT;"
        ))
        .await
        .map_err(|e| PgError::db("creating the twopc bookkeeping tables", e))?;
    Ok(max_prepared)
}
