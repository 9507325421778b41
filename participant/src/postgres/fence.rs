//! Fencing tokens at the PostgreSQL participant (docs/postgres.md, "Fences"): the highest token
//! accepted per fenced resource, in `twopc.pg_fences`, raised by the same local transaction as
//! the write it guards, and the operator's audited reset in `twopc.pg_fence_resets`.
//!
//! The library's policy (`crate::fence::policy`: the lease service's proof with a fence key,
//! else a bound on jumps) judges a token first; the row then decides: a write raises the
//! resource's row (`ON CONFLICT ... DO UPDATE ... WHERE highest <= token`) before its statement
//! runs, and holds the row lock until its `COMMIT`, so the writes of one resource are
//! serialised and a lower token never commits after a higher one. No row back means a higher
//! token committed: the write is stale. This file must never lower a highest token except by
//! an operator's reset, checked compare-and-set on what the operator read.

use protocol::lease::{FenceClaim, FenceReset, FenceStatus};
use tokio_postgres::types::{ToSql, Type};

use super::backend::PgParticipant;
use super::error::describe;
use super::pool::Side;
use super::work::PgWork;
use crate::fence::{FenceRefusal, FenceResetRequest, ResetRefused, StaleToken};

/// Raises the resource's highest token to the claim's unless a higher one is there, and reads
/// the highest token of every resource of this participant as it stood before (the ceiling
/// the jump bound is measured from). Tokens are `numeric` (a token is a u64; bigint stops at
/// 2^63-1), passed and read as text.
const RAISE_SQL: &str = "WITH ceiling AS (\
      SELECT coalesce(max(highest), 0)::text AS c FROM twopc.pg_fences WHERE participant = $1), \
    raised AS (\
      INSERT INTO twopc.pg_fences (participant, resource, highest) \
      VALUES ($1, $2, $3::text::numeric) \
      ON CONFLICT (participant, resource) DO UPDATE \
      SET highest = EXCLUDED.highest, updated_at = now() \
      WHERE twopc.pg_fences.highest <= EXCLUDED.highest RETURNING 1) \
    SELECT (SELECT c FROM ceiling), (SELECT count(*) FROM raised)";

/// The committed highest (a new statement: under READ COMMITTED it sees the write that made
/// ours stale).
const HIGHEST_SQL: &str = "SELECT highest::text, \
    (extract(epoch FROM updated_at) * 1000)::bigint \
    FROM twopc.pg_fences WHERE participant = $1 AND resource = $2";

/// The fence's part of a write, on the write's open transaction.
pub(super) enum Raised {
    /// The highest token is now the claim's (until the transaction ends).
    Raised,
    /// A higher token is accepted: nothing may be written.
    Stale(StaleToken),
}

/// Why the fence could not be checked: the database's error, for `WriteError::Database`.
pub(super) struct FenceDbError(pub String);

fn token_of(text: &str) -> Result<u64, FenceDbError> {
    text.parse()
        .map_err(|e| FenceDbError(format!("a stored token {text:?} is not a u64: {e}")))
}

/// Starts the fence statement on `client` (pipelined behind `BEGIN` and the op id's claim, so
/// a fenced write costs no extra round trip when its token holds).
pub(super) async fn raise(
    client: &tokio_postgres::Client,
    participant: &str,
    claim: &FenceClaim,
) -> Result<(u64, bool), FenceDbError> {
    let token = claim.token.to_string();
    let (resource, token) = (claim.resource.as_str(), token.as_str());
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&participant, Type::TEXT),
        (&resource, Type::TEXT),
        (&token, Type::TEXT),
    ];
    let row = client
        .query_typed(RAISE_SQL, &params)
        .await
        .map_err(|e| FenceDbError(format!("raising the fence: {}", describe(&e))))?;
    let row = row
        .first()
        .ok_or_else(|| FenceDbError("the fence statement returned no row".into()))?;
    let ceiling: String = row.get(0);
    let raised: i64 = row.get(1);
    Ok((token_of(&ceiling)?, raised == 1))
}

