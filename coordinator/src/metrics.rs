//! Counters and histograms for `/metrics`, written out in the Prometheus text format by hand.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::view::Gauges;

/// Bucket upper bounds in seconds, for both latency histograms.
const BUCKETS_S: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_S.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_S) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Mean of the observations in milliseconds (0 when empty).
    pub fn mean_ms(&self) -> f64 {
        let count = self.count();
        if count == 0 {
            return 0.0;
        }
        self.sum_us.load(Ordering::Relaxed) as f64 / 1000.0 / count as f64
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS_S) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

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

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

impl Metrics {
    /// The Prometheus text, with the per-participant loads (every configured participant,
    /// zero included, so a dashboard sees the series before the first outage).
    pub fn render_with(&self, sampled: Sampled, loads: &[ParticipantLoad]) -> String {
        let mut out = self.render(sampled);
        for (name, help, value) in [
            (
                "twopc_coordinator_participant_live",
                "Transactions in phase one (or deciding) on this participant; admission control \
                 refuses new ones past --max-live-per-participant.",
                (|l: &ParticipantLoad| l.live) as fn(&ParticipantLoad) -> u64,
            ),
            (
                "twopc_coordinator_participant_pending_acks",
                "Durable decisions this participant has not acknowledged; admission control \
                 refuses new transactions on it past --max-pending-acks-per-participant.",
                |l: &ParticipantLoad| l.pending_acks,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for load in loads {
                let _ = writeln!(
                    out,
                    "{name}{{participant=\"{}\"}} {}",
                    load.name,
                    value(load)
                );
            }
        }
        out
    }

    pub fn render(&self, sampled: Sampled) -> String {
        let mut out = String::new();
        let name = "twopc_coordinator_transactions_total";
        let _ = writeln!(
            out,
            "# HELP {name} Transactions whose decision became durable, by outcome.\n# TYPE {name} counter"
        );
        for (outcome, value) in [("committed", &self.committed), ("aborted", &self.aborted)] {
            let _ = writeln!(
                out,
                "{name}{{outcome=\"{outcome}\"}} {}",
                value.load(Ordering::Relaxed)
            );
        }
        let name = "twopc_coordinator_lease_answers_total";
        let _ = writeln!(
            out,
            "# HELP {name} Lease requests answered, by result (granted includes renewals).\n# TYPE {name} counter"
        );
        for (result, value) in [
            ("granted", &self.lease_grants),
            ("refused", &self.lease_refusals),
            ("released", &self.lease_releases),
        ] {
            let _ = writeln!(
                out,
                "{name}{{result=\"{result}\"}} {}",
                value.load(Ordering::Relaxed)
            );
        }
        let name = "twopc_coordinator_transactions";
        let _ = writeln!(
            out,
            "# HELP {name} Transactions known now, by state (retained = ended, staged in memory until the outcome index holds it).\n# TYPE {name} gauge"
        );
        let g = sampled.gauges;
        for (state, value) in [
            ("preparing", g.preparing),
            ("committing", g.committing),
            ("aborting", g.aborting),
            ("retained", g.retained),
        ] {
            let _ = writeln!(out, "{name}{{state=\"{state}\"}} {value}");
        }
        gauge(
            &mut out,
            "twopc_coordinator_pending_acks",
            "Participants that have not acknowledged a durable decision.",
            g.pending_acks,
        );
        gauge(
            &mut out,
            "twopc_coordinator_oldest_pending_ack_age_ms",
            "Age of the oldest durable decision some participant has not acknowledged (0: none).",
            g.oldest_pending_ack_decided_at_ms
                .map_or(0, |at| sampled.now_ms.saturating_sub(at)),
        );
        counter(
            &mut out,
            "twopc_coordinator_phase_two_retries_total",
            "Phase-two deliveries sent again after a failure.",
            self.phase_two_retries.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_stale_epoch_answers_total",
            "Participants that answered stale_epoch (another incarnation is newer).",
            self.stale_epoch_answers.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_presumed_aborts_total",
            "Presumed aborts answered for attempts the log covers and holds no decision for.",
            self.presumed_aborts.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_unknown_answers_total",
            "Decision queries answered unknown: the log cannot prove the attempt's outcome.",
            self.unknown_answers.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_unknown_run_queries_total",
            "Decision queries naming a run this log does not hold (a restored log, or a made-up query).",
            self.unknown_run_queries.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_epoch_raises_total",
            "Raises of this run's epoch past a run that a participant holds.",
            self.epoch_raises.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_decision_queries_rate_limited_total",
            "Decision queries refused 429: an unauthenticated caller asked about too many unknown attempts.",
            self.decision_queries_rate_limited.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_overloaded_total",
            "Requests refused with 503 overloaded by admission control.",
            self.overloaded.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_operator_actions_total",
            "Operator actions carried out (resolve, retry), each one an audit record in the log.",
            self.operator_actions.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_operator_retries_total",
            "Phase-two deliveries an operator started at once instead of at their backoff timer.",
            self.operator_retries.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_untracked_aborts_total",
            "Aborts sent once, unacknowledged, to participants that did not vote yes.",
            self.untracked_aborts.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "twopc_coordinator_log_behind",
            "1 when participants proved this log is behind (restored or rolled back).",
            self.log_behind.load(Ordering::Relaxed),
        );
        self.prepare_latency.render(
            &mut out,
            "twopc_coordinator_prepare_latency_seconds",
            "Time from sending a prepare to its vote (or timeout).",
        );
        self.decision_fsync.render(
            &mut out,
            "twopc_coordinator_decision_fsync_seconds",
            "Time from submitting a decision record to it being durable.",
        );
        gauge(
            &mut out,
            "twopc_coordinator_log_bytes",
            "Bytes of write-ahead log on disk.",
            sampled.log_bytes,
        );
        gauge(
            &mut out,
            "twopc_coordinator_log_poisoned",
            "1 when the log failed and takes no more writes.",
            u64::from(sampled.log_poisoned),
        );
        gauge(
            &mut out,
            "twopc_coordinator_ready",
            "1 once recovery finished.",
            u64::from(sampled.ready),
        );
        gauge(
            &mut out,
            "twopc_coordinator_recovered_transactions",
            "Unfinished transactions found in the log when this incarnation started.",
            self.recovered_transactions.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_wal_fsyncs_total",
            "File fsyncs issued by the log since start.",
            sampled.wal_fsyncs,
        );
        counter(
            &mut out,
            "twopc_wal_records_total",
            "Records appended to the log since start.",
            sampled.wal_records,
        );
        gauge(
            &mut out,
            "twopc_coordinator_epoch",
            "This incarnation's epoch.",
            sampled.epoch,
        );
        let index = sampled.index.unwrap_or_default();
        gauge(
            &mut out,
            "twopc_coordinator_retained_disk_bytes",
            "Logical bytes of ended outcomes in the outcome index (what the disk budget counts).",
            index.logical_bytes,
        );
        gauge(
            &mut out,
            "twopc_coordinator_retained_indexed",
            "Ended outcomes in the outcome index.",
            index.entries,
        );
        gauge(
            &mut out,
            "twopc_coordinator_retained_effective_window_ms",
            "How long ended outcomes are really kept: the configured window, or the age of the \
             oldest one kept when the disk budget evicted some inside it.",
            match sampled.index {
                Some(index) => index.effective_window_ms,
                None => sampled.retention_ms,
            },
        );
        counter(
            &mut out,
            "twopc_coordinator_retained_evicted_early_total",
            "Ended outcomes the disk budget evicted while still inside the retention window.",
            index.evicted_early_total,
        );
        counter(
            &mut out,
            "twopc_coordinator_archived_total",
            "Ended outcomes written to the outcome index since start.",
            self.archived.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_archive_failures_total",
            "Outcome index writes that failed (the outcomes stayed staged and were retried).",
            self.archive_failures.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "twopc_coordinator_index_read_failures_total",
            "Outcome index lookups that failed (the request was answered 503).",
            self.index_read_failures.load(Ordering::Relaxed),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 2\n"), "{out}");
        assert!(out.contains("x_count 2\n"), "{out}");
    }

    #[test]
    fn render_has_every_family() {
        let m = Metrics::default();
        m.committed.fetch_add(3, Ordering::Relaxed);
        let out = m.render(Sampled {
            log_bytes: 42,
            ..Sampled::default()
        });
        for needle in [
            "twopc_coordinator_transactions_total{outcome=\"committed\"} 3",
            "twopc_coordinator_pending_acks 0",
            "twopc_coordinator_phase_two_retries_total 0",
            "twopc_coordinator_prepare_latency_seconds_count 0",
            "twopc_coordinator_decision_fsync_seconds_count 0",
            "twopc_coordinator_log_bytes 42",
            "twopc_coordinator_recovered_transactions 0",
            "twopc_wal_fsyncs_total 0",
            "twopc_coordinator_retained_disk_bytes 0",
            "twopc_coordinator_retained_effective_window_ms 0",
            "twopc_coordinator_retained_evicted_early_total 0",
            "twopc_coordinator_archive_failures_total 0",
        ] {
            assert!(out.contains(needle), "{needle} missing in\n{out}");
        }
    }

    #[test]
    fn the_oldest_pending_ack_is_shown_as_an_age_at_the_scrape() {
        let m = Metrics::default();
        let none = m.render(Sampled {
            now_ms: 10_000,
            ..Sampled::default()
        });
        assert!(
            none.contains("twopc_coordinator_oldest_pending_ack_age_ms 0\n"),
            "{none}"
        );
        let some = m.render(Sampled {
            now_ms: 10_000,
            gauges: Gauges {
                pending_acks: 2,
                oldest_pending_ack_decided_at_ms: Some(7_500),
                ..Gauges::default()
            },
            ..Sampled::default()
        });
        assert!(
            some.contains("twopc_coordinator_oldest_pending_ack_age_ms 2500\n"),
            "{some}"
        );
    }
}
