//! Issue 25, item 5, over HTTP: the saga barrier keeps each coordinator's steps apart
//! (`GET /saga/ops/{op_id}?coordinator_id=..`), refuses a question that names no coordinator
//! when it holds someone's op on the step, and refuses an op id reused with another payload
//! (409 `op_id_conflict`), before and after a restart.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::Tally;
use http_body_util::BodyExt;
use participant::{Participant, ParticipantConfig, finish};
use protocol::digest::Digest;
use serde_json::{Value, json};
use tower::ServiceExt;

fn open(dir: &std::path::Path) -> (Router, Participant<Tally>) {
    let participant = Participant::open(ParticipantConfig::new(dir), Tally::default).unwrap();
    (finish(participant.router()), participant)
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn action(app: &Router, coordinator: &str, n: i64) -> (StatusCode, Value) {
    let body = json!({"saga_id": "s1", "step": "reserve", "op_id": "s1:reserve:action",
        "coordinator_id": coordinator, "epoch": 1, "payload": {"key": "a", "n": n}});
    let request = Request::post("/saga/action")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    send(app, request).await
}

async fn get(app: &Router, path: &str) -> (StatusCode, Value) {
    send(app, Request::get(path).body(Body::empty()).unwrap()).await
}

fn digest_of(n: i64) -> String {
    String::from(Digest::of_payload(&json!({"key": "a", "n": n})))
}

/// Everything a coordinator can ask about `s1:reserve:action`, with the answer expected.
async fn check_answers(app: &Router) {
    let op = "/saga/ops/s1:reserve:action";
    let done = (
        StatusCode::OK,
        json!({"op_id": "s1:reserve:action", "status": "done"}),
    );
    assert_eq!(get(app, &format!("{op}?coordinator_id=c-a")).await, done);
    assert_eq!(
        get(
            app,
            &format!("{op}?coordinator_id=c-a&payload_digest={}", digest_of(3))
        )
        .await,
        done
    );
    assert_eq!(get(app, &format!("{op}?coordinator_id=c-b")).await, done);
    assert_eq!(
        get(app, &format!("{op}?coordinator_id=c-c")).await,
        (
            StatusCode::OK,
            json!({"op_id": "s1:reserve:action", "status": "not_found"})
        ),
        "c-c never sent it: c-a's and c-b's steps are not c-c's answer"
    );
    let (status, body) = get(
        app,
        &format!("{op}?coordinator_id=c-a&payload_digest={}", digest_of(4)),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("op_id_conflict")),
        "{body}"
    );
    // An older coordinator's question: there are entries, and nobody can say whose.
    let (status, body) = get(app, op).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("coordinator_id_required")
        ),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("coordinator_id"),
        "{body}"
    );
}

#[tokio::test]
async fn each_coordinator_hears_about_its_own_op_and_a_reused_op_id_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let (app, participant) = open(dir.path());
    // Nothing recorded: every asker, with a coordinator id or without, hears not_found.
    for path in [
        "/saga/ops/s1:reserve:action",
        "/saga/ops/s1:reserve:action?coordinator_id=c-a",
    ] {
        assert_eq!(
            get(&app, path).await,
            (
                StatusCode::OK,
                json!({"op_id": "s1:reserve:action", "status": "not_found"})
            ),
            "{path}"
        );
    }
    assert_eq!(
        action(&app, "c-a", 3).await,
        (StatusCode::OK, json!({"status": "done"}))
    );
    // The same op id from c-a with another payload: refused, nothing applied.
    let (status, body) = action(&app, "c-a", 4).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("op_id_conflict")),
        "{body}"
    );
    assert_eq!(participant.read(|t| t.counts["a"]), 3);
    // A second coordinator reusing the saga id: its own op, applied.
    assert_eq!(
        action(&app, "c-b", 5).await,
        (StatusCode::OK, json!({"status": "done"}))
    );
    assert_eq!(participant.read(|t| (t.counts["a"], t.applied)), (8, 2));
    check_answers(&app).await;

    // After a restart (the log replayed), the same answers.
    participant.close();
    drop((app, participant));
    let (app, participant) = open(dir.path());
    assert_eq!(participant.read(|t| t.counts["a"]), 8);
    check_answers(&app).await;
    let (status, _) = action(&app, "c-a", 4).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        action(&app, "c-b", 5).await,
        (StatusCode::OK, json!({"status": "done"}))
    );
    assert_eq!(participant.read(|t| t.applied), 2, "nothing applied again");
}

#[tokio::test]
async fn a_bad_op_query_is_400_invalid_query() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _participant) = open(dir.path());
    for query in [
        "coordinator_id=a%20b",
        "coordinator_id=",
        "payload_digest=xyz",
        "coordinator_id=c-a&unknown=1",
    ] {
        let (status, body) = get(&app, &format!("/saga/ops/s1:reserve:action?{query}")).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_query")),
            "{query}: {body}"
        );
    }
}
