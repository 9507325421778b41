//! What a participant counts, and its `/metrics` families: each one's exported name, type,
//! labels and help, written by `net::exposition` (the Prometheus text format; docs/operations.md,
//! "The metrics text"). docs/alerts.yml and dashboards query these names: a rename breaks them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use net::exposition::{Exposition, Histogram};

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    votes_yes: AtomicU64,
    votes_no: AtomicU64,
    commits: AtomicU64,
    aborts: AtomicU64,
    rejected: AtomicU64,
    decision_queries: AtomicU64,
    decision_query_failures: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_failures: AtomicU64,
    lock_waits: AtomicU64,
    lock_timeouts: AtomicU64,
    lock_conflicts: AtomicU64,
    lock_wait_seconds: Histogram,
    batches: AtomicU64,
    batched_items: AtomicU64,
}

fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What `/metrics` reads from the engine, the fence table and the log at the scrape.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    pub prepared: usize,
    pub locks: usize,
    pub tombstones: usize,
    pub lock_waiters: usize,
    pub log_failed: bool,
    /// How long the oldest prepared attempt has held its locks, in ms (0: none prepared).
    pub oldest_prepared_age_ms: u64,
    pub fences: FenceNumbers,
    pub outbox: OutboxNumbers,
    pub wal: wal::WalStats,
}

/// The outbox's counters (kept by the table, exact across restarts) and its open intents.
#[derive(Debug, Default)]
pub(crate) struct OutboxNumbers {
    pub written: u64,
    pub delivered: u64,
    pub attempts_failed: u64,
    pub pending: u64,
    pub failed: u64,
    /// How long the oldest pending intent has waited, in ms (0: none pending).
    pub oldest_pending_age_ms: u64,
}

/// The fence table's size, floor and what retention took (docs/leases.md, "Retention").
#[derive(Debug, Default)]
pub(crate) struct FenceNumbers {
    pub entries: usize,
    pub floor: u64,
    pub pruned_highest_tokens: u64,
    pub pruned_op_answers: u64,
    pub resets: usize,
}

