//! Sagas (issue 13): a second transaction kind on the same log. Steps run in order at
//! participants; on a failure or a timeout the steps that succeeded are compensated in reverse.
//!
//! `planner` owns the rules (pure); it must never do I/O.
pub mod planner;
