//! The coordinator's `/metrics` families: the set of exported series is today's, so a rename
//! (or a counter that loses its `_total`) fails here before it breaks docs/alerts.yml.

use std::sync::atomic::Ordering;
use std::time::Duration;

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

fn every_saga_state() -> SagaNumbers {
    SagaNumbers {
        by_state: SagaState::ALL.into_iter().map(|s| (s, 0)).collect(),
        ..SagaNumbers::default()
    }
}

fn inventory() -> Vec<ParticipantLoad> {
    vec![ParticipantLoad {
        name: "inventory".into(),
        live: 0,
        pending_acks: 0,
    }]
}

/// The series a coordinator with one participant, `inventory`, exported before the text was
/// written by `prometheus-client` (a live scrape of that version, values removed).
const SERIES: [&str; 124] = [
    "# TYPE twopc_coordinator_archive_failures_total counter",
    "# TYPE twopc_coordinator_archived_total counter",
    "# TYPE twopc_coordinator_decision_fsync_seconds histogram",
    "# TYPE twopc_coordinator_decision_queries_rate_limited_total counter",
    "# TYPE twopc_coordinator_epoch gauge",
    "# TYPE twopc_coordinator_epoch_raises_total counter",
    "# TYPE twopc_coordinator_index_read_failures_total counter",
    "# TYPE twopc_coordinator_lease_answers_total counter",
    "# TYPE twopc_coordinator_log_behind gauge",
    "# TYPE twopc_coordinator_log_bytes gauge",
    "# TYPE twopc_coordinator_log_poisoned gauge",
    "# TYPE twopc_coordinator_oldest_pending_ack_age_ms gauge",
    "# TYPE twopc_coordinator_operator_actions_total counter",
    "# TYPE twopc_coordinator_operator_retries_total counter",
    "# TYPE twopc_coordinator_overloaded_total counter",
    "# TYPE twopc_coordinator_participant_live gauge",
    "# TYPE twopc_coordinator_participant_pending_acks gauge",
    "# TYPE twopc_coordinator_pending_acks gauge",
    "# TYPE twopc_coordinator_phase_batched_items_total counter",
    "# TYPE twopc_coordinator_phase_batches_total counter",
    "# TYPE twopc_coordinator_phase_two_retries_total counter",
    "# TYPE twopc_coordinator_prepare_latency_seconds histogram",
    "# TYPE twopc_coordinator_presumed_aborts_total counter",
    "# TYPE twopc_coordinator_ready gauge",
    "# TYPE twopc_coordinator_recovered_transactions gauge",
    "# TYPE twopc_coordinator_retained_disk_bytes gauge",
    "# TYPE twopc_coordinator_retained_effective_window_ms gauge",
    "# TYPE twopc_coordinator_retained_evicted_early_total counter",
    "# TYPE twopc_coordinator_retained_indexed gauge",
    "# TYPE twopc_coordinator_stale_epoch_answers_total counter",
    "# TYPE twopc_coordinator_transactions gauge",
    "# TYPE twopc_coordinator_transactions_total counter",
    "# TYPE twopc_coordinator_unknown_answers_total counter",
    "# TYPE twopc_coordinator_unknown_run_queries_total counter",
    "# TYPE twopc_coordinator_untracked_aborts_total counter",
    "# TYPE twopc_saga_compensations_failing gauge",
    "# TYPE twopc_saga_op_id_conflicts_total counter",
    "# TYPE twopc_saga_step_retries_total counter",
    "# TYPE twopc_sagas gauge",
    "# TYPE twopc_sagas_resolved_by_hand gauge",
    "# TYPE twopc_wal_fsyncs_total counter",
    "# TYPE twopc_wal_records_total counter",
    "twopc_coordinator_archive_failures_total",
    "twopc_coordinator_archived_total",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"+Inf\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.0005\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.001\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.0025\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.005\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.01\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.025\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.05\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.1\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.25\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.5\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"1\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"2.5\"}",
    "twopc_coordinator_decision_fsync_seconds_bucket{le=\"5\"}",
    "twopc_coordinator_decision_fsync_seconds_count",
    "twopc_coordinator_decision_fsync_seconds_sum",
    "twopc_coordinator_decision_queries_rate_limited_total",
    "twopc_coordinator_epoch",
    "twopc_coordinator_epoch_raises_total",
    "twopc_coordinator_index_read_failures_total",
    "twopc_coordinator_lease_answers_total{result=\"granted\"}",
    "twopc_coordinator_lease_answers_total{result=\"refused\"}",
    "twopc_coordinator_lease_answers_total{result=\"released\"}",
    "twopc_coordinator_log_behind",
    "twopc_coordinator_log_bytes",
    "twopc_coordinator_log_poisoned",
    "twopc_coordinator_oldest_pending_ack_age_ms",
    "twopc_coordinator_operator_actions_total",
    "twopc_coordinator_operator_retries_total",
    "twopc_coordinator_overloaded_total",
    "twopc_coordinator_participant_live{participant=\"inventory\"}",
    "twopc_coordinator_participant_pending_acks{participant=\"inventory\"}",
    "twopc_coordinator_pending_acks",
    "twopc_coordinator_phase_batched_items_total",
    "twopc_coordinator_phase_batches_total",
    "twopc_coordinator_phase_two_retries_total",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"+Inf\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.0005\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.001\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.0025\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.005\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.01\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.025\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.05\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.1\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.25\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"0.5\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"1\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"2.5\"}",
    "twopc_coordinator_prepare_latency_seconds_bucket{le=\"5\"}",
    "twopc_coordinator_prepare_latency_seconds_count",
    "twopc_coordinator_prepare_latency_seconds_sum",
    "twopc_coordinator_presumed_aborts_total",
    "twopc_coordinator_ready",
    "twopc_coordinator_recovered_transactions",
    "twopc_coordinator_retained_disk_bytes",
    "twopc_coordinator_retained_effective_window_ms",
    "twopc_coordinator_retained_evicted_early_total",
    "twopc_coordinator_retained_indexed",
    "twopc_coordinator_stale_epoch_answers_total",
    "twopc_coordinator_transactions_total{outcome=\"aborted\"}",
    "twopc_coordinator_transactions_total{outcome=\"committed\"}",
    "twopc_coordinator_transactions{state=\"aborting\"}",
    "twopc_coordinator_transactions{state=\"committing\"}",
    "twopc_coordinator_transactions{state=\"preparing\"}",
    "twopc_coordinator_transactions{state=\"retained\"}",
    "twopc_coordinator_unknown_answers_total",
    "twopc_coordinator_unknown_run_queries_total",
    "twopc_coordinator_untracked_aborts_total",
    "twopc_saga_compensations_failing",
    "twopc_saga_op_id_conflicts_total",
    "twopc_saga_step_retries_total",
    "twopc_sagas_resolved_by_hand",
    "twopc_sagas{state=\"compensated\"}",
    "twopc_sagas{state=\"compensating\"}",
    "twopc_sagas{state=\"completed\"}",
    "twopc_sagas{state=\"needs_attention\"}",
    "twopc_sagas{state=\"running\"}",
    "twopc_wal_fsyncs_total",
    "twopc_wal_records_total",
];

