//! The twopc coordinator: a pure two-phase-commit engine, the tokio runtime that drives it
//! (log, HTTP client, timers, recovery) and the axum API that clients and participants call.
//!
//! It owns the coordinator's data directory (`<data-dir>/LOCK`, `<data-dir>/wal/`) and the
//! decision for every transaction it accepted. It must never tell anyone an outcome before the
//! decision record is durable, never call a URL that a request supplied (participants come from
//! the configuration only), never decide commit without every participant's yes, and never give
//! up delivering a decision.
//!
//! The map, floor by floor; a module imports only from floors below its own (or, within a
//! floor, from one listed before it):
//! 1. `digest`, `query_limit` (the decision-query budget), `saga_facts` (what a saga's log
//!    proves about each step), `leases` (the pure lease service and its records),
//!    `http_client`.
//! 2. `records`: what the log and its checkpoint hold. The ground the engines stand on; it
//!    imports no engine.
//! 3. The pure engines: `engine` (two-phase commit), then `saga` (planner and state machine,
//!    borrowing the engine's waiter ids and backoff); `outcomes::store` (the outcome index).
//! 4. `config` (the checked configuration, on the engine's bounds and the query budget) and
//!    `metrics`.
//! 5. `runtime`: the tokio shell that drives the engines, the log and the participants; the
//!    outcome archiver (`runtime::archiver`) is one of its tasks.
//! 6. `api`: the HTTP routes, on the runtime.
//! 7. `server` and `cli`: the process.
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
pub mod clock;
pub mod config;
pub mod digest;
pub mod engine;
pub mod ha;
pub mod http_client;
pub mod leases;
pub mod metrics;
pub mod outcomes;
pub mod query_limit;
pub mod records;
pub mod runtime;
pub mod saga;
pub mod saga_facts;
pub mod server;
