//! Fenced writes at the reference KV participant (`PUT /v1/kv/{key}`) and the `fence` op
//! inside 2PC payloads: stale tokens refused with `highest`, equal tokens allowed, repeated
//! op ids answered with their first answer and applied once, all of it across restarts.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use participant::kv::{KvStore, routes};
use participant::{Participant, ParticipantConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

fn open(dir: &std::path::Path, checkpoint_every: u64) -> (Router, Participant<KvStore>) {
    let mut config = ParticipantConfig::new(dir);
    config.checkpoint_every_records = checkpoint_every;
    config.engine.lock_wait_max_ms = 0;
    let participant = Participant::open(config, KvStore::new).unwrap();
    (routes::app(&participant), participant)
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
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn put(
    app: &Router,
    key: &str,
    value: Value,
    token: u64,
    op_id: &str,
) -> (StatusCode, Value) {
    let body = json!({"value": value, "fence": {"resource": "orders-partition-3", "token": token}, "op_id": op_id});
    call(app, "PUT", &format!("/v1/kv/{key}"), Some(body)).await
}

#[tokio::test]
async fn the_stale_owner_loses_and_repeats_get_their_first_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _p) = open(dir.path(), 10_000);
    let (status, a) = put(&app, "k", json!("a-1"), 41, "a-1").await;
    assert_eq!(
        (status, a.clone()),
        (
            StatusCode::OK,
            json!({"key": "k", "version": 1, "token": 41})
        )
    );
    // The current owner writes again under the same token.
    let (status, a2) = put(&app, "k", json!("a-2"), 41, "a-2").await;
    assert_eq!((status, a2["version"].as_u64()), (StatusCode::OK, Some(2)));
    let (status, b) = put(&app, "k", json!("b-1"), 42, "b-1").await;
    assert_eq!((status, b["token"].as_u64()), (StatusCode::OK, Some(42)));
    // A's delayed write: stale, with the highest accepted.
    let (status, stale) = put(&app, "k", json!("a-late"), 41, "a-3").await;
    assert_eq!(
        (status, stale["error"].as_str(), stale["highest"].as_u64()),
        (StatusCode::CONFLICT, Some("stale_token"), Some(42)),
        "{stale}"
    );
    // A retry of A's first write (same op id) answers the first answer, applies nothing.
    let (status, again) = put(&app, "k", json!("a-1"), 41, "a-1").await;
    assert_eq!((status, again), (StatusCode::OK, a));
    let (_, stale_again) = put(&app, "k", json!("a-late"), 41, "a-3").await;
    assert_eq!(stale_again["error"].as_str(), Some("stale_token"));
    let (_, stored) = call(&app, "GET", "/v1/kv/k", None).await;
    assert_eq!(stored, json!({"key": "k", "value": "b-1", "version": 3}));
}

#[tokio::test]
async fn tokens_values_and_answers_survive_restarts_with_and_without_checkpoints() {
    for checkpoint_every in [1, 10_000] {
        let dir = tempfile::tempdir().unwrap();
        let first = {
            let (app, p) = open(dir.path(), checkpoint_every);
            let (_, first) = put(&app, "k", json!(1), 5, "w-1").await;
            put(&app, "k", json!(2), 6, "w-2").await;
            p.close();
            first
        };
        let (app, p) = open(dir.path(), checkpoint_every);
        let (status, again) = put(&app, "k", json!(1), 5, "w-1").await;
        assert_eq!(
            (status, again),
            (StatusCode::OK, first),
            "checkpoint every {checkpoint_every}"
        );
        let (status, stale) = put(&app, "k", json!(9), 5, "w-3").await;
        assert_eq!(
            (status, stale["highest"].as_u64()),
            (StatusCode::CONFLICT, Some(6))
        );
        let (_, stored) = call(&app, "GET", "/v1/kv/k", None).await;
        assert_eq!(
            (stored["value"].clone(), stored["version"].as_u64()),
            (json!(2), Some(2))
        );
        assert_eq!(
            p.with_engine(|e| e.fences().highest("orders-partition-3")),
            Some(6)
        );
        p.close();
    }
}

