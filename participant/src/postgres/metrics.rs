//! The PostgreSQL participant's counters, read by `/metrics` (`super::http`).

use std::sync::atomic::AtomicU64;

use net::exposition::Exposition;

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
    /// Intents recorded by local writes, and relays' delivered reports applied.
    pub(crate) outbox_intents_written: AtomicU64,
    pub(crate) outbox_delivered: AtomicU64,
    /// Relays' attempt reports applied (an attempt without a delivery).
    pub(crate) outbox_attempts_failed: AtomicU64,
}

/// Counts of the open intents, read from `twopc.pg_outbox` (the listing and `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OpenCounts {
    pub(crate) pending: u64,
    pub(crate) failed: u64,
    pub(crate) oldest_pending_age_ms: Option<u64>,
}

/// The outbox's families, the same names as the KV participant's, so one alert and one
/// dashboard serve both backends: the counters since start, and the open counts one scrape read
/// from `twopc.pg_outbox` (`None`: PostgreSQL did not answer; zeros are shown).
pub(crate) fn outbox_families(out: &mut Exposition, m: &PgMetrics, open: Option<OpenCounts>) {
    out.counter_of(
        "twopc_participant_outbox_intents_written_total",
        "Intents recorded in the outbox by writes",
        &m.outbox_intents_written,
    );
    out.counter_of(
        "twopc_participant_outbox_delivered_total",
        "Intents reported delivered by a relay",
        &m.outbox_delivered,
    );
    out.counter_of(
        "twopc_participant_outbox_attempts_failed_total",
        "Delivery attempts reported without a delivery (outcome unknown, or refused)",
        &m.outbox_attempts_failed,
    );
    let open = open.unwrap_or_default();
    out.gauge(
        "twopc_participant_outbox_pending",
        "Intents written and not yet known delivered",
        open.pending,
    );
    out.gauge(
        "twopc_participant_outbox_failed",
        "Intents a receiver refused for good; each holds back its aggregate until an operator \
         retries or marks it",
        open.failed,
    );
    out.gauge_f64(
        "twopc_participant_outbox_oldest_pending_age_seconds",
        "Age of the oldest pending intent (0 when none)",
        open.oldest_pending_age_ms.unwrap_or(0) as f64 / 1000.0,
    );
}
