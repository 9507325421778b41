//! The statements a prepare sends besides the service's work (`super::backend`), and how
//! their failures read: the outcome row, the intent row where the gid cannot carry the txid
//! (`super::gid`), and the look at what this database holds of an attempt already known.

use tokio_postgres::types::Type;

use super::error::{PgError, describe};
use super::gid::Gid;
use super::policy::Recorded;
use super::work::WorkRefusal;

/// The parameters of [`INTENT_SQL`]: gid, txid, coordinator id, epoch, incarnation, position.
pub(super) const INTENT_TYPES: [Type; 6] = [
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
];

/// The intent row's removal, inside the transaction, so that it is gone exactly when the
/// transaction commits.
pub(super) const FORGET_SQL: &str = "DELETE FROM twopc.pg_intents WHERE gid = $1";

/// The intent row, committed on its own before the transaction begins: a decision query needs
/// it while the transaction is prepared. None for a gid decided already (an outcome row) or
/// prepared in this database now: that transaction has deleted its intent row, uncommitted,
/// and an insert meeting the row would wait for the transaction to end (a repeated prepare
/// would hang until the decision). An intent left by a prepare that ended early stays as it is.
pub(super) const INTENT_SQL: &str = "INSERT INTO twopc.pg_intents \
    (gid, txid, coordinator_id, epoch, incarnation, position) \
    SELECT $1, $2, $3, $4, $5, $6 \
    WHERE NOT EXISTS (SELECT 1 FROM twopc.pg_outcomes WHERE gid = $1) \
    AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts \
        WHERE gid = $1 AND database = current_database()) \
    ON CONFLICT (gid) DO NOTHING";

/// [`INTENT_SQL`] for a gid not held (`super::held`): not prepared in this database now, so
/// nothing to look for in `pg_prepared_xacts`.
pub(super) const FIRST_INTENT_SQL: &str = "INSERT INTO twopc.pg_intents \
    (gid, txid, coordinator_id, epoch, incarnation, position) \
    SELECT $1, $2, $3, $4, $5, $6 \
    WHERE NOT EXISTS (SELECT 1 FROM twopc.pg_outcomes WHERE gid = $1) \
    ON CONFLICT (gid) DO NOTHING";

/// [`OUTCOME_SQL`] for a gid not held (`super::held`): a unique violation still finds one
/// decided already. Its second parameter (the gid prepared under) is declared and unused: both
/// texts take the same parameters.
pub(super) const FIRST_OUTCOME_SQL: &str = "INSERT INTO twopc.pg_outcomes (gid, outcome) \
    VALUES ($1, 'committed')";

/// The `committed` outcome row, inside the transaction (it exists exactly when the transaction
/// committed), under the attempt's outcome key ($1; the gid it is prepared under is $2). It
/// fails at once for an attempt already known: a unique violation when an outcome row exists,
/// and NULL (a not-null violation) when the gid is prepared in this database now -- checked
/// first because that transaction's own uncommitted row would make this insert wait for it (up
/// to `lock_timeout`) instead of failing. Either way the work sent after it fails at once too,
/// and the records decide the vote.
pub(super) const OUTCOME_SQL: &str = "INSERT INTO twopc.pg_outcomes (gid, outcome) \
    VALUES ($1, CASE WHEN EXISTS (SELECT 1 FROM pg_prepared_xacts \
        WHERE gid = $2 AND database = current_database()) THEN NULL ELSE 'committed' END)";

/// What this database holds of an attempt: its outcome row (under `key`), and whether `gid` is
/// prepared here now (a gid prepared in another database of the server is not ours).
pub(super) async fn lookup(
    client: &tokio_postgres::Client,
    gid: &Gid,
    key: &Gid,
) -> Result<(Option<Recorded>, bool), PgError> {
    let rows = client
        .query_typed(
            "SELECT outcome FROM twopc.pg_outcomes WHERE gid = $2 \
             UNION ALL SELECT 'prepared' FROM pg_prepared_xacts \
             WHERE gid = $1 AND database = current_database()",
            &[(&gid.as_str(), Type::TEXT), (&key.as_str(), Type::TEXT)],
        )
        .await
        .map_err(|e| PgError::db("looking up the attempt", e))?;
    let mut recorded = None;
    let mut prepared_now = false;
    for row in &rows {
        let what: String = row.get(0);
        prepared_now |= what == "prepared";
        recorded = recorded.or(Recorded::parse(&what));
    }
    Ok((recorded, prepared_now))
}

/// Why `PREPARE TRANSACTION` (or the outcome row before it) failed, as a no vote.
pub(super) fn prepare_refusal(error: &tokio_postgres::Error) -> WorkRefusal {
    let message = describe(error);
    let full = error.as_db_error().is_some_and(|db| {
        db.message()
            .contains("maximum number of prepared transactions reached")
    });
    if full {
        WorkRefusal::No(format!(
            "prepared_transactions_full: {message}; raise max_prepared_transactions (needs a \
             PostgreSQL restart) or resolve old prepared transactions"
        ))
    } else {
        // A unique violation here is the service's own (a deferred constraint checked by
        // PREPARE TRANSACTION): the outcome row's is read as "known already" before this.
        WorkRefusal::No(message)
    }
}