#[tokio::test]
async fn a_fence_op_in_a_2pc_payload_votes_no_on_a_stale_token_and_raises_it_on_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _p) = open(dir.path(), 10_000);
    put(&app, "k", json!("b"), 42, "b-1").await;
    let fenced = |token: u64| {
        json!({"ops": [
            {"op": "fence", "resource": "orders-partition-3", "token": token},
            {"op": "put", "key": "k", "value": format!("tx-{token}")}
        ]})
    };
    let body = serde_json::to_value(common::prepare("t-stale", 1, fenced(41))).unwrap();
    let (status, vote) = call(&app, "POST", "/2pc/prepare", Some(body)).await;
    assert_eq!(
        (status, vote["vote"].as_str()),
        (StatusCode::OK, Some("no")),
        "{vote}"
    );
    assert!(
        vote["reason"].as_str().unwrap().contains("stale_token"),
        "{vote}"
    );

    let body = serde_json::to_value(common::prepare("t-new", 1, fenced(43))).unwrap();
    let (_, vote) = call(&app, "POST", "/2pc/prepare", Some(body)).await;
    assert_eq!(vote["vote"].as_str(), Some("yes"), "{vote}");
    // While it is prepared, a fenced write on its key or its fenced resource waits its turn.
    let (status, locked) = put(&app, "other", json!(1), 50, "w-locked").await;
    assert_eq!(
        (status, locked["error"].as_str()),
        (StatusCode::CONFLICT, Some("key_locked")),
        "{locked}"
    );
    let body = serde_json::to_value(common::decision("t-new", 1)).unwrap();
    let (status, _) = call(&app, "POST", "/2pc/commit", Some(body)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, stale) = put(&app, "k", json!("b-late"), 42, "b-2").await;
    assert_eq!(
        (status, stale["highest"].as_u64()),
        (StatusCode::CONFLICT, Some(43)),
        "{stale}"
    );
    let (_, stored) = call(&app, "GET", "/v1/kv/k", None).await;
    assert_eq!(stored["value"], json!("tx-43"));
}

#[tokio::test]
async fn bad_fenced_writes_are_clear_4xx_json_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _p) = open(dir.path(), 10_000);
    let cases = [
        (
            json!({"value": 1, "fence": {"resource": "r", "token": "7"}, "op_id": "w"}),
            400,
            "malformed_json",
        ),
        (
            json!({"value": 1, "fence": {"resource": "r", "token": -1}, "op_id": "w"}),
            400,
            "malformed_json",
        ),
        (json!({"value": 1, "op_id": "w"}), 400, "malformed_json"),
        (
            json!({"value": 1, "fence": {"resource": "r", "token": 7}}),
            400,
            "malformed_json",
        ),
        (
            json!({"value": 1, "fence": {"resource": "r", "token": 7}, "op_id": ""}),
            422,
            "invalid_id",
        ),
        (
            json!({"value": 1, "fence": {"resource": "a b", "token": 7}, "op_id": "w"}),
            422,
            "invalid_id",
        ),
        (
            json!({"value": 1, "fence": {"resource": "r", "token": 7}, "op_id": "x".repeat(129)}),
            422,
            "invalid_id",
        ),
    ];
    for (body, status, code) in cases {
        let (got, answer) = call(&app, "PUT", "/v1/kv/k", Some(body.clone())).await;
        assert_eq!(
            (got.as_u16(), answer["error"].as_str()),
            (status, Some(code)),
            "{body}: {answer}"
        );
    }
    let long_key = format!("/v1/kv/{}", "k".repeat(300));
    let (got, answer) = call(
        &app,
        "PUT",
        &long_key,
        Some(json!({"value": 1, "fence": {"resource": "r", "token": 7}, "op_id": "w"})),
    )
    .await;
    assert_eq!(
        (got.as_u16(), answer["error"].as_str()),
        (422, Some("invalid_payload")),
        "{answer}"
    );
    let body = serde_json::to_value(common::prepare(
        "t-bad",
        1,
        json!({"ops": [{"op": "fence", "resource": "r", "token": "x"}]}),
    ))
    .unwrap();
    let (got, answer) = call(&app, "POST", "/2pc/prepare", Some(body)).await;
    assert_eq!(
        (got.as_u16(), answer["error"].as_str()),
        (422, Some("invalid_payload")),
        "{answer}"
    );
    let (status, _) = call(&app, "GET", "/v1/kv/k", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");
}
