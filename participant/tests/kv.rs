//! The reference KV participant through its HTTP app (`Router::oneshot`): every op, every
//! reason for a no vote, lock conflicts, committed-only reads and bad payloads.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use participant::kv::{KvStore, routes};
use participant::{Participant, ParticipantConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

struct Kv {
    app: Router,
    _participant: Participant<KvStore>,
    _dir: tempfile::TempDir,
}

fn kv(seed: Value) -> Kv {
    let dir = tempfile::tempdir().unwrap();
    let seed = KvStore::from_seed(seed.to_string().as_bytes()).unwrap();
    let mut config = ParticipantConfig::new(dir.path());
    // A conflicting prepare waits this long for the holder, then votes no (lock_timeout).
    config.engine.lock_wait_max_ms = 100;
    let participant = Participant::open(config, || seed).unwrap();
    Kv {
        app: routes::app(&participant),
        _participant: participant,
        _dir: dir,
    }
}

async fn call(app: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path);
    let body = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            Body::from(body.to_string())
        }
        None => Body::empty(),
    };
    let response = app
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
}

/// A prepare body for `txid`'s attempt (see `common::gtid`) from c1 at epoch 1.
fn prepare_body(txid: &str, payload: Value) -> Value {
    serde_json::to_value(common::prepare(txid, 1, payload)).unwrap()
}

async fn prepare(app: &Router, txid: &str, ops: Value) -> (StatusCode, Value) {
    let body = prepare_body(txid, json!({"ops": ops}));
    call(app, "POST", "/2pc/prepare", Some(body)).await
}

/// A prepare that names its start time, as the coordinator does: lock waits order attempts by
/// it, and one left to the arrival clock ties with another in the same millisecond.
async fn prepare_started_at(
    app: &Router,
    txid: &str,
    ops: Value,
    started_at_ms: u64,
) -> (StatusCode, Value) {
    let mut body = prepare_body(txid, json!({"ops": ops}));
    body["started_at_ms"] = json!(started_at_ms);
    call(app, "POST", "/2pc/prepare", Some(body)).await
}

async fn decide(app: &Router, what: &str, txid: &str) -> (StatusCode, Value) {
    let body = serde_json::to_value(common::decision(txid, 1)).unwrap();
    call(app, "POST", &format!("/2pc/{what}"), Some(body)).await
}

async fn get(app: &Router, key: &str) -> (StatusCode, Value) {
    call(app, "GET", &format!("/v1/kv/{key}"), None).await
}

async fn no_reason(app: &Router, txid: &str, ops: Value) -> String {
    let (status, vote) = prepare(app, txid, ops).await;
    assert_eq!(status, StatusCode::OK, "{vote}");
    assert_eq!(vote["vote"], "no", "{vote}");
    vote["reason"].as_str().unwrap().to_string()
}

async fn commit_ops(app: &Router, txid: &str, ops: Value) {
    let (status, vote) = prepare(app, txid, ops).await;
    assert_eq!((status, vote), (StatusCode::OK, json!({"vote": "yes"})));
    let (status, ack) = decide(app, "commit", txid).await;
    assert_eq!((status, ack), (StatusCode::OK, json!({"ack": true})));
}

#[tokio::test]
async fn each_op_applies_on_commit() {
    let kv = kv(json!({"stock": 5, "gone": "x"}));
    let app = &kv.app;
    assert_eq!(
        get(app, "stock").await.1,
        json!({"key": "stock", "value": 5, "version": 1})
    );
    commit_ops(
        app,
        "t1",
        json!([
            {"op": "put", "key": "name", "value": {"first": "ada"}},
            {"op": "delete", "key": "gone"},
            {"op": "add", "key": "stock", "delta": -2, "min": 0},
            {"op": "add", "key": "fresh", "delta": 7},
            {"op": "check", "key": "stock", "version": 2}
        ]),
    )
    .await;
    assert_eq!(
        get(app, "name").await.1,
        json!({"key": "name", "value": {"first": "ada"}, "version": 1})
    );
    assert_eq!(
        get(app, "stock").await.1,
        json!({"key": "stock", "value": 3, "version": 2})
    );
    assert_eq!(get(app, "fresh").await.1["value"], 7);
    let (status, body) = get(app, "gone").await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    // check on an absent key is version 0.
    commit_ops(
        app,
        "t2",
        json!([{"op": "check", "key": "gone", "version": 0}]),
    )
    .await;
}

