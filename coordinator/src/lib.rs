//! The twopc coordinator: a pure two-phase-commit engine, the tokio runtime that drives it
//! (log, HTTP client, timers, recovery) and the axum API that clients and participants call.
//!
//! It owns the coordinator's data directory (`<data-dir>/LOCK`, `<data-dir>/wal/`) and the
//! decision for every transaction it accepted. It must never tell anyone an outcome before the
//! decision record is durable, never call a URL that a request supplied (participants come from
//! the configuration only), never decide commit without every participant's yes, and never give
//! up delivering a decision.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

/// A named crash point: with the `failpoints` feature and `FAILPOINTS=<name>=return`, the
/// process aborts here (no cleanup, like a SIGKILL). Without the feature it is nothing.
macro_rules! crash_point {
    ($name:literal) => {
        fail::fail_point!($name, |_| { std::process::abort() })
    };
}

pub mod api;
pub mod cli;
pub mod config;
pub mod digest;
pub mod engine;
pub mod http_client;
pub mod leases;
pub mod metrics;
pub mod outcomes;
pub mod query_limit;
pub mod records;
pub mod runtime;
pub mod saga;
pub mod server;
