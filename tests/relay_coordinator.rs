//! `twopc relay` with a coordinator target, end to end: a participant's intents are
//! transaction requests without an id; the relay submits each to the real coordinator under
//! `id = event_id`, so the transaction is the event's. A committed and an aborted outcome are
//! both deliveries (the coordinator's answer is recorded in the outbox); an `event_id` the
//! coordinator already holds with another body is refused for good (409 `id_conflict`) and the
//! intent is `failed`, holding its aggregate back.

use std::path::Path;
use std::time::{Duration, Instant};

use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::node::{Node, NodeSpec, free_port};
use protocol::auth::Kind;
use serde_json::{Value, json};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn transfer(delta: i64) -> Value {
    json!({"participants": [{"name": "payments", "payload": {"ops": [
        {"op": "add", "key": "balance:alice", "delta": delta, "min": 0}
    ]}}]})
}

async fn call(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn relay(dir: &Path, cluster: &LocalCluster, orders: &str) -> Node {
    let port = free_port();
    let mut args: Vec<String> = [
        "relay",
        "--participant",
        &format!("orders={orders}"),
        "--target",
        "checkout=coordinator-transactions",
        "--coordinator",
        &cluster.coordinator_url(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--poll-ms",
        "100",
        "--backoff-base-ms",
        "50",
        "--backoff-max-ms",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(tokens) = &cluster.tokens {
        for (flag, kind) in [
            ("--peer-token-file", Kind::Peer),
            ("--client-token-file", Kind::Client),
        ] {
            args.extend([flag.to_string(), tokens.path(kind).display().to_string()]);
        }
    }
    Node::start(NodeSpec {
        name: "relay".into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args,
        env: Vec::new(),
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join("relay.log"),
        tokens: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intents_become_transactions_under_their_event_ids() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ClusterSpec {
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        data_dir: dir.path().join("cluster"),
        participants: vec!["orders".into(), "payments".into()],
        postgres_args: Vec::new(),
        seeds: vec![("payments".into(), json!({"balance:alice": 100}))],
        coordinator_flags: Vec::new(),
        participant_flags: Vec::new(),
        env: Vec::new(),
    };
    let mut cluster = blocking(|| LocalCluster::start(&spec)).unwrap();
    let coordinator = cluster.coordinator_url();
    let orders_url = cluster.participant_url("orders").unwrap();
    let payments_url = cluster.participant_url("payments").unwrap();
    let orders = cluster.participant("orders").unwrap();
    let client = orders.http_as(Kind::Client);
    let operator = orders.http();

    // The id evt-conflict is taken at the coordinator by another transaction.
    let taken = json!({"id": "evt-conflict", "participants": [{"name": "payments", "payload": {"ops": []}}]});
    let (status, body) = call(
        operator
            .post(format!("{coordinator}/v1/transactions"))
            .json(&taken),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // c-1: pay 30 (commits), then 500 (aborts: the balance would go below 0). c-2: the taken id.
    let intents = [
        ("evt-pay-1", "checkout:c-1", transfer(-30)),
        ("evt-pay-2", "checkout:c-1", transfer(-500)),
        ("evt-conflict", "checkout:c-2", transfer(-1)),
    ];
    for (event_id, aggregate, body) in &intents {
        let write = json!({"op_id": format!("w-{event_id}"),
            "ops": [{"op": "put", "key": aggregate, "value": "payment_requested"}],
            "next": [{"event_id": event_id, "aggregate": aggregate, "target": "checkout",
                      "type": "payment.transfer.v1", "body": body}]});
        let (status, answer) = call(client.post(format!("{orders_url}/v1/kv")).json(&write)).await;
        assert_eq!(status, 200, "{answer}");
    }

    let mut node = relay(dir.path(), &cluster, &orders_url);
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let list = loop {
        let (_, list) = call(operator.get(format!("{orders_url}/v1/outbox?state=open"))).await;
        let open: Vec<(String, String)> = list["intents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["event_id"].as_str().unwrap().into(),
                    e["state"].as_str().unwrap().into(),
                )
            })
            .collect();
        if open == [("evt-conflict".to_string(), "failed".to_string())] {
            break list;
        }
        assert!(Instant::now() < deadline, "open: {open:?}\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        list["intents"][0]["last_error"]
            .as_str()
            .unwrap()
            .contains("id_conflict"),
        "{list}"
    );
    let (_, delivered) =
        call(operator.get(format!("{orders_url}/v1/outbox?state=delivered"))).await;
    let answers: Vec<(String, String)> = delivered["intents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(
                e["answer"]["id"], e["event_id"],
                "the transaction is the event's: {e}"
            );
            (
                e["event_id"].as_str().unwrap().into(),
                e["answer"]["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        answers,
        [
            ("evt-pay-1".into(), "committed".into()),
            ("evt-pay-2".into(), "aborted".into())
        ]
    );
    // The coordinator holds each under the event's id; the money moved once.
    for (event_id, outcome) in [("evt-pay-1", "committed"), ("evt-pay-2", "aborted")] {
        let (status, tx) =
            call(operator.get(format!("{coordinator}/v1/transactions/{event_id}"))).await;
        assert_eq!(
            (status, tx["outcome"].as_str()),
            (200, Some(outcome)),
            "{tx}"
        );
    }
    let (_, balance) = call(operator.get(format!("{payments_url}/v1/kv/balance:alice"))).await;
    assert_eq!(balance["value"], 70, "{balance}");
    blocking(|| node.terminate(Duration::from_secs(10)));
    cluster.stop();
}
