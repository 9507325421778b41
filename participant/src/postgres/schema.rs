//! The participant's bookkeeping in the participant's own database, and the checks made before
//! serving: the setting PREPARE TRANSACTION needs and the tables.
//!
//! Small tables in schema `twopc` (created if absent):
//! - `twopc.pg_outcomes(gid, outcome)`, one row per attempt under its gid without the txid
//!   (`super::gid`): `committed` rows are inserted *inside* the prepared transaction, so one
//!   exists exactly when that transaction committed; `aborted` rows are tombstones left by
//!   aborts. This is the durable record that tells "already committed" from "never prepared"
//!   when `COMMIT PREPARED` finds no gid.
//! - `twopc.pg_intents(gid, txid, ...)`: only for a gid that cannot carry its txid (too long),
//!   and those an earlier version prepared. Written (autocommit) before `BEGIN`, it carries what
//!   a decision query needs (the client's txid, the epoch, incarnation and position). The
//!   prepared transaction deletes it, so it stays visible while prepared and goes when the
//!   transaction commits; after a rollback the participant drops it.
//! - `twopc.pg_epochs(coordinator_id, epoch)`: the highest epoch seen per coordinator (fencing).
//!
//! And the outbox (`super::outbox`, `super::write`), each row owned by one participant name:
//! - `twopc.pg_outbox`: one row per intent, written by the same local transaction as the
//!   statement that led to it.
//! - `twopc.pg_outbox_aggregates(participant, aggregate, last_seq)`: the per-aggregate counter.
//!   A write bumps it in its own transaction, so the row lock serialises the writers of one
//!   aggregate and seq follows their commit order; it is never pruned, so a seq is never reused.
//! - `twopc.pg_ops(participant, op_id, request, answer)`: a local write's first answer, which a
//!   repeat of its op id gets (a stale-token refusal too: it is kept, so a repeat is refused
//!   again even after an operator lowered the highest token).
//!
//! And the fences (`super::fence`):
//! - `twopc.pg_fences(participant, resource, highest, updated_at)`: the highest token accepted
//!   per fenced resource, raised by the write it guards, in its transaction; never pruned.
//! - `twopc.pg_fence_resets(...)`: operators' resets, who, why, from, to and when.

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
    epoch bigint NOT NULL);
CREATE TABLE IF NOT EXISTS twopc.pg_outbox (
    participant text NOT NULL,
    event_id text NOT NULL,
    position bigint GENERATED ALWAYS AS IDENTITY,
    aggregate text NOT NULL,
    seq bigint NOT NULL,
    target text NOT NULL,
    type text NOT NULL,
    body jsonb NOT NULL,
    state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'failed', 'abandoned')),
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    op_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_attempt_at timestamptz,
    delivered_at timestamptz,
    settled_at timestamptz,
    answer jsonb,
    marks jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (participant, event_id),
    UNIQUE (participant, aggregate, seq));
CREATE INDEX IF NOT EXISTS pg_outbox_open ON twopc.pg_outbox (participant, position)
    WHERE state IN ('pending', 'failed');
CREATE TABLE IF NOT EXISTS twopc.pg_outbox_aggregates (
    participant text NOT NULL,
    aggregate text NOT NULL,
    last_seq bigint NOT NULL,
    PRIMARY KEY (participant, aggregate));
CREATE TABLE IF NOT EXISTS twopc.pg_ops (
    participant text NOT NULL,
    op_id text NOT NULL,
    request text NOT NULL,
    answer text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (participant, op_id));
CREATE TABLE IF NOT EXISTS twopc.pg_fences (
    participant text NOT NULL,
    resource text NOT NULL,
    highest numeric(20, 0) NOT NULL CHECK (highest >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (participant, resource));
CREATE INDEX IF NOT EXISTS pg_fences_highest ON twopc.pg_fences (participant, highest);
CREATE TABLE IF NOT EXISTS twopc.pg_fence_resets (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    participant text NOT NULL,
    resource text NOT NULL,
    from_token numeric(20, 0) NOT NULL,
    to_token numeric(20, 0) NOT NULL,
    operator text NOT NULL,
    reason text NOT NULL,
    at timestamptz NOT NULL DEFAULT now());";

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