#[test]
fn the_exported_series_and_types_are_the_same_as_before() {
    let text =
        Metrics::default().render(Sampled::default(), &inventory(), Some(&every_saga_state()));
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
}

#[test]
fn every_family_has_help_and_a_type() {
    let text =
        Metrics::default().render(Sampled::default(), &inventory(), Some(&every_saga_state()));
    let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(types, 42, "{text}");
    assert_eq!(helps, types, "{text}");
    // The crate ends every help with a full stop; none is given one twice.
    assert!(!text.contains("..\n"), "{text}");
}

#[test]
fn before_recovery_there_are_no_saga_families_and_no_participant_samples() {
    let text = Metrics::default().render(Sampled::default(), &[], None);
    assert!(!text.contains("twopc_saga"), "{text}");
    assert!(
        text.contains("# TYPE twopc_coordinator_participant_live gauge\n"),
        "{text}"
    );
    assert!(
        !text.contains("twopc_coordinator_participant_live{"),
        "{text}"
    );
    assert!(text.contains("twopc_coordinator_ready 0\n"), "{text}");
}

#[test]
fn values_are_the_counters_and_what_the_scrape_read() {
    let m = Metrics::default();
    m.committed.fetch_add(3, Ordering::Relaxed);
    m.overloaded.fetch_add(2, Ordering::Relaxed);
    m.decision_fsync.observe(Duration::from_millis(2));
    let sagas = SagaNumbers {
        compensations_failing: 1,
        op_id_conflicts: 4,
        ..every_saga_state()
    };
    let loads = [ParticipantLoad {
        name: "shipping".into(),
        live: 5,
        pending_acks: 6,
    }];
    let text = m.render(
        Sampled {
            ready: true,
            log_bytes: 42,
            wal_fsyncs: 7,
            retention_ms: 9_000,
            ..Sampled::default()
        },
        &loads,
        Some(&sagas),
    );
    for line in [
        "twopc_coordinator_transactions_total{outcome=\"committed\"} 3\n",
        "twopc_coordinator_transactions_total{outcome=\"aborted\"} 0\n",
        "twopc_coordinator_overloaded_total 2\n",
        "twopc_coordinator_decision_fsync_seconds_bucket{le=\"0.0025\"} 1\n",
        "twopc_coordinator_decision_fsync_seconds_count 1\n",
        "twopc_coordinator_log_bytes 42\n",
        "twopc_coordinator_ready 1\n",
        "twopc_wal_fsyncs_total 7\n",
        // The configured window when the index could not be read.
        "twopc_coordinator_retained_effective_window_ms 9000\n",
        "twopc_coordinator_participant_live{participant=\"shipping\"} 5\n",
        "twopc_coordinator_participant_pending_acks{participant=\"shipping\"} 6\n",
        "twopc_saga_compensations_failing 1\n",
        "twopc_saga_op_id_conflicts_total 4\n",
        "# HELP twopc_coordinator_ready 1 once recovery finished.\n",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
}

#[test]
fn the_oldest_pending_ack_is_shown_as_an_age_at_the_scrape() {
    let m = Metrics::default();
    let none = m.render(
        Sampled {
            now_ms: 10_000,
            ..Sampled::default()
        },
        &[],
        None,
    );
    assert!(
        none.contains("twopc_coordinator_oldest_pending_ack_age_ms 0\n"),
        "{none}"
    );
    let some = m.render(
        Sampled {
            now_ms: 10_000,
            gauges: Gauges {
                pending_acks: 2,
                oldest_pending_ack_decided_at_ms: Some(7_500),
                ..Gauges::default()
            },
            ..Sampled::default()
        },
        &[],
        None,
    );
    assert!(
        some.contains("twopc_coordinator_oldest_pending_ack_age_ms 2500\n"),
        "{some}"
    );
}
