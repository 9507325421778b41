//! What the coordinator counts, and its `/metrics` families: each one's exported name, type,
//! labels and help, written by `net::exposition` (the Prometheus text format; docs/operations.md,
//! "The metrics text"). docs/alerts.yml and dashboards query these names: a rename breaks them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use protocol::saga::SagaState;

use net::exposition::Exposition;

pub mod group;
pub use net::exposition::Histogram;

use crate::engine::view::Gauges;

/// Everything the coordinator counts.
#[derive(Debug, Default)]
pub struct Metrics {
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub prepare_latency: Histogram,
    pub decision_fsync: Histogram,
    pub phase_two_retries: AtomicU64,
    pub stale_epoch_answers: AtomicU64,
    /// Presumed aborts answered to participants for attempts the log covers and has no
    /// decision for.
    pub presumed_aborts: AtomicU64,
    /// Decision queries answered `unknown`: the log cannot prove the attempt's outcome.
    pub unknown_answers: AtomicU64,
    /// Decision queries refused 429 `rate_limited`: a caller that does not authenticate asked
    /// about too many attempts this coordinator has no record of.
    pub decision_queries_rate_limited: AtomicU64,
    /// Decision queries that named a run this log does not hold: a restored log, or a made-up
    /// query. Counted and answered `unknown`; never taken as proof of anything.
    pub unknown_run_queries: AtomicU64,
    /// Raises of this run's epoch past a run a participant holds (`runtime::fencing`).
    pub epoch_raises: AtomicU64,
    /// 1 while this log is marked behind what participants saw (until an operator clears it).
    pub log_behind: AtomicU64,
    /// Unfinished transactions (preparing, committing or aborting) found in the log at start.
    pub recovered_transactions: AtomicU64,
    /// New transactions (or retries) refused with 503 `overloaded` by admission control.
    pub overloaded: AtomicU64,
    /// Aborts sent once, untracked, to participants that did not vote yes.
    pub untracked_aborts: AtomicU64,
    /// Batched phase messages sent, and the prepares and decisions they carried.
    pub batches: AtomicU64,
    pub batched_items: AtomicU64,
    /// Outcomes written to the outcome index.
    pub archived: AtomicU64,
    /// Outcome index write transactions that failed (their outcomes stayed staged).
    pub archive_failures: AtomicU64,
    /// Outcome index lookups that failed (the request got 503).
    pub index_read_failures: AtomicU64,
    /// Operator actions carried out (each one an audit record).
    pub operator_actions: AtomicU64,
    /// Phase-two deliveries an operator started before their backoff timer.
    pub operator_retries: AtomicU64,
    /// Lease answers: granted or renewed, refused (`lease_held`, `lease_lost`), released.
    pub lease_grants: AtomicU64,
    pub lease_refusals: AtomicU64,
    pub lease_releases: AtomicU64,
}

/// One participant's share of the coordinator's work, for the per-participant gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParticipantLoad {
    pub name: String,
    pub live: u64,
    pub pending_acks: u64,
}

/// What `/metrics` reads from elsewhere at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampled {
    pub ready: bool,
    pub log_poisoned: bool,
    pub log_bytes: u64,
    pub epoch: u64,
    pub gauges: Gauges,
    /// File fsyncs the log has issued since start (group commit shares one among many records).
    pub wal_fsyncs: u64,
    /// Records appended since start.
    pub wal_records: u64,
    /// The outcome index's numbers, when it could be read.
    pub index: Option<crate::outcomes::IndexStats>,
    /// The configured retention window (for the effective window when the index is unread).
    pub retention_ms: u64,
    /// The wall clock at the scrape, for ages.
    pub now_ms: u64,
}

/// The saga table's numbers at the scrape (`runtime::sagas`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SagaNumbers {
    /// Sagas by state, every state included.
    pub by_state: BTreeMap<SagaState, u64>,
    pub compensations_failing: u64,
    pub resolved_by_hand: u64,
    pub step_retries: u64,
    pub op_id_conflicts: u64,
}

