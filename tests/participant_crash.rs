//! Crash points of the reference participant with the real binary (built with the
//! `failpoints` feature): the process aborts at the named point, restarts on the same data
//! directory, and the promise it made (or did not make) still holds.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use cluster::node::{Node, NodeSpec, free_port};
use serde_json::{Value, json};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn participant(dir: &Path, coordinator: Option<&str>, failpoint: &str) -> Node {
    std::fs::write(dir.join("seed.json"), r#"{"stock": 10}"#).unwrap();
    let port = free_port();
    let mut args: Vec<String> = [
        "participant",
        "--name",
        "inventory",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        &dir.join("data").display().to_string(),
        "--seed",
        &dir.join("seed.json").display().to_string(),
        "--in-doubt-after-ms",
        "200",
        "--decision-backoff-base-ms",
        "50",
        "--decision-backoff-max-ms",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(url) = coordinator {
        args.extend(["--coordinator".to_string(), url.to_string()]);
    }
    let mut node = Node::start(NodeSpec {
        name: "inventory".into(),
        binary: failpoints_binary(),
        args,
        env: vec![("FAILPOINTS".into(), format!("{failpoint}=return"))],
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join("inventory.log"),
        tokens: cluster::auth::for_test(dir),
    });
    blocking(|| node.wait_ready(Duration::from_secs(60))).unwrap();
    node
}

/// Restarts a node that crashed at its crash point, with the crash point disarmed.
fn restart_disarmed(node: &mut Node) {
    let status = blocking(|| node.wait_exit(Duration::from_secs(10)));
    assert!(
        status.is_some_and(|s| !s.success()),
        "expected the crash point to abort the process; log:\n{}",
        node.log()
    );
    node.set_env(Vec::new());
    node.restart();
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
}

async fn post(node: &Node, path: &str, body: Value) -> Result<(u16, Value), reqwest::Error> {
    let response = node
        .http_as(protocol::auth::Kind::Peer)
        .post(format!("{}{path}", node.url()))
        .json(&body)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

async fn get(node: &Node, path: &str) -> Value {
    node.http()
        .get(format!("{}{path}", node.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The stub coordinator's identity: one run (incarnation 1) at epoch 1.
const COORDINATOR_ID: &str = "coord-a";
const INCARNATION: &str = "0000000000000001";

/// The attempt the stub coordinator began as `position` of its run: `{id}:{incarnation}:{pos}`.
fn gtid(position: u64) -> String {
    format!("{COORDINATOR_ID}:{INCARNATION}:{position}")
}

fn prepare_body(txid: &str, position: u64, delta: i64) -> Value {
    json!({"txid": txid, "gtid": gtid(position), "coordinator_id": COORDINATOR_ID, "epoch": 1,
           "incarnation": INCARNATION, "position": position,
           "payload": {"ops": [{"op": "add", "key": "stock", "delta": delta, "min": 0}]}})
}

fn decision_body(txid: &str, position: u64) -> Value {
    json!({"txid": txid, "gtid": gtid(position), "coordinator_id": COORDINATOR_ID, "epoch": 1,
           "incarnation": INCARNATION})
}

/// A stub coordinator answering decision queries with whatever `answer` holds, as the real one
/// does (its id, epoch and incarnation, and a reason for `unknown`); it records each query
/// string in `asked`.
async fn stub_coordinator(
    answer: Arc<Mutex<&'static str>>,
    asked: Arc<Mutex<Vec<String>>>,
) -> String {
    let app = axum::Router::new().route(
        "/v1/transactions/{id}/decision",
        axum::routing::get(
            move |axum::extract::RawQuery(query): axum::extract::RawQuery| async move {
                asked.lock().unwrap().push(query.unwrap_or_default());
                let decision = *answer.lock().unwrap();
                let reason = (decision == "unknown").then_some("this log holds no such run");
                axum::Json(
                    json!({"decision": decision, "coordinator_id": COORDINATOR_ID,
                                  "epoch": 1, "incarnation": INCARNATION, "reason": reason}),
                )
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn poll(what: &str, node: &Node, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..1000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}; log:\n{}", node.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_prepared_durable_stays_prepared_and_resolves_by_asking() {
    let answer = Arc::new(Mutex::new("pending"));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let url = stub_coordinator(answer.clone(), asked.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut node = participant(
        dir.path(),
        Some(&url),
        "participant::after_prepared_durable",
    );

    // The prepared record is durable, but the process dies before the vote leaves.
    assert!(
        post(&node, "/2pc/prepare", prepare_body("t1", 1, -3))
            .await
            .is_err()
    );
    restart_disarmed(&mut node);

    let prepared = get(&node, "/v1/prepared").await;
    let entry = &prepared["prepared"][0];
    assert_eq!(entry["txid"], "t1", "{prepared}");
    assert_eq!(entry["gtid"], gtid(1), "{prepared}");
    assert_eq!(
        (&entry["incarnation"], &entry["position"]),
        (&json!(INCARNATION), &json!(1)),
        "{prepared}"
    );
    assert_eq!(entry["keys"], json!(["stock"]));
    assert_eq!(
        get(&node, "/v1/kv/stock").await["value"],
        10,
        "prepared is not visible"
    );
    let (status, vote) = post(&node, "/2pc/prepare", prepare_body("t2", 2, -1))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(vote["vote"], "no", "the key stays locked: {vote}");
    // The lock holder is named by its attempt (the id the participant keys it by).
    assert!(
        vote["reason"].as_str().unwrap().contains(&gtid(1)),
        "{vote}"
    );

    // `pending` is asked again later; it never decides alone.
    poll("two decision queries", &node, async || {
        asked.lock().unwrap().len() >= 2
    })
    .await;
    // Each query names the attempt as it was prepared.
    let expected = format!(
        "gtid={}&incarnation={INCARNATION}&epoch=1&position=1",
        gtid(1)
    );
    for query in asked.lock().unwrap().iter() {
        assert_eq!(query, &expected);
    }
    let prepared = get(&node, "/v1/prepared").await;
    assert_eq!(prepared["prepared"].as_array().unwrap().len(), 1);
    assert_eq!(
        prepared["prepared"][0]["last_answer"], "pending",
        "{prepared}"
    );
    assert_eq!(get(&node, "/v1/kv/stock").await["value"], 10);

    // `unknown` (the coordinator's log cannot prove an outcome) is no decision either: it stays
    // prepared, asks again, and shows the answer with its reason.
    let before = asked.lock().unwrap().len();
    *answer.lock().unwrap() = "unknown";
    poll("two unknown answers", &node, async || {
        asked.lock().unwrap().len() >= before + 2
    })
    .await;
    let prepared = get(&node, "/v1/prepared").await;
    assert_eq!(prepared["prepared"].as_array().unwrap().len(), 1);
    let last = prepared["prepared"][0]["last_answer"]
        .as_str()
        .unwrap_or("");
    assert!(
        last.starts_with("unknown") && last.contains("this log holds no such run"),
        "{prepared}"
    );
    assert_eq!(get(&node, "/v1/kv/stock").await["value"], 10);

    *answer.lock().unwrap() = "commit";
    poll("the commit to apply", &node, async || {
        get(&node, "/v1/kv/stock").await["value"] == 7
    })
    .await;
    assert_eq!(get(&node, "/v1/prepared").await, json!({"prepared": []}));
    // The coordinator's own resend is acked without applying again.
    assert_eq!(
        post(&node, "/2pc/commit", decision_body("t1", 1))
            .await
            .unwrap(),
        (200, json!({"ack": true}))
    );
    assert_eq!(get(&node, "/v1/kv/stock").await["value"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_commit_logged_applies_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = participant(dir.path(), None, "participant::after_commit_logged");
    let (_, vote) = post(&node, "/2pc/prepare", prepare_body("t1", 1, -1))
        .await
        .unwrap();
    assert_eq!(vote, json!({"vote": "yes"}));
    // The commit record is durable, the ack never leaves.
    assert!(
        post(&node, "/2pc/commit", decision_body("t1", 1))
            .await
            .is_err()
    );
    restart_disarmed(&mut node);

    assert_eq!(
        get(&node, "/v1/kv/stock").await,
        json!({"key": "stock", "value": 9, "version": 2})
    );
    assert_eq!(get(&node, "/v1/prepared").await, json!({"prepared": []}));
    // The coordinator resends the commit it never saw acked: acked, not applied twice.
    assert_eq!(
        post(&node, "/2pc/commit", decision_body("t1", 1))
            .await
            .unwrap(),
        (200, json!({"ack": true}))
    );
    let status = blocking(|| node.terminate(Duration::from_secs(10)));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM exits 0");
    node.restart();
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    assert_eq!(
        get(&node, "/v1/kv/stock").await,
        json!({"key": "stock", "value": 9, "version": 2})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_prepared_durable_leaves_nothing_and_the_abort_fences_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = participant(dir.path(), None, "participant::before_prepared_durable");
    assert!(
        post(&node, "/2pc/prepare", prepare_body("t1", 1, -3))
            .await
            .is_err()
    );
    restart_disarmed(&mut node);
    assert_eq!(get(&node, "/v1/prepared").await, json!({"prepared": []}));
    assert_eq!(get(&node, "/v1/kv/stock").await["value"], 10);
    // The coordinator saw no vote and aborts; a late retry of the prepare then votes no.
    assert_eq!(
        post(&node, "/2pc/abort", decision_body("t1", 1))
            .await
            .unwrap(),
        (200, json!({"ack": true}))
    );
    let (_, vote) = post(&node, "/2pc/prepare", prepare_body("t1", 1, -3))
        .await
        .unwrap();
    assert_eq!(vote["vote"], "no", "{vote}");
    assert_eq!(get(&node, "/v1/kv/stock").await["value"], 10);
}
