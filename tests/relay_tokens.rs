//! `twopc relay`'s token files rotated in place and reread on SIGHUP (docs/security.md), as
//! on the coordinator and the participants: the relay keeps running, its reports carry the new
//! peer token, `/metrics` takes the new metrics token and refuses the old one, and a bad file
//! keeps the set in force. Against a fake participant outbox that takes one peer token at a
//! time (tests/relay_support) and the reference receiver.

mod relay_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::node::Node;
use cluster::receiver::{Behaviour, Receiver};
use relay_support::{FakeOutbox, intent, relay};
use serde_json::json;

const PEER_1: &str = "relay-rotation-peer-one-0123456789ab";
const PEER_2: &str = "relay-rotation-peer-two-0123456789ab";
const METRICS_1: &str = "relay-rotation-metrics-one-01234567";
const METRICS_2: &str = "relay-rotation-metrics-two-01234567";
const WAIT: Duration = Duration::from_secs(60);

fn write(file: &Path, token: &str) {
    std::fs::write(file, format!("# rotated by the test\n{token}\n")).unwrap();
}

fn hang_up(node: &Node) {
    let pid = node.pid().expect("running").to_string();
    let status = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(status.success());
}

/// The status of `GET /metrics` with `token` as a bearer token.
fn metrics_status(node: &Node, token: Option<&str>) -> u16 {
    let url = format!("http://{}/metrics", node.spec().addr);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut request = reqwest::Client::new().get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap().status().as_u16()
    })
}

/// Waits (bounded) until `/metrics` answers `token` with `status`.
fn wait_metrics(node: &Node, token: &str, status: u16) {
    let deadline = Instant::now() + WAIT;
    while metrics_status(node, Some(token)) != status {
        assert!(
            Instant::now() < deadline,
            "/metrics never answered {status}\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_relay_rereads_its_token_files_on_sighup_and_keeps_the_old_set_on_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Behaviour::default()).unwrap();
    let aggregate = "checkout:c-1";
    let outbox = FakeOutbox::start(
        vec![intent(aggregate, 1, "payments", json!({"amount": 10}))],
        Some(PEER_1.into()),
    );
    let (peer, metrics) = (
        dir.path().join("peer.tokens"),
        dir.path().join("metrics.tokens"),
    );
    write(&peer, PEER_1);
    write(&metrics, METRICS_1);
    let mut node = relay(
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_twopc")),
        dir.path(),
        &outbox,
        &[format!("payments={}", receiver.url())],
        &[
            "--peer-token-file",
            &peer.display().to_string(),
            "--metrics-token-file",
            &metrics.display().to_string(),
            "--poll-ms",
            "50",
        ],
        Vec::new(),
    );
    node.wait_ready(WAIT).unwrap();
    assert!(outbox.wait_all_delivered(WAIT), "{}", node.log());
    assert_eq!(metrics_status(&node, Some(METRICS_1)), 200);
    assert_eq!(metrics_status(&node, None), 401);

    // Rotation: the participant takes only the new peer token from now on, a new intent
    // waits, the files are rewritten in place, and the relay is told.
    outbox.require_peer(PEER_2);
    outbox.push(intent(aggregate, 2, "payments", json!({"amount": 20})));
    write(&peer, PEER_2);
    write(&metrics, METRICS_2);
    hang_up(&node);
    assert!(
        outbox.wait_all_delivered(WAIT),
        "the second intent is listed and reported with the new peer token\n{}",
        node.log()
    );
    wait_metrics(&node, METRICS_1, 401);
    assert_eq!(metrics_status(&node, Some(METRICS_2)), 200);
    assert!(node.is_running(), "SIGHUP must not stop the relay");

    // A bad file (a token too short): refused whole, the set in force stays.
    std::fs::write(&metrics, "abc\n").unwrap();
    hang_up(&node);
    let deadline = Instant::now() + WAIT;
    while !node.log().contains("token files refused") {
        assert!(Instant::now() < deadline, "{}", node.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metrics_status(&node, Some(METRICS_2)), 200);
    assert!(node.is_running());

    let effects = receiver.effects();
    for seq in 1..=2 {
        assert_eq!(
            effects.get(&format!("checkout-c-1-{seq}")),
            Some(&1),
            "{effects:?}"
        );
    }
    node.terminate(Duration::from_secs(10));
    let log = node.log();
    assert!(log.contains("SIGHUP: token files reloaded"), "{log}");
    for token in [PEER_1, PEER_2, METRICS_1, METRICS_2] {
        assert!(!log.contains(token), "a token is never logged:\n{log}");
    }
}