impl Metrics {
    /// One batched phase message of `items` items sent (`runtime::batches`).
    pub fn count_batch(&self, items: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_items
            .fetch_add(u64::try_from(items).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The `/metrics` text: this coordinator's counters and histograms, what `sampled` read,
    /// every configured participant's load (zero included, so a dashboard sees the series
    /// before the first outage), and the saga table's numbers (none before recovery ends).
    pub fn render(
        &self,
        sampled: Sampled,
        loads: &[ParticipantLoad],
        sagas: Option<&SagaNumbers>,
    ) -> String {
        let mut out = Exposition::default();
        self.transactions(&mut out, sampled);
        self.deliveries_and_answers(&mut out);
        self.log_and_recovery(&mut out, sampled);
        self.retention(&mut out, sampled);
        participant_loads(&mut out, loads);
        if let Some(sagas) = sagas {
            saga_numbers(&mut out, sagas);
        }
        out.text()
    }

    fn transactions(&self, out: &mut Exposition, sampled: Sampled) {
        out.counters_by(
            "twopc_coordinator_transactions_total",
            "Transactions whose decision became durable, by outcome",
            "outcome",
            [
                ("committed", load(&self.committed)),
                ("aborted", load(&self.aborted)),
            ],
        );
        out.counters_by(
            "twopc_coordinator_lease_answers_total",
            "Lease requests answered, by result (granted includes renewals)",
            "result",
            [
                ("granted", load(&self.lease_grants)),
                ("refused", load(&self.lease_refusals)),
                ("released", load(&self.lease_releases)),
            ],
        );
        let g = sampled.gauges;
        out.gauges_by(
            "twopc_coordinator_transactions",
            "Transactions known now, by state (retained = ended, staged in memory until the \
             outcome index holds it)",
            "state",
            [
                ("preparing", g.preparing),
                ("committing", g.committing),
                ("aborting", g.aborting),
                ("retained", g.retained),
            ],
        );
        out.gauge(
            "twopc_coordinator_pending_acks",
            "Participants that have not acknowledged a durable decision",
            g.pending_acks,
        );
        out.gauge(
            "twopc_coordinator_oldest_pending_ack_age_ms",
            "Age of the oldest durable decision some participant has not acknowledged (0: none)",
            g.oldest_pending_ack_decided_at_ms
                .map_or(0, |at| sampled.now_ms.saturating_sub(at)),
        );
    }

    fn deliveries_and_answers(&self, out: &mut Exposition) {
        for (name, help, value) in [
            (
                "twopc_coordinator_phase_two_retries_total",
                "Phase-two deliveries sent again after a failure",
                &self.phase_two_retries,
            ),
            (
                "twopc_coordinator_stale_epoch_answers_total",
                "Participants that answered stale_epoch (another incarnation is newer)",
                &self.stale_epoch_answers,
            ),
            (
                "twopc_coordinator_presumed_aborts_total",
                "Presumed aborts answered for attempts the log covers and holds no decision for",
                &self.presumed_aborts,
            ),
            (
                "twopc_coordinator_unknown_answers_total",
                "Decision queries answered unknown: the log cannot prove the attempt's outcome",
                &self.unknown_answers,
            ),
            (
                "twopc_coordinator_unknown_run_queries_total",
                "Decision queries naming a run this log does not hold (a restored log, or a \
                 made-up query)",
                &self.unknown_run_queries,
            ),
            (
                "twopc_coordinator_epoch_raises_total",
                "Raises of this run's epoch past a run that a participant holds",
                &self.epoch_raises,
            ),
            (
                "twopc_coordinator_decision_queries_rate_limited_total",
                "Decision queries refused 429: an unauthenticated caller asked about too many \
                 unknown attempts",
                &self.decision_queries_rate_limited,
            ),
            (
                "twopc_coordinator_overloaded_total",
                "Requests refused with 503 overloaded by admission control",
                &self.overloaded,
            ),
            (
                "twopc_coordinator_operator_actions_total",
                "Operator actions carried out (resolve, retry), each one an audit record in the log",
                &self.operator_actions,
            ),
            (
                "twopc_coordinator_operator_retries_total",
                "Phase-two deliveries an operator started at once instead of at their backoff \
                 timer",
                &self.operator_retries,
            ),
            (
                "twopc_coordinator_untracked_aborts_total",
                "Aborts sent once, unacknowledged, to participants that did not vote yes",
                &self.untracked_aborts,
            ),
            (
                "twopc_coordinator_phase_batches_total",
                "Batched phase messages sent (each carries many attempts' prepares or decisions)",
                &self.batches,
            ),
            (
                "twopc_coordinator_phase_batched_items_total",
                "Prepares and decisions sent inside batched phase messages",
                &self.batched_items,
            ),
        ] {
            out.counter_of(name, help, value);
        }
    }

    fn log_and_recovery(&self, out: &mut Exposition, sampled: Sampled) {
        out.gauge(
            "twopc_coordinator_log_behind",
            "1 when participants proved this log is behind (restored or rolled back)",
            load(&self.log_behind),
        );
        out.histogram(
            "twopc_coordinator_prepare_latency_seconds",
            "Time from sending a prepare to its vote (or timeout)",
            &self.prepare_latency,
        );
        out.histogram(
            "twopc_coordinator_decision_fsync_seconds",
            "Time from submitting a decision record to it being durable",
            &self.decision_fsync,
        );
        out.gauge(
            "twopc_coordinator_log_bytes",
            "Bytes of write-ahead log on disk",
            sampled.log_bytes,
        );
        out.gauge(
            "twopc_coordinator_log_poisoned",
            "1 when the log failed and takes no more writes",
            u64::from(sampled.log_poisoned),
        );
        out.gauge(
            "twopc_coordinator_ready",
            "1 once recovery finished",
            u64::from(sampled.ready),
        );
        out.gauge(
            "twopc_coordinator_recovered_transactions",
            "Unfinished transactions found in the log when this incarnation started",
            load(&self.recovered_transactions),
        );
        out.counter(
            "twopc_wal_fsyncs_total",
            "File fsyncs issued by the log since start",
            sampled.wal_fsyncs,
        );
        out.counter(
            "twopc_wal_records_total",
            "Records appended to the log since start",
            sampled.wal_records,
        );
        out.gauge(
            "twopc_coordinator_epoch",
            "This incarnation's epoch",
            sampled.epoch,
        );
    }

    fn retention(&self, out: &mut Exposition, sampled: Sampled) {
        let index = sampled.index.unwrap_or_default();
        out.gauge(
            "twopc_coordinator_retained_disk_bytes",
            "Logical bytes of ended outcomes in the outcome index (what the disk budget counts)",
            index.logical_bytes,
        );
        out.gauge(
            "twopc_coordinator_retained_indexed",
            "Ended outcomes in the outcome index",
            index.entries,
        );
        out.gauge(
            "twopc_coordinator_retained_effective_window_ms",
            "How long ended outcomes are really kept: the configured window, or the age of the \
             oldest one kept when the disk budget evicted some inside it",
            match sampled.index {
                Some(index) => index.effective_window_ms,
                None => sampled.retention_ms,
            },
        );
        out.counter(
            "twopc_coordinator_retained_evicted_early_total",
            "Ended outcomes the disk budget evicted while still inside the retention window",
            index.evicted_early_total,
        );
        out.counter_of(
            "twopc_coordinator_archived_total",
            "Ended outcomes written to the outcome index since start",
            &self.archived,
        );
        out.counter_of(
            "twopc_coordinator_archive_failures_total",
            "Outcome index writes that failed (the outcomes stayed staged and were retried)",
            &self.archive_failures,
        );
        out.counter_of(
            "twopc_coordinator_index_read_failures_total",
            "Outcome index lookups that failed (the request was answered 503)",
            &self.index_read_failures,
        );
    }
}

fn participant_loads(out: &mut Exposition, loads: &[ParticipantLoad]) {
    out.gauges_by(
        "twopc_coordinator_participant_live",
        "Transactions in phase one (or deciding) on this participant; admission control refuses \
         new ones past --max-live-per-participant",
        "participant",
        loads.iter().map(|l| (l.name.as_str(), l.live)),
    );
    out.gauges_by(
        "twopc_coordinator_participant_pending_acks",
        "Durable decisions this participant has not acknowledged; admission control refuses new \
         transactions on it past --max-pending-acks-per-participant",
        "participant",
        loads.iter().map(|l| (l.name.as_str(), l.pending_acks)),
    );
}

fn saga_numbers(out: &mut Exposition, sagas: &SagaNumbers) {
    out.gauge(
        "twopc_saga_compensations_failing",
        "Steps whose compensation (or fence) keeps failing (retried with capped backoff for ever)",
        sagas.compensations_failing,
    );
    out.gauge(
        "twopc_sagas_resolved_by_hand",
        "needs_attention sagas an operator settled by hand",
        sagas.resolved_by_hand,
    );
    out.gauges_by(
        "twopc_sagas",
        "Sagas in this coordinator's table by state (needs_attention and compensating ones want \
         an operator's eye)",
        "state",
        sagas.by_state.iter().map(|(state, n)| (state.as_str(), *n)),
    );
    out.counter(
        "twopc_saga_step_retries_total",
        "Saga actions and compensations sent again under the same op id (after an unknown \
         outcome or a failing compensation)",
        sagas.step_retries,
    );
    out.counter(
        "twopc_saga_op_id_conflicts_total",
        "Saga ops and op queries a participant refused op_id_conflict: it holds that op id from \
         this coordinator id with another payload (a saga id used again after this \
         coordinator's log lost it)",
        sagas.op_id_conflicts,
    );
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests;
