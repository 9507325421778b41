//! The PostgreSQL backend: a participant whose resource is a PostgreSQL database, through
//! PostgreSQL's own two-phase commit (`PREPARE TRANSACTION`, `COMMIT PREPARED`, `ROLLBACK
//! PREPARED`, `pg_prepared_xacts`). See docs/postgres.md.
//!
//! It owns the mapping of the protocol onto those statements, the gids, the small bookkeeping
//! tables in schema `twopc`, and the resolution of in-doubt prepared transactions through the
//! coordinator. The prepared state lives in PostgreSQL's WAL, so this backend keeps no log of
//! its own. It also owns the outbox (issue 29): `write` (a local write outside 2PC, one named
//! statement and its next intents in one local transaction, guarded by the statement's row
//! count), `outbox` (the `twopc.pg_outbox` table's listing, reports, operator actions and
//! retention), `outbox_http` (their routes, the same as the KV participant's) and `returned`
//! (a statement's returned rows as JSON); and the fences of those writes (issue 29): `fence`
//! (the highest token per resource in `twopc.pg_fences`, raised by the write it guards, and
//! the operator's audited reset) and `fence_http` (`/v1/fences/{resource}`, as the KV
//! participant's); and `held` (the gids this process may hold prepared, whose repeated prepare
//! looks at `pg_prepared_xacts` first, which a first prepare skips). It must never commit or roll back a prepared transaction on its own judgement (only
//! on a decision from the coordinator that prepared it), never vote yes before `PREPARE
//! TRANSACTION` returned, and never run SQL a request handed it.

pub mod backend;
pub mod cli;
pub mod config;
mod decide;
pub mod error;
pub mod fence;
mod fence_http;
pub mod gid;
mod held;
mod http;
pub mod in_doubt;
mod metrics;
pub mod outbox;
mod outbox_http;
mod phase_two;
mod pipeline;
pub mod policy;
mod pool;
mod prepare_sql;
mod returned;
mod schema;
pub mod statements;
pub mod work;
pub mod write;

pub use backend::{PgParticipant, PgRequestError};
pub use config::PgConfig;
pub use error::PgError;
pub use gid::{Gid, GidPrefix};
pub use in_doubt::{PgPreparedEntry, PgPreparedList};
pub use outbox::{Action, OutboxError};
pub use pool::redact;
pub use schema::CREATE_SQL;
pub use statements::{StatementSpec, Statements};
pub use work::{PgWork, Ran, RunError, WorkRefusal};
pub use write::WriteError;
