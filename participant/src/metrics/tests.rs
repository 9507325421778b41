//! A participant's `/metrics` families: the set of exported series is today's, so a rename
//! (or a counter that loses its `_total`) fails here before it breaks docs/alerts.yml.

use super::*;

/// Every series and type line of a scrape without values, sorted: what dashboards and alerts
/// can name. Help texts are left out; they may be reworded.
fn series(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("# TYPE ") || !l.starts_with('#'))
        .map(|l| match l.strip_prefix("# TYPE ") {
            Some(_) => l.to_string(),
            None => l
                .rsplit_once(' ')
                .map_or(l, |(series, _)| series)
                .to_string(),
        })
        .collect();
    out.sort();
    out
}

/// The series a reference participant exported before the text was written by
/// `prometheus-client` (a live scrape of that version, values removed).
const SERIES: [&str; 82] = [
    "# TYPE twopc_participant_batched_items_total counter",
    "# TYPE twopc_participant_batches_total counter",
    "# TYPE twopc_participant_checkpoint_failures_total counter",
    "# TYPE twopc_participant_checkpoints_total counter",
    "# TYPE twopc_participant_decision_queries_total counter",
    "# TYPE twopc_participant_decision_query_failures_total counter",
    "# TYPE twopc_participant_decisions_total counter",
    "# TYPE twopc_participant_fence_entries gauge",
    "# TYPE twopc_participant_fence_floor gauge",
    "# TYPE twopc_participant_fence_pruned_total counter",
    "# TYPE twopc_participant_fence_resets gauge",
    "# TYPE twopc_participant_lock_conflicts_total counter",
    "# TYPE twopc_participant_lock_timeouts_total counter",
    "# TYPE twopc_participant_lock_wait_seconds histogram",
    "# TYPE twopc_participant_lock_waiters gauge",
    "# TYPE twopc_participant_lock_waits_total counter",
    "# TYPE twopc_participant_locked_keys gauge",
    "# TYPE twopc_participant_log_failed gauge",
    "# TYPE twopc_participant_oldest_prepared_age_ms gauge",
    "# TYPE twopc_participant_outbox_attempts_failed_total counter",
    "# TYPE twopc_participant_outbox_delivered_total counter",
    "# TYPE twopc_participant_outbox_failed gauge",
    "# TYPE twopc_participant_outbox_intents_written_total counter",
    "# TYPE twopc_participant_outbox_oldest_pending_age_seconds gauge",
    "# TYPE twopc_participant_outbox_pending gauge",
    "# TYPE twopc_participant_prepared gauge",
    "# TYPE twopc_participant_rejected_total counter",
    "# TYPE twopc_participant_tombstones gauge",
    "# TYPE twopc_participant_votes_total counter",
    "# TYPE twopc_wal_bytes_on_disk gauge",
    "# TYPE twopc_wal_fsyncs_total counter",
    "# TYPE twopc_wal_records_total counter",
    "twopc_participant_batched_items_total",
    "twopc_participant_batches_total",
    "twopc_participant_checkpoint_failures_total",
    "twopc_participant_checkpoints_total",
    "twopc_participant_decision_queries_total",
    "twopc_participant_decision_query_failures_total",
    "twopc_participant_decisions_total{decision=\"abort\"}",
    "twopc_participant_decisions_total{decision=\"commit\"}",
    "twopc_participant_fence_entries",
    "twopc_participant_fence_floor",
    "twopc_participant_fence_pruned_total{what=\"highest_token\"}",
    "twopc_participant_fence_pruned_total{what=\"op_answer\"}",
    "twopc_participant_fence_resets",
    "twopc_participant_lock_conflicts_total",
    "twopc_participant_lock_timeouts_total",
    "twopc_participant_lock_wait_seconds_bucket{le=\"+Inf\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.0005\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.001\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.0025\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.005\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.01\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.025\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.05\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.1\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.25\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"0.5\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"1\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"2.5\"}",
    "twopc_participant_lock_wait_seconds_bucket{le=\"5\"}",
    "twopc_participant_lock_wait_seconds_count",
    "twopc_participant_lock_wait_seconds_sum",
    "twopc_participant_lock_waiters",
    "twopc_participant_lock_waits_total",
    "twopc_participant_locked_keys",
    "twopc_participant_log_failed",
    "twopc_participant_oldest_prepared_age_ms",
    "twopc_participant_outbox_attempts_failed_total",
    "twopc_participant_outbox_delivered_total",
    "twopc_participant_outbox_failed",
    "twopc_participant_outbox_intents_written_total",
    "twopc_participant_outbox_oldest_pending_age_seconds",
    "twopc_participant_outbox_pending",
    "twopc_participant_prepared",
    "twopc_participant_rejected_total",
    "twopc_participant_tombstones",
    "twopc_participant_votes_total{vote=\"no\"}",
    "twopc_participant_votes_total{vote=\"yes\"}",
    "twopc_wal_bytes_on_disk",
    "twopc_wal_fsyncs_total",
    "twopc_wal_records_total",
];

