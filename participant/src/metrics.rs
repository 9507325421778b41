//! Counters and the Prometheus text exposition (written by hand; it is simple).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Lock-wait bucket bounds in seconds (the coordinator's latency buckets): a wait is bounded
/// by `lock_wait_max_ms` (2 s by default), so the top bucket leaves room for a raised cap.
const BUCKETS_S: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// A duration histogram with fixed cumulative buckets, as in the coordinator's metrics.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
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
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(micros, Ordering::Relaxed);
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
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum_s = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum_s}\n{name}_count {count}");
    }
}

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
}

fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Gauges read from the engine and the log at scrape time.
#[derive(Debug)]
pub(crate) struct Gauges {
    pub prepared: usize,
    pub locks: usize,
    pub tombstones: usize,
    pub lock_waiters: usize,
    pub log_failed: bool,
    /// How long the oldest prepared attempt has held its locks, in ms (0: none prepared).
    pub oldest_prepared_age_ms: u64,
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
    /// How long a queued prepare waited, whatever its answer.
    pub fn observe_lock_wait(&self, waited: Duration) {
        self.lock_wait_seconds.observe(waited);
    }

    /// The Prometheus text format.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        metric(
            "twopc_participant_votes_total",
            "counter",
            "Prepare answers by vote.",
            &[
                ("{vote=\"yes\"}", get(&self.votes_yes)),
                ("{vote=\"no\"}", get(&self.votes_no)),
            ],
        );
        metric(
            "twopc_participant_decisions_total",
            "counter",
            "Decisions acknowledged by kind.",
            &[
                ("{decision=\"commit\"}", get(&self.commits)),
                ("{decision=\"abort\"}", get(&self.aborts)),
            ],
        );
        metric(
            "twopc_participant_rejected_total",
            "counter",
            "Protocol requests answered with an error (stale epoch, not prepared, invalid payload).",
            &[("", get(&self.rejected))],
        );
        metric(
            "twopc_participant_decision_queries_total",
            "counter",
            "Decision queries sent to the coordinator for in-doubt transactions.",
            &[("", get(&self.decision_queries))],
        );
        metric(
            "twopc_participant_decision_query_failures_total",
            "counter",
            "Decision queries that got no usable answer.",
            &[("", get(&self.decision_query_failures))],
        );
        metric(
            "twopc_participant_checkpoints_total",
            "counter",
            "Checkpoints written.",
            &[("", get(&self.checkpoints))],
        );
        metric(
            "twopc_participant_checkpoint_failures_total",
            "counter",
            "Checkpoints not written (snapshot too large or unencodable); tried again later.",
            &[("", get(&self.checkpoint_failures))],
        );
        metric(
            "twopc_participant_lock_waits_total",
            "counter",
            "Prepares that queued for locks held by older attempts.",
            &[("", get(&self.lock_waits))],
        );
        metric(
            "twopc_participant_lock_timeouts_total",
            "counter",
            "Queued prepares that voted no at their lock-wait deadline (lock_timeout).",
            &[("", get(&self.lock_timeouts))],
        );
        metric(
            "twopc_participant_lock_conflicts_total",
            "counter",
            "Prepares that voted no at once on a lock (a younger holder, no wait allowed, too many waiters).",
            &[("", get(&self.lock_conflicts))],
        );
        let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        metric(
            "twopc_participant_prepared",
            "gauge",
            "Prepared (in-doubt) transactions holding locks.",
            &[("", as_u64(gauges.prepared))],
        );
        metric(
            "twopc_participant_locked_keys",
            "gauge",
            "Keys locked by prepared transactions.",
            &[("", as_u64(gauges.locks))],
        );
        metric(
            "twopc_participant_tombstones",
            "gauge",
            "Decided transactions remembered for duplicates.",
            &[("", as_u64(gauges.tombstones))],
        );
        metric(
            "twopc_participant_lock_waiters",
            "gauge",
            "Prepares queued for locks now.",
            &[("", as_u64(gauges.lock_waiters))],
        );
        metric(
            "twopc_participant_oldest_prepared_age_ms",
            "gauge",
            "How long the oldest prepared (in-doubt) transaction has held its locks, in ms (0: none).",
            &[("", gauges.oldest_prepared_age_ms)],
        );
        metric(
            "twopc_participant_log_failed",
            "gauge",
            "1 when the log failed and writes are refused.",
            &[("", u64::from(gauges.log_failed))],
        );
        self.lock_wait_seconds.render(
            &mut out,
            "twopc_participant_lock_wait_seconds",
            "How long queued prepares waited for locks, whatever their vote.",
        );
        out
    }
}
