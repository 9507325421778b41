//! What `twopc participant` reads and waits for, below the backends that serve it (the
//! reference key-value store, `crate::kv::cli`, and PostgreSQL, `crate::postgres::cli`) and the
//! command that picks one (`crate::command`).
//!
//! - [`args`]: every flag, both backends';
//! - `shutdown`: the signal both backends serve until.

pub mod args;
pub(crate) mod shutdown;

pub use args::{
    Args, AuthArgs, Backend, COMMIT_GROUP_DELAY_US_DEFAULT, COMMIT_GROUP_DELAY_US_MAX, ServeArgs,
    TlsArgs,
};
