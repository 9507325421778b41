//! The PostgreSQL participant's counters, read by `/metrics` (`super::http`).

use std::sync::atomic::AtomicU64;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct PgMetrics {
    pub(crate) votes_yes: AtomicU64,
    pub(crate) votes_no: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) aborts: AtomicU64,
    pub(crate) decision_queries: AtomicU64,
    pub(crate) resolved_by_query: AtomicU64,
    /// Round trips that carried `COMMIT PREPARED` / `ROLLBACK PREPARED` statements, and those
    /// statements: their ratio is the phase-two batch size.
    pub(crate) phase_two_round_trips: AtomicU64,
    pub(crate) phase_two_statements: AtomicU64,
    /// Batched phase messages received, and the items they carried.
    pub(crate) batches: AtomicU64,
    pub(crate) batched_items: AtomicU64,
}
