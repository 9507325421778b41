//! The outbox at `twopc participant` as a process (issue 29; docs/participants.md, "The
//! outbox"): a write with its next intents (`POST /v1/kv`), the listing, relays' reports and
//! operators' actions, each route's access class, bad inputs answered with a status and a JSON
//! error, the metrics, and everything as it was after a restart.

use std::path::Path;
use std::time::Duration;

use cluster::node::{Node, NodeSpec, free_port};
use protocol::auth::Kind;
use serde_json::{Value, json};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn spec(dir: &Path) -> NodeSpec {
    let port = free_port();
    NodeSpec {
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
            "--outbox-retention-ms".into(),
            "3600000".into(),
        ],
        env: Vec::new(),
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join("orders.log"),
        tokens: cluster::auth::for_test(dir),
    }
}

async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(node: &Node, kind: Kind, path: &str) -> (u16, Value) {
    send(node.http_as(kind).get(format!("{}{path}", node.url()))).await
}

async fn post(node: &Node, kind: Kind, path: &str, body: Value) -> (u16, Value) {
    send(
        node.http_as(kind)
            .post(format!("{}{path}", node.url()))
            .json(&body),
    )
    .await
}

fn intent(event_id: &str, aggregate: &str) -> Value {
    json!({"event_id": event_id, "aggregate": aggregate, "target": "payments",
           "type": "payment.authorize.v1", "body": {"for": event_id}})
}

/// The checkout's step: `created -> stock_reserved` only if the order is still at version
/// `version`, with the intents it leads to.
fn step(op_id: &str, version: u64, next: Vec<Value>) -> Value {
    json!({"op_id": op_id,
           "ops": [{"op": "check", "key": "checkout:c-1", "version": version},
                   {"op": "put", "key": "checkout:c-1", "value": "stock_reserved"},
                   {"op": "put", "key": "stock:sku-1", "value": 9}],
           "next": next})
}

fn assert_error(what: &str, (status, body): &(u16, Value), want: (u16, &str)) {
    assert_eq!(
        (*status, body["error"].as_str()),
        (want.0, Some(want.1)),
        "{what}: {body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {body}"
    );
}