impl Metrics {
    pub fn count_vote(&self, yes: bool) {
        inc(if yes { &self.votes_yes } else { &self.votes_no });
    }
    pub fn count_commit(&self) {
        inc(&self.commits);
    }
    pub fn count_abort(&self) {
        inc(&self.aborts);
    }
    pub fn count_rejected(&self) {
        inc(&self.rejected);
    }
    pub fn count_decision_query(&self) {
        inc(&self.decision_queries);
    }
    pub fn count_decision_query_failure(&self) {
        inc(&self.decision_query_failures);
    }
    pub fn count_checkpoint(&self) {
        inc(&self.checkpoints);
    }
    pub fn count_checkpoint_failure(&self) {
        inc(&self.checkpoint_failures);
    }
    pub fn count_lock_wait(&self) {
        inc(&self.lock_waits);
    }
    pub fn count_lock_timeout(&self) {
        inc(&self.lock_timeouts);
    }
    pub fn count_lock_conflict(&self) {
        inc(&self.lock_conflicts);
    }
    /// One batched phase message of `items` items (`crate::batch_http`).
    pub fn count_batch(&self, items: usize) {
        inc(&self.batches);
        self.batched_items
            .fetch_add(u64::try_from(items).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
    /// How long a queued prepare waited, whatever its answer.
    pub fn observe_lock_wait(&self, waited: Duration) {
        self.lock_wait_seconds.observe(waited);
    }

    /// The `/metrics` text.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = Exposition::default();
        out.counters_by(
            "twopc_participant_votes_total",
            "Prepare answers by vote",
            "vote",
            [("yes", load(&self.votes_yes)), ("no", load(&self.votes_no))],
        );
        out.counters_by(
            "twopc_participant_decisions_total",
            "Decisions acknowledged by kind",
            "decision",
            [
                ("commit", load(&self.commits)),
                ("abort", load(&self.aborts)),
            ],
        );
        for (name, help, value) in [
            (
                "twopc_participant_rejected_total",
                "Protocol requests answered with an error (stale epoch, not prepared, invalid \
                 payload)",
                &self.rejected,
            ),
            (
                "twopc_participant_decision_queries_total",
                "Decision queries sent to the coordinator for in-doubt transactions",
                &self.decision_queries,
            ),
            (
                "twopc_participant_decision_query_failures_total",
                "Decision queries that got no usable answer",
                &self.decision_query_failures,
            ),
            (
                "twopc_participant_batches_total",
                "Batched phase messages received (each carries many attempts' prepares or \
                 decisions)",
                &self.batches,
            ),
            (
                "twopc_participant_batched_items_total",
                "Prepares and decisions received inside batched phase messages",
                &self.batched_items,
            ),
            (
                "twopc_participant_checkpoints_total",
                "Checkpoints written",
                &self.checkpoints,
            ),
            (
                "twopc_participant_checkpoint_failures_total",
                "Checkpoints not written (snapshot too large or unencodable); tried again later",
                &self.checkpoint_failures,
            ),
            (
                "twopc_participant_lock_waits_total",
                "Prepares that queued for locks held by older attempts",
                &self.lock_waits,
            ),
            (
                "twopc_participant_lock_timeouts_total",
                "Queued prepares that voted no at their lock-wait deadline (lock_timeout)",
                &self.lock_timeouts,
            ),
            (
                "twopc_participant_lock_conflicts_total",
                "Prepares that voted no at once on a lock (a younger holder, no wait allowed, too \
                 many waiters)",
                &self.lock_conflicts,
            ),
        ] {
            out.counter_of(name, help, value);
        }
        for (name, help, value) in [
            (
                "twopc_participant_prepared",
                "Prepared (in-doubt) transactions holding locks",
                gauges.prepared,
            ),
            (
                "twopc_participant_locked_keys",
                "Keys locked by prepared transactions",
                gauges.locks,
            ),
            (
                "twopc_participant_tombstones",
                "Decided transactions remembered for duplicates",
                gauges.tombstones,
            ),
            (
                "twopc_participant_lock_waiters",
                "Prepares queued for locks now",
                gauges.lock_waiters,
            ),
        ] {
            out.gauge(name, help, as_u64(value));
        }
        out.gauge(
            "twopc_participant_oldest_prepared_age_ms",
            "How long the oldest prepared (in-doubt) transaction has held its locks, in ms (0: \
             none)",
            gauges.oldest_prepared_age_ms,
        );
        out.gauge(
            "twopc_participant_log_failed",
            "1 when the log failed and writes are refused",
            u64::from(gauges.log_failed),
        );
        out.histogram(
            "twopc_participant_lock_wait_seconds",
            "How long queued prepares waited for locks, whatever their vote",
            &self.lock_wait_seconds,
        );
        fence_numbers(&mut out, &gauges.fences);
        outbox_numbers(&mut out, &gauges.outbox);
        wal_numbers(&mut out, &gauges.wal);
        out.text()
    }
}

fn fence_numbers(out: &mut Exposition, fences: &FenceNumbers) {
    out.gauge(
        "twopc_participant_fence_entries",
        "Fenced resources and op answers remembered",
        as_u64(fences.entries),
    );
    out.gauge(
        "twopc_participant_fence_floor",
        "The token every resource without an entry must reach",
        fences.floor,
    );
    out.counters_by(
        "twopc_participant_fence_pruned_total",
        "Entries the fence retention took",
        "what",
        [
            ("highest_token", fences.pruned_highest_tokens),
            ("op_answer", fences.pruned_op_answers),
        ],
    );
    out.gauge(
        "twopc_participant_fence_resets",
        "Operator resets of fences kept in the audit trail",
        as_u64(fences.resets),
    );
}

fn outbox_numbers(out: &mut Exposition, outbox: &OutboxNumbers) {
    for (name, help, value) in [
        (
            "twopc_participant_outbox_intents_written_total",
            "Intents recorded with their writes",
            outbox.written,
        ),
        (
            "twopc_participant_outbox_delivered_total",
            "Intents reported delivered by relays",
            outbox.delivered,
        ),
        (
            "twopc_participant_outbox_attempts_failed_total",
            "Delivery attempts reported without a delivery (outcome unknown, or refused)",
            outbox.attempts_failed,
        ),
    ] {
        out.counter(name, help, value);
    }
    out.gauge(
        "twopc_participant_outbox_pending",
        "Intents waiting for delivery",
        outbox.pending,
    );
    out.gauge(
        "twopc_participant_outbox_failed",
        "Intents refused for good, holding back their aggregates until an operator acts",
        outbox.failed,
    );
    out.gauge_f64(
        "twopc_participant_outbox_oldest_pending_age_seconds",
        "How long the oldest pending intent has waited, in seconds (0: none)",
        outbox.oldest_pending_age_ms as f64 / 1000.0,
    );
}

fn wal_numbers(out: &mut Exposition, wal: &wal::WalStats) {
    out.counter(
        "twopc_wal_fsyncs_total",
        "fdatasync calls of the log",
        wal.fsyncs,
    );
    out.counter(
        "twopc_wal_records_total",
        "Records appended to the log",
        wal.records_appended,
    );
    out.gauge(
        "twopc_wal_bytes_on_disk",
        "Bytes of log on disk",
        wal.log_bytes_on_disk,
    );
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