/// Judges what [`raise`] did: the policy on the ceiling first (a token the participant cannot
/// trust is refused, whatever the row says), then the row.
pub(super) async fn judge(
    client: &tokio_postgres::Client,
    participant: &str,
    policy: &crate::fence::FencePolicy,
    claim: &FenceClaim,
    (ceiling, raised): (u64, bool),
) -> Result<Result<Raised, FenceRefusal>, FenceDbError> {
    if let Err(refusal) = policy.admits(claim, ceiling) {
        return Ok(Err(refusal));
    }
    if raised {
        return Ok(Ok(Raised::Raised));
    }
    let highest = read_highest(client, participant, &claim.resource)
        .await?
        .map_or(claim.token, |(highest, _)| highest);
    Ok(Ok(Raised::Stale(StaleToken {
        resource: claim.resource.clone(),
        token: claim.token,
        highest,
    })))
}

/// The resource's highest token and when it was last raised (unix ms, PostgreSQL's clock).
async fn read_highest(
    client: &tokio_postgres::Client,
    participant: &str,
    resource: &str,
) -> Result<Option<(u64, u64)>, FenceDbError> {
    let params: [(&(dyn ToSql + Sync), Type); 2] =
        [(&participant, Type::TEXT), (&resource, Type::TEXT)];
    let rows = client
        .query_typed(HIGHEST_SQL, &params)
        .await
        .map_err(|e| FenceDbError(format!("reading the fence: {}", describe(&e))))?;
    match rows.first() {
        None => Ok(None),
        Some(row) => {
            let highest: String = row.get(0);
            let at: i64 = row.get(1);
            Ok(Some((token_of(&highest)?, u64::try_from(at).unwrap_or(0))))
        }
    }
}

/// Why an operator's read or reset of a fence failed.
#[derive(Debug, thiserror::Error)]
pub enum FenceOpError {
    /// 404 `not_found`: no token was ever accepted for the resource here.
    #[error("no token was ever accepted for {0:?} here")]
    NotFound(String),
    /// 409 `reset_refused`.
    #[error(transparent)]
    Refused(ResetRefused),
    /// 503 `not_ready`.
    #[error("PostgreSQL: {0}")]
    Database(String),
}

impl From<FenceDbError> for FenceOpError {
    fn from(error: FenceDbError) -> Self {
        FenceOpError::Database(error.0)
    }
}

const RESETS_SQL: &str = "SELECT from_token::text, to_token::text, operator, reason, \
    (extract(epoch FROM at) * 1000)::bigint FROM twopc.pg_fence_resets \
    WHERE participant = $1 AND resource = $2 ORDER BY id";

/// Lowers the highest token only if it still is what the operator read (the row lock of the
/// `UPDATE` orders it with the writes).
const RESET_SQL: &str = "UPDATE twopc.pg_fences SET highest = $4::text::numeric, \
    updated_at = now() WHERE participant = $1 AND resource = $2 \
    AND highest = $3::text::numeric RETURNING 1";

const AUDIT_SQL: &str = "INSERT INTO twopc.pg_fence_resets \
    (participant, resource, from_token, to_token, operator, reason) \
    VALUES ($1, $2, $3::text::numeric, $4::text::numeric, $5, $6) \
    RETURNING (extract(epoch FROM at) * 1000)::bigint";

