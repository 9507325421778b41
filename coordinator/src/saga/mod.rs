//! Sagas (issue 13): a second transaction kind on the same log. Steps run in order at
//! participants; on a failure or a timeout the steps that succeeded are compensated in reverse.
//!
//! What the log proves about each step is `crate::saga_facts` (the checkpoint keeps it, so it
//! sits below `records`, outside this folder); `planner` owns the rules and `engine` the state
//! machine (`step(event) -> Vec<SagaCommand>`); all are pure and must never do I/O. The async shell that
//! runs the engine lives in `runtime::sagas`, the HTTP routes in `api::sagas`.
pub mod engine;
pub mod planner;

#[cfg(test)]
mod engine_tests;
