//! The PostgreSQL backend: a participant whose resource is a PostgreSQL database, through
//! PostgreSQL's own two-phase commit (`PREPARE TRANSACTION`, `COMMIT PREPARED`, `ROLLBACK
//! PREPARED`, `pg_prepared_xacts`). See docs/postgres.md.
//!
//! It owns the mapping of the protocol onto those statements, the gids, the small bookkeeping
//! tables in schema `twopc`, and the resolution of in-doubt prepared transactions through the
//! coordinator. The prepared state lives in PostgreSQL's WAL, so this backend keeps no log of
//! its own. It must never commit or roll back a prepared transaction on its own judgement (only
//! on a decision from the coordinator that prepared it), never vote yes before `PREPARE
//! TRANSACTION` returned, and never run SQL a request handed it.

pub mod backend;
pub mod cli;
pub mod config;
mod decide;
pub mod error;
pub mod gid;
mod http;
pub mod in_doubt;
mod metrics;
mod phase_two;
mod pipeline;
pub mod policy;
mod pool;
mod schema;
pub mod statements;
pub mod work;

pub use backend::{PgParticipant, PgRequestError};
pub use config::PgConfig;
pub use error::PgError;
pub use gid::{Gid, GidPrefix};
pub use in_doubt::{PgPreparedEntry, PgPreparedList};
pub use pool::redact;
pub use schema::CREATE_SQL;
pub use statements::{StatementSpec, Statements};
pub use work::{PgWork, WorkRefusal};
