//! Counters and the Prometheus text exposition (written by hand; it is simple).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

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
    pub log_failed: bool,
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
            "twopc_participant_log_failed",
            "gauge",
            "1 when the log failed and writes are refused.",
            &[("", u64::from(gauges.log_failed))],
        );
        out
    }
}
