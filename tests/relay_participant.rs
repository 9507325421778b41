//! `twopc relay` end to end with the real `twopc participant` outbox (issue 29): checkout steps
//! written with their intents (`POST /v1/kv`), relayed to the reference receiver
//! (cluster::receiver), reported back, and listed delivered with the receiver's answer:
//! - the receiver answers too late for every event's first attempt: the outcome is unknown,
//!   reconciled under the same `event_id` (`payment_unknown -> reconciliation_pending`, then
//!   the receiver's answer), with one effect per event and each aggregate's order kept;
//! - the relay (failpoints build) dies at `relay::after_delivery_before_mark`; restarted, it
//!   delivers the event again under its id, the receiver answers without a second effect, and
//!   the participant ends with every intent delivered.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use chaos_tests::binary::failpoints_binary;
use cluster::node::{Node, NodeSpec, free_port};
use cluster::receiver::{Behaviour, Receiver};
use protocol::auth::Kind;
use serde_json::{Value, json};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn participant(dir: &Path) -> Node {
    let port = free_port();
    let mut node = Node::start(NodeSpec {
        name: "orders".into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args: vec![
            "participant".into(),
            "--name".into(),
            "orders".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            dir.join("data").display().to_string(),
        ],
        env: Vec::new(),
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join("orders.log"),
        tokens: cluster::auth::for_test(dir),
    });
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    node
}

fn relay(
    binary: std::path::PathBuf,
    dir: &Path,
    orders: &Node,
    receiver: &Receiver,
    env: Vec<(String, String)>,
) -> Node {
    let port = free_port();
    let mut args: Vec<String> = [
        "relay",
        "--participant",
        &format!("orders={}", orders.url()),
        "--target",
        &format!("payments={}", receiver.url()),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--poll-ms",
        "100",
        "--attempt-timeout-ms",
        "400",
        "--backoff-base-ms",
        "50",
        "--backoff-max-ms",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(tokens) = orders.tokens() {
        args.extend([
            "--peer-token-file".into(),
            tokens.path(Kind::Peer).display().to_string(),
        ]);
    }
    Node::start(NodeSpec {
        name: "relay".into(),
        binary,
        args,
        env,
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join("relay.log"),
        tokens: None,
    })
}

/// One checkout step of `aggregate` with its one intent (`{aggregate}-{n}`).
async fn write_step(orders: &Node, aggregate: &str, n: u64) {
    let event_id = format!("{}-{n}", aggregate.replace(':', "-"));
    let body = json!({
        "op_id": format!("w-{event_id}"),
        "ops": [{"op": "put", "key": aggregate, "value": {"step": n}}],
        "next": [{"event_id": event_id, "aggregate": aggregate, "target": "payments",
                  "type": "payment.authorize.v1", "body": {"amount": n * 10}}],
    });
    let response = orders
        .http_as(Kind::Client)
        .post(format!("{}/v1/kv", orders.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
}

async fn outbox(orders: &Node, state: &str) -> Value {
    orders
        .http_as(Kind::Operator)
        .get(format!("{}/v1/outbox?state={state}", orders.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until `count` intents are delivered and none is open; the delivered listing.
async fn wait_delivered(orders: &Node, count: usize, relay: &Node) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open = outbox(orders, "open").await;
        let delivered = outbox(orders, "delivered").await;
        let done = delivered["intents"].as_array().map_or(0, Vec::len);
        if done == count && open["intents"].as_array().is_some_and(Vec::is_empty) {
            return delivered;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered in time: open {open}\nrelay log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn order(receiver: &Receiver) -> BTreeMap<String, Vec<u64>> {
    let mut by = BTreeMap::<String, Vec<u64>>::new();
    for (aggregate, seq, _) in receiver.applied() {
        by.entry(aggregate).or_default().push(seq);
    }
    by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participants_intents_are_delivered_in_order_through_unknown_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let orders = participant(dir.path());
    let receiver = Receiver::start(Behaviour {
        slow_attempts: 1,
        delay: Duration::from_millis(1200),
    })
    .unwrap();
    for n in 1..=2 {
        write_step(&orders, "checkout:c-1", n).await;
    }
    write_step(&orders, "checkout:c-2", 1).await;
    let mut node = relay(
        env!("CARGO_BIN_EXE_twopc").into(),
        dir.path(),
        &orders,
        &receiver,
        Vec::new(),
    );
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    // Steps written while the relay runs are picked up by its polls.
    write_step(&orders, "checkout:c-1", 3).await;
    write_step(&orders, "checkout:c-2", 2).await;

    let delivered = wait_delivered(&orders, 5, &node).await;
    blocking(|| node.terminate(Duration::from_secs(10)));
    let effects = receiver.effects();
    assert_eq!(effects.len(), 5);
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    assert_eq!(order(&receiver)["checkout:c-1"], [1, 2, 3]);
    assert_eq!(order(&receiver)["checkout:c-2"], [1, 2]);
    for entry in delivered["intents"].as_array().unwrap() {
        let event_id = entry["event_id"].as_str().unwrap();
        assert_eq!(
            entry["answer"]["authorization"],
            format!("auth-{event_id}"),
            "{entry}"
        );
        assert!(
            entry["attempts"].as_u64().unwrap() >= 2,
            "an unknown, then the answer: {entry}"
        );
        let sent = receiver
            .received()
            .iter()
            .filter(|r| r.delivery.event_id == event_id)
            .count();
        assert!(sent >= 2, "{event_id}: sent {sent} times");
    }
    for request in receiver.received() {
        assert_eq!(
            request.key.as_deref(),
            Some(request.delivery.event_id.as_str())
        );
        assert_eq!(request.delivery.source, "orders");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_before_its_report_leaves_the_participant_pending_and_redelivers() {
    let dir = tempfile::tempdir().unwrap();
    let orders = participant(dir.path());
    let receiver = Receiver::start(Behaviour::default()).unwrap();
    write_step(&orders, "checkout:c-1", 1).await;
    write_step(&orders, "checkout:c-1", 2).await;
    let armed = vec![(
        "FAILPOINTS".to_string(),
        format!("{}=return", relay::crash::AFTER_DELIVERY_BEFORE_MARK),
    )];
    let binary = blocking(failpoints_binary);
    let mut node = relay(binary, dir.path(), &orders, &receiver, armed);
    let status = blocking(|| node.wait_exit(Duration::from_secs(60)));
    assert!(
        status.is_some_and(|s| !s.success()),
        "{status:?}\n{}",
        node.log()
    );
    assert_eq!(receiver.effects().get("checkout-c-1-1"), Some(&1));
    let open = outbox(&orders, "open").await;
    let states: Vec<&str> = open["intents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        ["pending", "pending"],
        "the receiver has it; the outbox does not know"
    );

    node.set_env(Vec::new());
    node.restart();
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    let delivered = wait_delivered(&orders, 2, &node).await;
    blocking(|| node.terminate(Duration::from_secs(10)));
    assert_eq!(
        receiver.effects().get("checkout-c-1-1"),
        Some(&1),
        "no second effect"
    );
    assert_eq!(receiver.effects().get("checkout-c-1-2"), Some(&1));
    assert_eq!(order(&receiver)["checkout:c-1"], [1, 2]);
    let again = receiver
        .received()
        .iter()
        .filter(|r| r.delivery.event_id == "checkout-c-1-1")
        .count();
    assert!(
        again >= 2,
        "delivered again under the same id after the restart"
    );
    assert_eq!(
        delivered["intents"][0]["answer"]["authorization"],
        "auth-checkout-c-1-1"
    );
}
