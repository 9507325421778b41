//! Sagas (issue 13): a second transaction kind on the same log. Steps run in order at
//! participants; on a failure or a timeout the steps that succeeded are compensated in reverse.
//!
//! `facts` holds what the log proves about each step (the checkpoint keeps it, so it sits below
//! `records`), `planner` owns the rules and `engine` the state machine
//! (`step(event) -> Vec<SagaCommand>`); all are pure and must never do I/O. The async shell that
//! runs the engine lives in `runtime::sagas`, the HTTP routes in `api::sagas`.
pub mod engine;
pub mod facts;
pub mod planner;

#[cfg(test)]
mod engine_tests;
