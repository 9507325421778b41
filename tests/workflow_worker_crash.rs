//! The workflow worker's crash boundary "after the local transaction" (issue 29), with real
//! processes: worker A is SIGKILLed right after the write of its first transition was answered
//! (checkout c-1 `created -> stock_reserved`, its stock op and its payment intent in one forced
//! record). Worker B takes the lease once A's TTL has run out and continues from the stored
//! state: it never repeats the reservation or the intent, the relay delivers the one intent,
//! and both checkouts end confirmed with the stock taken once each.
//!
//! The other boundaries are covered where they live: after delivery and before the relay's
//! report by tests/relay_process.rs and tests/relay_participant.rs (a relay killed before its
//! report redelivers under the same id), after the report by chaos-tests' crash matrix
//! (`participant_after_intent_delivered_logged`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::node::{Node, NodeSpec, free_port};
use cluster::receiver::{Behaviour, Payments, Receiver};
use cluster::workflow::{self, Checkout, State};
use protocol::auth::Kind;
use serde_json::Value;

const TTL_MS: u64 = 1000;

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A worker process whose JSON event lines arrive on the channel.
fn worker(
    cluster: &LocalCluster,
    shop: &str,
    holder: &str,
    extra: &[&str],
) -> (Child, mpsc::Receiver<Value>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_twopc"));
    command
        .args([
            "workflow-worker",
            "--coordinator",
            &cluster.coordinator_url(),
        ])
        .args(["--participant", shop, "--holder", holder])
        .args(["--ttl-ms", &TTL_MS.to_string()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(tokens) = &cluster.tokens {
        command.arg("--token-file").arg(tokens.path(Kind::Operator));
    }
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(event) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(event);
            }
        }
    });
    (child, rx)
}

fn next(events: &mpsc::Receiver<Value>, kind: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = events
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no {kind} event in 30 s"));
        if event["event"] == kind {
            return event;
        }
    }
}

async fn read(client: &reqwest::Client, url: String) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

async fn checkout(client: &reqwest::Client, shop: &str, id: &str) -> (Checkout, u64) {
    let entry = read(
        client,
        format!("{shop}/v1/kv/{}", workflow::checkout_key(id)),
    )
    .await;
    let checkout = serde_json::from_value(entry["value"].clone()).unwrap();
    (checkout, entry["version"].as_u64().unwrap())
}

async fn intents_of(client: &reqwest::Client, shop: &str, id: &str) -> Vec<Value> {
    let aggregate = workflow::checkout_key(id);
    let mut all = Vec::new();
    for state in ["open", "delivered"] {
        let list = read(
            client,
            format!("{shop}/v1/outbox?state={state}&aggregate={aggregate}"),
        )
        .await;
        all.extend(list["intents"].as_array().cloned().unwrap_or_default());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_its_write_is_followed_without_a_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ClusterSpec {
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        data_dir: dir.path().to_path_buf(),
        participants: vec!["shop".into()],
        seeds: Vec::new(),
        coordinator_flags: Vec::new(),
        participant_flags: Vec::new(),
        env: Vec::new(),
        postgres_args: Vec::new(),
    };
    let mut cluster = blocking(|| LocalCluster::start(&spec)).unwrap();
    let shop = cluster.participant_url("shop").unwrap();
    let client = cluster.participants[0].1.http_as(Kind::Operator);
    let receiver = Receiver::start_payments(
        Behaviour::default(),
        Payments {
            balances: [("alice".to_string(), 100)].into_iter().collect(),
            ..Payments::default()
        },
    )
    .unwrap();
    let checkouts: Vec<(String, Checkout)> = ["c-1", "c-2"]
        .iter()
        .map(|id| (id.to_string(), Checkout::new("sku-1", 30, "alice")))
        .collect();
    let seed = workflow::seed("seed", &[("sku-1".into(), 10)], &checkouts);
    let response = client
        .post(format!("{shop}/v1/kv"))
        .json(&seed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let (mut a, a_events) = worker(&cluster, &shop, "worker-a", &["--hang-after-writes", "1"]);
    let a_token = next(&a_events, "acquired")["token"].as_u64().unwrap();
    let moved = next(&a_events, "moved");
    assert_eq!(moved["to"], "stock_reserved", "{moved}");
    next(&a_events, "hanging");
    // SIGKILL right after the answer: the transition is durable, nothing after it happened.
    a.kill().unwrap();
    a.wait().unwrap();
    let killed = Instant::now();
    let id = moved["checkout"].as_str().unwrap().to_string();
    let (stored, _) = checkout(&client, &shop, &id).await;
    assert_eq!(stored.state, State::StockReserved);
    assert_eq!(intents_of(&client, &shop, &id).await.len(), 1);

    // The relay comes up only now: the intent waited, pending, in the outbox.
    let port = free_port();
    let mut args: Vec<String> = vec![
        "relay".into(),
        "--participant".into(),
        format!("shop={shop}"),
        "--target".into(),
        format!("payments={}", receiver.url()),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--poll-ms".into(),
        "100".into(),
    ];
    if let Some(tokens) = &cluster.tokens {
        args.extend([
            "--peer-token-file".into(),
            tokens.path(Kind::Peer).display().to_string(),
        ]);
    }
    let mut relay = Node::start(NodeSpec {
        name: "relay".into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args,
        env: Vec::new(),
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.path().join("relay.log"),
        tokens: None,
    });
    blocking(|| relay.wait_ready(Duration::from_secs(30))).unwrap();

    let (mut b, b_events) = worker(&cluster, &shop, "worker-b", &[]);
    let b_token = next(&b_events, "acquired")["token"].as_u64().unwrap();
    assert_eq!(b_token, a_token + 1);
    assert!(
        killed.elapsed() >= Duration::from_millis(TTL_MS / 2),
        "B took the lease before A's could have run out"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (c1, _) = checkout(&client, &shop, "c-1").await;
        let (c2, _) = checkout(&client, &shop, "c-2").await;
        if c1.state == State::Confirmed && c2.state == State::Confirmed {
            break;
        }
        assert!(Instant::now() < deadline, "not confirmed: {c1:?} {c2:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = b.kill();
    let _ = b.wait();
    blocking(|| relay.terminate(Duration::from_secs(5)));

    let (c, _) = checkout(&client, &shop, &id).await;
    let path: Vec<(State, u64)> = c.history.iter().map(|s| (s.to, s.token)).collect();
    assert_eq!(
        path,
        [
            (State::StockReserved, a_token),
            (State::PaymentAuthorized, b_token),
            (State::Confirmed, b_token)
        ],
        "A's transition stands, B continued from it without repeating it"
    );
    let intents = intents_of(&client, &shop, &id).await;
    assert_eq!(intents.len(), 1, "{intents:?}");
    assert_eq!(intents[0]["event_id"], workflow::payment_event_id(&id));
    assert_eq!(intents[0]["seq"], 1);
    assert_eq!(intents[0]["state"], "delivered");
    let effects = receiver.effects();
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    let stock = read(&client, format!("{shop}/v1/kv/stock:sku-1")).await;
    assert_eq!(stock["value"], 8, "each checkout took one unit, once");
    assert_eq!(receiver.balances()["alice"], 40);
    blocking(|| cluster.stop());
}