#[test]
fn the_exported_series_and_types_are_the_same_as_before() {
    let text = Metrics::default().render(&Gauges::default());
    let now = series(&text);
    let gone: Vec<_> = SERIES
        .iter()
        .filter(|s| !now.iter().any(|n| n == *s))
        .collect();
    let new: Vec<_> = now
        .iter()
        .filter(|n| !SERIES.contains(&n.as_str()))
        .collect();
    assert!(
        gone.is_empty() && new.is_empty(),
        "gone: {gone:#?}\nnew: {new:#?}\n{text}"
    );
    assert_eq!(now.len(), SERIES.len(), "a series twice:\n{text}");
    let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(helps, types, "{text}");
    assert!(!text.contains("..\n"), "{text}");
}

#[test]
fn values_are_the_counters_and_what_the_scrape_read() {
    let m = Metrics::default();
    m.count_vote(true);
    m.count_vote(true);
    m.count_abort();
    m.observe_lock_wait(Duration::from_millis(30));
    let text = m.render(&Gauges {
        prepared: 2,
        log_failed: true,
        oldest_prepared_age_ms: 1_500,
        fences: FenceNumbers {
            floor: 9,
            pruned_op_answers: 4,
            ..FenceNumbers::default()
        },
        outbox: OutboxNumbers {
            written: 3,
            pending: 2,
            oldest_pending_age_ms: 1_500,
            ..OutboxNumbers::default()
        },
        wal: wal::WalStats {
            fsyncs: 5,
            log_bytes_on_disk: 861,
            ..wal::WalStats::default()
        },
        ..Gauges::default()
    });
    for line in [
        "twopc_participant_votes_total{vote=\"yes\"} 2\n",
        "twopc_participant_decisions_total{decision=\"abort\"} 1\n",
        "twopc_participant_prepared 2\n",
        "twopc_participant_log_failed 1\n",
        "twopc_participant_oldest_prepared_age_ms 1500\n",
        "twopc_participant_lock_wait_seconds_bucket{le=\"0.025\"} 0\n",
        "twopc_participant_lock_wait_seconds_bucket{le=\"0.05\"} 1\n",
        "twopc_participant_lock_wait_seconds_count 1\n",
        "twopc_participant_fence_floor 9\n",
        "twopc_participant_fence_pruned_total{what=\"op_answer\"} 4\n",
        "twopc_wal_fsyncs_total 5\n",
        "twopc_wal_bytes_on_disk 861\n",
        "twopc_participant_outbox_intents_written_total 3\n",
        "twopc_participant_outbox_pending 2\n",
        "twopc_participant_outbox_oldest_pending_age_seconds 1.5\n",
        "# TYPE twopc_wal_fsyncs_total counter\n",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
}