impl<W: PgWork> PgParticipant<W> {
    /// `GET /v1/fences/{resource}`: the highest token and the resets of one resource.
    pub async fn fence_status(&self, resource: &str) -> Result<FenceStatus, FenceOpError> {
        let session = self
            .inner
            .pool
            .get(Side::Decide)
            .await
            .map_err(|e| FenceOpError::Database(e.to_string()))?;
        let client = session.client();
        let name = self.inner.config.name.as_str();
        let highest = read_highest(client, name, resource).await?;
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&name, Type::TEXT), (&resource, Type::TEXT)];
        let rows = client
            .query_typed(RESETS_SQL, &params)
            .await
            .map_err(|e| FenceOpError::Database(format!("reading resets: {}", describe(&e))))?;
        let mut resets = Vec::with_capacity(rows.len());
        for row in &rows {
            let (from, to): (String, String) = (row.get(0), row.get(1));
            let at: i64 = row.get(4);
            resets.push(FenceReset {
                resource: resource.to_string(),
                from: token_of(&from)?,
                to: token_of(&to)?,
                operator: row.get(2),
                reason: row.get(3),
                at_ms: u64::try_from(at).unwrap_or(0),
            });
        }
        let Some((highest, written_at_ms)) = highest else {
            return Err(FenceOpError::NotFound(resource.to_string()));
        };
        Ok(FenceStatus {
            resource: resource.to_string(),
            highest: Some(highest),
            from_floor: false,
            written_at_ms: Some(written_at_ms),
            resets,
        })
    }

    /// `POST /v1/fences/{resource}/reset`: the reset and its audit row in one transaction,
    /// answered after its `COMMIT` returned.
    pub async fn reset_fence(
        &self,
        request: FenceResetRequest,
    ) -> Result<FenceReset, FenceOpError> {
        if request.to >= request.from {
            return Err(FenceOpError::Refused(ResetRefused::NotLower {
                from: request.from,
                to: request.to,
            }));
        }
        let mut session = self
            .inner
            .pool
            .get(Side::Decide)
            .await
            .map_err(|e| FenceOpError::Database(e.to_string()))?;
        session.busy();
        let name = self.inner.config.name.as_str();
        let db = |context: &str, e: &tokio_postgres::Error| {
            FenceOpError::Database(format!("{context}: {}", describe(e)))
        };
        let (from, to) = (request.from.to_string(), request.to.to_string());
        let (resource, from, to) = (request.resource.as_str(), from.as_str(), to.as_str());
        let (operator, reason) = (request.operator.as_str(), request.reason.as_str());
        let outcome = async {
            let client = session.client();
            client
                .batch_execute("BEGIN; SET LOCAL synchronous_commit = on")
                .await
                .map_err(|e| db("beginning the reset", &e))?;
            let cas: [(&(dyn ToSql + Sync), Type); 4] = [
                (&name, Type::TEXT),
                (&resource, Type::TEXT),
                (&from, Type::TEXT),
                (&to, Type::TEXT),
            ];
            let lowered = client
                .query_typed(RESET_SQL, &cas)
                .await
                .map_err(|e| db("resetting the fence", &e))?;
            if lowered.is_empty() {
                let refused = match read_highest(client, name, resource).await? {
                    None => ResetRefused::Unknown {
                        resource: resource.to_string(),
                    },
                    Some((highest, _)) => ResetRefused::Changed {
                        resource: resource.to_string(),
                        expected: request.from,
                        highest,
                    },
                };
                return Err(FenceOpError::Refused(refused));
            }
            let audit: [(&(dyn ToSql + Sync), Type); 6] = [
                (&name, Type::TEXT),
                (&resource, Type::TEXT),
                (&from, Type::TEXT),
                (&to, Type::TEXT),
                (&operator, Type::TEXT),
                (&reason, Type::TEXT),
            ];
            let at: i64 = client
                .query_typed(AUDIT_SQL, &audit)
                .await
                .map_err(|e| db("auditing the reset", &e))?
                .first()
                .map(|row| row.get(0))
                .unwrap_or(0);
            client
                .batch_execute("COMMIT")
                .await
                .map_err(|e| db("committing the reset (repeat it after a read)", &e))?;
            Ok(u64::try_from(at).unwrap_or(0))
        }
        .await;
        match outcome {
            Ok(at_ms) => {
                session.idle();
                tracing::warn!(resource, from, to, operator, reason, "fence reset");
                Ok(FenceReset {
                    resource: request.resource,
                    from: request.from,
                    to: request.to,
                    operator: request.operator,
                    reason: request.reason,
                    at_ms,
                })
            }
            Err(error) => {
                if session.client().batch_execute("ROLLBACK").await.is_ok() {
                    session.idle();
                } else {
                    session.discard();
                }
                Err(error)
            }
        }
    }
}
