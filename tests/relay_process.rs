//! `twopc relay` as a process, against a fake participant outbox (tests/relay_support) and
//! the reference receiver (cluster::receiver), which deduplicates by `event_id`:
//! - a receiver that answers too late for the first attempts of every event: each outcome is
//!   unknown, reconciled under the same `event_id`, the effect happens once, the aggregates'
//!   order holds, and a target the relay does not know is never called;
//! - the crash point `relay::after_delivery_before_mark` (the failpoints build): the receiver
//!   has the event, the relay dies before its report, and the restarted relay delivers it
//!   again under the same id; the receiver answers the repeat without a second effect.

mod relay_support;

use std::collections::BTreeMap;
use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use cluster::node::http_get;
use cluster::receiver::{Behaviour, Receiver};
use protocol::outbox::IntentState;
use relay_support::{FakeOutbox, intent, relay};
use serde_json::json;

const PEER_TOKEN: &str = "relay-test-peer-token-0123456789";

fn peer_file(dir: &std::path::Path) -> String {
    let file = dir.join("peer.tokens");
    std::fs::write(&file, format!("# the relay's peer token\n{PEER_TOKEN}\n")).unwrap();
    file.display().to_string()
}

/// Seqs of first applications per aggregate, in the order they happened.
fn applied_by_aggregate(receiver: &Receiver) -> BTreeMap<String, Vec<u64>> {
    let mut by = BTreeMap::<String, Vec<u64>>::new();
    for (aggregate, seq, _) in receiver.applied() {
        by.entry(aggregate).or_default().push(seq);
    }
    by
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn unknown_outcomes_are_reconciled_under_the_same_event_id_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Behaviour {
        slow_attempts: 2,
        delay: Duration::from_millis(1500),
    })
    .unwrap();
    let mut entries = Vec::new();
    for (aggregate, count) in [("checkout:c-1", 3), ("checkout:c-2", 2)] {
        for seq in 1..=count {
            entries.push(intent(
                aggregate,
                seq,
                "payments",
                json!({"amount": seq * 10}),
            ));
        }
    }
    entries.push(intent("checkout:c-3", 1, "nowhere", json!({})));
    let outbox = FakeOutbox::start(entries.clone(), Some(PEER_TOKEN.into()));
    let peer = peer_file(dir.path());
    let mut node = relay(
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_twopc")),
        dir.path(),
        &outbox,
        &[format!("payments={}", receiver.url())],
        &[
            "--peer-token-file",
            &peer,
            "--poll-ms",
            "100",
            "--attempt-timeout-ms",
            "300",
            "--backoff-base-ms",
            "50",
            "--backoff-max-ms",
            "200",
        ],
        Vec::new(),
    );
    node.wait_ready(Duration::from_secs(60)).unwrap();
    let relayed: Vec<&str> = entries[..5].iter().map(|e| e.event_id.as_str()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let done = outbox
            .entries()
            .iter()
            .filter(|e| e.state == IntentState::Delivered)
            .count();
        if done == relayed.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, metrics) = http_get(node.spec().addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    node.terminate(Duration::from_secs(10));
    let log = node.log();

    let effects = receiver.effects();
    for event_id in &relayed {
        assert_eq!(
            effects.get(*event_id),
            Some(&1),
            "{event_id}: effect once\n{log}"
        );
    }
    assert_eq!(effects.len(), relayed.len(), "nothing else had an effect");
    let received = receiver.received();
    for request in &received {
        assert_eq!(
            request.key.as_deref(),
            Some(request.delivery.event_id.as_str())
        );
        assert!(
            relayed.contains(&request.delivery.event_id.as_str()),
            "{request:?}"
        );
        assert_eq!(request.delivery.source, "orders");
    }
    for event_id in &relayed {
        let times = received
            .iter()
            .filter(|r| r.delivery.event_id == *event_id)
            .count();
        assert!(
            times >= 3,
            "{event_id} was sent {times} times: two too late, then answered"
        );
    }
    let order = applied_by_aggregate(&receiver);
    assert_eq!(order["checkout:c-1"], [1, 2, 3]);
    assert_eq!(order["checkout:c-2"], [1, 2]);

    let outbox_now = outbox.entries();
    for entry in &outbox_now[..5] {
        assert_eq!(entry.state, IntentState::Delivered, "{entry:?}\n{log}");
        assert_eq!(
            entry.answer.as_ref().unwrap()["authorization"],
            format!("auth-{}", entry.event_id),
            "the receiver's answer is what was reported"
        );
    }
    let unknown_target = &outbox_now[5];
    assert_eq!(
        unknown_target.state,
        IntentState::Pending,
        "never refused for a relay's configuration"
    );
    assert!(
        unknown_target
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("no target named"),
        "{unknown_target:?}"
    );
    let reports = outbox.reports();
    for event_id in &relayed {
        let attempts = reports
            .iter()
            .filter(|(id, kind, _)| id == event_id && kind == "attempt")
            .count();
        assert!(
            attempts >= 2,
            "{event_id}: {attempts} attempt reports\n{reports:?}"
        );
    }
    assert!(
        metric(
            &metrics,
            "twopc_relay_deliveries_total{target=\"payments\",result=\"unknown\"}"
        ) >= 10
    );
    assert!(
        metric(
            &metrics,
            "twopc_relay_deliveries_total{target=\"payments\",result=\"delivered\"}"
        ) >= 5
    );
    assert_eq!(
        metric(
            &metrics,
            "twopc_relay_deliveries_total{target=\"payments\",result=\"failed\"}"
        ),
        0
    );
}

