//! `twopc participant`: a participant as a process, on the backend `--backend` names: the
//! reference key-value store (`crate::kv::cli`) or a PostgreSQL database
//! (`crate::postgres::cli`).
//!
//! - [`args`]: every flag, both backends', below the backends that read them;
//! - `shutdown`: the signal both backends serve until.

pub mod args;
pub(crate) mod shutdown;

use std::process::ExitCode;

pub use args::{
    Args, AuthArgs, Backend, COMMIT_GROUP_DELAY_US_DEFAULT, COMMIT_GROUP_DELAY_US_MAX, ServeArgs,
    TlsArgs,
};

/// Runs the service; returns the process exit code (0 clean shutdown, 1 runtime failure,
/// 2 bad configuration, 3 data directory locked, 4 corrupt log).
pub fn main(args: Args) -> ExitCode {
    match args.backend {
        Backend::Kv => crate::kv::cli::main(args),
        Backend::Postgres => crate::postgres::cli::main(&args),
    }
}