#[tokio::test]
async fn each_reason_for_a_no_vote() {
    let kv = kv(json!({"stock": 1, "label": "text"}));
    let app = &kv.app;
    let reason = no_reason(
        app,
        "min",
        json!([{"op": "add", "key": "stock", "delta": -2, "min": 0}]),
    )
    .await;
    assert!(reason.contains("below its min 0"), "{reason}");
    let reason = no_reason(
        app,
        "chk",
        json!([{"op": "check", "key": "stock", "version": 9}]),
    )
    .await;
    assert!(reason.contains("version 1, not 9"), "{reason}");
    let reason = no_reason(
        app,
        "nan",
        json!([{"op": "add", "key": "label", "delta": 1}]),
    )
    .await;
    assert!(reason.contains("not an integer"), "{reason}");
    let reason = no_reason(
        app,
        "ovf",
        json!([{"op": "put", "key": "big", "value": i64::MAX}, {"op": "add", "key": "big", "delta": 1}]),
    )
    .await;
    assert!(reason.contains("overflows"), "{reason}");
    // Ops are simulated in order: two decrements of 1 cross min together.
    let reason = no_reason(
        app,
        "two",
        json!([{"op": "add", "key": "stock", "delta": -1, "min": 0}, {"op": "add", "key": "stock", "delta": -1, "min": 0}]),
    )
    .await;
    assert!(reason.contains("from 0 to -1"), "{reason}");
    assert_eq!(
        get(app, "stock").await.1["value"],
        1,
        "no vote changed nothing"
    );
    let (_, prepared) = call(app, "GET", "/v1/prepared", None).await;
    assert_eq!(prepared, json!({"prepared": []}));
}

#[tokio::test]
async fn lock_conflict_and_committed_only_reads() {
    let kv = kv(json!({"stock": 10}));
    let app = &kv.app;
    let (_, vote) = prepare_started_at(
        app,
        "holder",
        json!([{"op": "add", "key": "stock", "delta": -3}]),
        1_000,
    )
    .await;
    assert_eq!(vote, json!({"vote": "yes"}));
    // Prepared data is invisible to reads.
    assert_eq!(get(app, "stock").await.1["value"], 10);
    let (_, prepared) = call(app, "GET", "/v1/prepared", None).await;
    assert_eq!(prepared["prepared"][0]["txid"], "holder");
    let holder = common::gtid("holder");
    assert_eq!(prepared["prepared"][0]["gtid"], holder.as_str());
    assert_eq!(prepared["prepared"][0]["keys"], json!(["stock"]));
    let (status, vote) = prepare_started_at(
        app,
        "other",
        json!([{"op": "put", "key": "stock", "value": 1}]),
        2_000,
    )
    .await;
    assert_eq!(
        (status, &vote["vote"]),
        (StatusCode::OK, &json!("no")),
        "{vote}"
    );
    let reason = vote["reason"].as_str().unwrap_or_default();
    // It waited for the (older) holder until its deadline, with no decision coming.
    assert!(
        reason.starts_with("lock_timeout:")
            && reason.contains("\"stock\"")
            && reason.contains(holder.as_str()),
        "{reason}"
    );
    decide(app, "commit", "holder").await;
    assert_eq!(
        get(app, "stock").await.1,
        json!({"key": "stock", "value": 7, "version": 2})
    );
    // The lock is gone with the decision.
    commit_ops(
        app,
        "after",
        json!([{"op": "put", "key": "stock", "value": 1}]),
    )
    .await;
    // An abort releases without applying.
    prepare(app, "undone", json!([{"op": "delete", "key": "stock"}])).await;
    decide(app, "abort", "undone").await;
    assert_eq!(get(app, "stock").await.1["value"], 1);
}

#[tokio::test]
async fn bad_payloads_get_clear_errors_and_change_nothing() {
    let kv = kv(json!({"stock": 10}));
    let app = &kv.app;
    let cases = [
        (
            json!({"ops": [{"op": "frobnicate", "key": "k"}]}),
            "unknown variant",
        ),
        (
            json!({"ops": [{"op": "put", "key": "k"}]}),
            "missing field `value`",
        ),
        (
            json!({"ops": [{"op": "add", "key": "stock", "delta": "1"}]}),
            "invalid type",
        ),
        (
            json!({"ops": [{"op": "check", "key": "stock", "version": -1}]}),
            "invalid value",
        ),
        (json!({"opz": []}), "unknown field"),
        (
            json!({"ops": [{"op": "put", "key": "", "value": 1}]}),
            "empty",
        ),
        (
            json!({"ops": [{"op": "put", "key": "k".repeat(257), "value": 1}]}),
            "the limit is 256",
        ),
        (
            json!({"ops": vec![json!({"op": "delete", "key": "k"}); 65]}),
            "the limit is 64",
        ),
    ];
    for (i, (payload, expected)) in cases.into_iter().enumerate() {
        let body = prepare_body(&format!("bad{i}"), payload);
        let (status, error) = call(app, "POST", "/2pc/prepare", Some(body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
        assert_eq!(error["error"], "invalid_payload");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{message} lacks {expected}");
    }
    let huge = json!({"ops": [{"op": "put", "key": "k", "value": "x".repeat(65 * 1024)}]});
    let body = prepare_body("huge", huge);
    let (status, error) = call(app, "POST", "/2pc/prepare", Some(body)).await;
    assert_eq!(
        (status, error["error"].clone()),
        (StatusCode::PAYLOAD_TOO_LARGE, json!("payload_too_large"))
    );
    assert_eq!(
        get(app, "stock").await.1,
        json!({"key": "stock", "value": 10, "version": 1})
    );
    assert_eq!(
        call(app, "GET", "/v1/prepared", None).await.1,
        json!({"prepared": []})
    );
    // The invalid txids left no trace: the same ids can prepare properly.
    commit_ops(
        app,
        "bad0",
        json!([{"op": "add", "key": "stock", "delta": 1}]),
    )
    .await;
}