fn states(list: &Value) -> Vec<(String, String, u64)> {
    list["intents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_id"].as_str().unwrap().to_string(),
                e["state"].as_str().unwrap().to_string(),
                e["seq"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_record_intents_relays_report_operators_act_and_a_restart_keeps_it_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(spec(dir.path()));
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();

    // The write and its intents, in one step.
    let next = vec![
        intent("e-1", "checkout:c-1"),
        intent("e-2", "checkout:c-1"),
        intent("e-3", "checkout:c-2"),
    ];
    let first = post(&node, Kind::Client, "/v1/kv", step("w-1", 0, next.clone())).await;
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(
        first.1,
        json!({"op_id": "w-1",
               "written": [{"key": "checkout:c-1", "version": 1},
                           {"key": "stock:sku-1", "version": 1}],
               "intents": [{"event_id": "e-1", "aggregate": "checkout:c-1", "seq": 1},
                           {"event_id": "e-2", "aggregate": "checkout:c-1", "seq": 2},
                           {"event_id": "e-3", "aggregate": "checkout:c-2", "seq": 1}]})
    );
    let again = post(&node, Kind::Client, "/v1/kv", step("w-1", 0, next.clone())).await;
    assert_eq!(again, first, "a repeated op id answers the first answer");

    // Refusals: nothing written, no intent recorded, each with its status and error.
    let stale = post(
        &node,
        Kind::Client,
        "/v1/kv",
        step("w-2", 0, vec![intent("e-4", "x")]),
    );
    assert_error("a failed check", &stale.await, (409, "condition_failed"));
    let reused = post(
        &node,
        Kind::Client,
        "/v1/kv",
        step("w-3", 1, vec![intent("e-2", "x")]),
    );
    assert_error("a reused event id", &reused.await, (409, "id_conflict"));
    let twice = step("w-4", 1, vec![intent("e-5", "x"), intent("e-5", "x")]);
    assert_error(
        "an event id twice",
        &post(&node, Kind::Client, "/v1/kv", twice).await,
        (422, "invalid_payload"),
    );
    let bad_id = step("w-5", 1, vec![intent("e 6", "x")]);
    assert_error(
        "a bad event id",
        &post(&node, Kind::Client, "/v1/kv", bad_id).await,
        (422, "invalid_id"),
    );
    let many = step(
        "w-6",
        1,
        (0..17).map(|i| intent(&format!("m-{i}"), "x")).collect(),
    );
    assert_error(
        "too many intents",
        &post(&node, Kind::Client, "/v1/kv", many).await,
        (422, "invalid_payload"),
    );
    let url_target = json!({"op_id": "w-7", "ops": [], "next": [{"event_id": "e-7",
        "aggregate": "x", "target": "http://evil.example/", "type": "t"}]});
    assert_error(
        "a URL as target",
        &post(&node, Kind::Client, "/v1/kv", url_target).await,
        (422, "invalid_id"),
    );
    assert_error(
        "an unknown field",
        &post(
            &node,
            Kind::Client,
            "/v1/kv",
            json!({"op_id": "w-8", "ops": [], "x": 1}),
        )
        .await,
        (400, "malformed_json"),
    );
    let (_, stored) = get(&node, Kind::Client, "/v1/kv/checkout:c-1").await;
    assert_eq!(stored["version"], 1, "{stored}");

    // Access classes: writes are clients', the outbox is read by peers (relays) and
    // operators, reported on by peers, retried and marked by operators.
    let anonymous = reqwest::Client::new();
    let (status, _) = send(anonymous.get(format!("{}/v1/outbox", node.url()))).await;
    assert_eq!(status, 401);
    assert_error(
        "a client listing",
        &get(&node, Kind::Client, "/v1/outbox").await,
        (403, "forbidden"),
    );
    let delivered = json!({"answer": {"authorization": "a-1"}});
    assert_error(
        "an operator's delivered report",
        &post(
            &node,
            Kind::Operator,
            "/v1/outbox/e-1/delivered",
            delivered.clone(),
        )
        .await,
        (403, "forbidden"),
    );
    let retry = json!({"operator": "olga", "reason": "receiver fixed"});
    assert_error(
        "a relay's retry",
        &post(&node, Kind::Peer, "/v1/outbox/e-1/retry", retry.clone()).await,
        (403, "forbidden"),
    );

    // The listing: write order, ages, counts, filters, limits.
    let (status, open) = get(&node, Kind::Peer, "/v1/outbox?state=open").await;
    assert_eq!(status, 200, "{open}");
    let want = |e: &str, s: &str, q: u64| (e.to_string(), s.to_string(), q);
    assert_eq!(
        states(&open),
        [
            want("e-1", "pending", 1),
            want("e-2", "pending", 2),
            want("e-3", "pending", 1)
        ]
    );
    assert_eq!(
        (open["pending"].as_u64(), open["truncated"].as_bool()),
        (Some(3), Some(false))
    );
    assert!(open["intents"][0]["age_ms"].as_u64().is_some(), "{open}");
    assert!(open["oldest_pending_age_ms"].as_u64().is_some(), "{open}");
    let (_, cut) = get(
        &node,
        Kind::Operator,
        "/v1/outbox?limit=1&aggregate=checkout:c-1",
    )
    .await;
    assert_eq!(
        (states(&cut).len(), cut["truncated"].as_bool()),
        (1, Some(true))
    );
    for bad in ["state=lost", "limit=0", "color=red", "aggregate=a%20b"] {
        assert_error(
            bad,
            &get(&node, Kind::Peer, &format!("/v1/outbox?{bad}")).await,
            (400, "invalid_query"),
        );
    }
    let (status, one) = get(&node, Kind::Peer, "/v1/outbox/e-2").await;
    assert_eq!((status, one["op_id"].as_str()), (200, Some("w-1")), "{one}");
    assert_error(
        "no intent",
        &get(&node, Kind::Peer, "/v1/outbox/nope").await,
        (404, "not_found"),
    );

    // Reports: in order per aggregate, repeats answer the entry unchanged.
    assert_error(
        "delivered out of order",
        &post(
            &node,
            Kind::Peer,
            "/v1/outbox/e-2/delivered",
            delivered.clone(),
        )
        .await,
        (409, "intent_out_of_order"),
    );
    let (status, e1) = post(
        &node,
        Kind::Peer,
        "/v1/outbox/e-1/delivered",
        delivered.clone(),
    )
    .await;
    assert_eq!(
        (status, e1["state"].as_str()),
        (200, Some("delivered")),
        "{e1}"
    );
    assert_eq!(e1["answer"], json!({"authorization": "a-1"}));
    let (_, repeat) = post(&node, Kind::Peer, "/v1/outbox/e-1/delivered", json!({})).await;
    assert_eq!(
        repeat["answer"], e1["answer"],
        "a repeat changes nothing: {repeat}"
    );
    let refused = json!({"error": "422 card declined", "permanent": true});
    let (status, e2) = post(&node, Kind::Peer, "/v1/outbox/e-2/attempt", refused).await;
    assert_eq!(
        (status, e2["state"].as_str()),
        (200, Some("failed")),
        "{e2}"
    );
    assert_eq!(e2["last_error"], "422 card declined");

    // Operators: audited retry and mark.
    assert_error(
        "a retry without a reason",
        &post(
            &node,
            Kind::Operator,
            "/v1/outbox/e-2/retry",
            json!({"operator": "olga", "reason": ""}),
        )
        .await,
        (422, "invalid_operator"),
    );
    let (status, retried) =
        post(&node, Kind::Operator, "/v1/outbox/e-2/retry", retry.clone()).await;
    assert_eq!(
        (status, retried["state"].as_str()),
        (200, Some("pending")),
        "{retried}"
    );
    assert_eq!(retried["marks"][0]["action"], "retry");
    assert_error(
        "a retry of a pending intent",
        &post(&node, Kind::Operator, "/v1/outbox/e-2/retry", retry).await,
        (409, "not_pending"),
    );
    assert_error(
        "a mark without a state",
        &post(
            &node,
            Kind::Operator,
            "/v1/outbox/e-3/mark",
            json!({"operator": "olga", "reason": "r"}),
        )
        .await,
        (422, "invalid_payload"),
    );
    let abandon = json!({"operator": "olga", "reason": "refunded by hand", "state": "abandoned"});
    let (status, e3) = post(
        &node,
        Kind::Operator,
        "/v1/outbox/e-3/mark",
        abandon.clone(),
    )
    .await;
    assert_eq!(
        (status, e3["state"].as_str()),
        (200, Some("abandoned")),
        "{e3}"
    );
    assert_error(
        "a mark of a settled intent",
        &post(&node, Kind::Operator, "/v1/outbox/e-3/mark", abandon).await,
        (409, "not_pending"),
    );

    let text = node
        .http_as(Kind::Metrics)
        .get(format!("{}/metrics", node.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "twopc_participant_outbox_intents_written_total 3\n",
        "twopc_participant_outbox_delivered_total 1\n",
        "twopc_participant_outbox_attempts_failed_total 1\n",
        "twopc_participant_outbox_pending 1\n",
        "twopc_participant_outbox_failed 0\n",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }

    // A restart (SIGKILL: no clean shutdown) keeps every write, intent, report and mark.
    let (_, before) = get(&node, Kind::Operator, "/v1/outbox").await;
    node.kill();
    node.restart();
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    let (_, after) = get(&node, Kind::Operator, "/v1/outbox").await;
    let strip = |list: &Value| {
        let mut list = list.clone();
        for entry in list["intents"].as_array_mut().unwrap() {
            entry.as_object_mut().unwrap().remove("age_ms");
        }
        list.as_object_mut()
            .unwrap()
            .remove("oldest_pending_age_ms");
        list
    };
    assert_eq!(strip(&after), strip(&before));
    let again = post(&node, Kind::Client, "/v1/kv", step("w-1", 0, next)).await;
    assert_eq!(again, first, "the op id's answer outlives the restart");
    let (_, stored) = get(&node, Kind::Client, "/v1/kv/checkout:c-1").await;
    assert_eq!(stored["version"], 1, "applied once: {stored}");
    // Seqs go on where they stopped.
    let (status, later) = post(
        &node,
        Kind::Client,
        "/v1/kv",
        step("w-9", 1, vec![intent("e-9", "checkout:c-1")]),
    )
    .await;
    assert_eq!(
        (status, later["intents"][0]["seq"].as_u64()),
        (200, Some(3)),
        "{later}"
    );
}