#[test]
fn a_relay_killed_between_delivery_and_report_delivers_again_under_the_same_id() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Behaviour::default()).unwrap();
    let entries = vec![
        intent("checkout:c-1", 1, "payments", json!({"amount": 10})),
        intent("checkout:c-1", 2, "payments", json!({"amount": 20})),
    ];
    let outbox = FakeOutbox::start(entries, None);
    let targets = [format!("payments={}", receiver.url())];
    let flags = [
        "--poll-ms",
        "100",
        "--backoff-base-ms",
        "50",
        "--backoff-max-ms",
        "200",
    ];
    let armed = vec![(
        "FAILPOINTS".to_string(),
        format!("{}=return", relay::crash::AFTER_DELIVERY_BEFORE_MARK),
    )];
    let mut node = relay(
        failpoints_binary(),
        dir.path(),
        &outbox,
        &targets,
        &flags,
        armed,
    );
    let status = node.wait_exit(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| !s.success()),
        "the relay aborts at its crash point: {status:?}\n{}",
        node.log()
    );

    // The receiver has the first event; the outbox does not know it was delivered.
    assert_eq!(receiver.effects().get("checkout-c-1-1"), Some(&1));
    assert!(
        !receiver.effects().contains_key("checkout-c-1-2"),
        "the next seq waits for the mark"
    );
    assert!(
        outbox
            .entries()
            .iter()
            .all(|e| e.state == IntentState::Pending)
    );

    node.set_env(Vec::new());
    node.restart();
    node.wait_ready(Duration::from_secs(60)).unwrap();
    assert!(
        outbox.wait_all_delivered(Duration::from_secs(60)),
        "{}",
        node.log()
    );
    node.terminate(Duration::from_secs(10));

    let effects = receiver.effects();
    assert_eq!(
        effects.get("checkout-c-1-1"),
        Some(&1),
        "the repeat had no second effect"
    );
    assert_eq!(effects.get("checkout-c-1-2"), Some(&1));
    let repeats = receiver
        .received()
        .iter()
        .filter(|r| r.delivery.event_id == "checkout-c-1-1")
        .count();
    assert!(
        repeats >= 2,
        "delivered again after the restart, under the same id ({repeats})"
    );
    assert_eq!(applied_by_aggregate(&receiver)["checkout:c-1"], [1, 2]);
}
