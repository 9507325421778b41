//! `twopc participant`: the process, on the backend `--backend` names: the reference key-value
//! store (`crate::kv::cli`) or a PostgreSQL database (`crate::postgres::cli`). It stands above
//! both backends, which stand above the flags they read (`crate::cli`).

use std::process::ExitCode;

use crate::cli::{Args, Backend};

/// Runs the service; returns the process exit code (0 clean shutdown, 1 runtime failure,
/// 2 bad configuration, 3 data directory locked, 4 corrupt log).
pub fn main(args: Args) -> ExitCode {
    match args.backend {
        Backend::Kv => crate::kv::cli::main(args),
        Backend::Postgres => crate::postgres::cli::main(&args),
    }
}
