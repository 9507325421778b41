//! The library's HTTP surface through `Router::oneshot`: protocol routes, error bodies and
//! statuses, health, readiness and metrics.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::Tally;
use http_body_util::BodyExt;
use participant::{Participant, ParticipantConfig, finish};
use serde_json::{Value, json};
use tower::ServiceExt;

fn app() -> (Router, Participant<Tally>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let participant =
        Participant::open(ParticipantConfig::new(dir.path()), Tally::default).unwrap();
    (finish(participant.router()), participant, dir)
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn post(app: &Router, path: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let (status, text) = send(app, request).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn protocol_round_trip_over_http() {
    let (app, participant, _dir) = app();
    let prepare =
        json!({"txid": "t1", "coordinator_id": "c1", "epoch": 1, "payload": {"key": "a", "n": 4}});
    assert_eq!(
        post(&app, "/2pc/prepare", &prepare.to_string()).await,
        (StatusCode::OK, json!({"vote": "yes"}))
    );
    let decision = json!({"txid": "t1", "coordinator_id": "c1", "epoch": 1}).to_string();
    assert_eq!(
        post(&app, "/2pc/commit", &decision).await,
        (StatusCode::OK, json!({"ack": true}))
    );
    assert_eq!(
        post(&app, "/2pc/commit", &decision).await,
        (StatusCode::OK, json!({"ack": true}))
    );
    assert_eq!(participant.read(|t| t.counts["a"]), 4);
    let no =
        json!({"txid": "t2", "coordinator_id": "c1", "epoch": 1, "payload": {"key": "a", "n": -1}});
    assert_eq!(
        post(&app, "/2pc/prepare", &no.to_string()).await,
        (
            StatusCode::OK,
            json!({"vote": "no", "reason": "n -1 is negative"})
        )
    );
}

#[tokio::test]
async fn errors_have_the_contract_codes_and_statuses() {
    let (app, _participant, _dir) = app();
    let ghost = json!({"txid": "ghost", "coordinator_id": "c1", "epoch": 3}).to_string();
    let (status, body) = post(&app, "/2pc/commit", &ghost).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::CONFLICT, json!("not_prepared"))
    );
    let stale = json!({"txid": "t", "coordinator_id": "c1", "epoch": 2}).to_string();
    let (status, body) = post(&app, "/2pc/abort", &stale).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::CONFLICT, json!("stale_epoch"))
    );
    assert!(
        body["message"].as_str().unwrap().contains("epoch 3"),
        "{body}"
    );

    let (status, body) = post(&app, "/2pc/prepare", "{not json").await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::BAD_REQUEST, json!("malformed_json"))
    );
    let extra =
        json!({"txid": "t", "coordinator_id": "c1", "epoch": 3, "url": "http://evil"}).to_string();
    let (status, body) = post(&app, "/2pc/commit", &extra).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::BAD_REQUEST, json!("malformed_json"))
    );
    let bad_id = json!({"txid": "a/b", "coordinator_id": "c1", "epoch": 3}).to_string();
    assert_eq!(
        post(&app, "/2pc/abort", &bad_id).await.0,
        StatusCode::BAD_REQUEST
    );
    let invalid = json!({"txid": "t", "coordinator_id": "c1", "epoch": 3, "payload": {"key": 1}});
    let (status, body) = post(&app, "/2pc/prepare", &invalid.to_string()).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::UNPROCESSABLE_ENTITY, json!("invalid_payload"))
    );

    let huge = format!(
        "{{\"pad\": \"{}\"}}",
        "x".repeat(protocol::limits::BODY_BYTES_MAX)
    );
    let (status, body) = post(&app, "/2pc/prepare", &huge).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::PAYLOAD_TOO_LARGE, json!("body_too_large"))
    );

    let form = Request::post("/2pc/abort")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(ghost.clone()))
        .unwrap();
    let (status, text) = send(&app, form).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{text}");
    assert!(text.contains("unsupported_media_type"));

    let (status, text) = send(&app, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(text.contains("\"unknown_route\""), "{text}");
    let (status, text) = send(
        &app,
        Request::get("/2pc/prepare").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(text.contains("\"method_not_allowed\""), "{text}");
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let (app, _participant, _dir) = app();
    let get = |path: &'static str| Request::get(path).body(Body::empty()).unwrap();
    assert_eq!(
        send(&app, get("/healthz")).await,
        (StatusCode::OK, r#"{"status":"ok"}"#.to_string())
    );
    assert_eq!(send(&app, get("/readyz")).await.0, StatusCode::OK);
    let prepare =
        json!({"txid": "t1", "coordinator_id": "c1", "epoch": 1, "payload": {"key": "a", "n": 1}});
    post(&app, "/2pc/prepare", &prepare.to_string()).await;
    let (status, text) = send(&app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("twopc_participant_votes_total{vote=\"yes\"} 1"),
        "{text}"
    );
    assert!(text.contains("twopc_participant_prepared 1"), "{text}");
    assert!(text.contains("twopc_participant_locked_keys 1"), "{text}");
    assert!(
        text.contains("# TYPE twopc_wal_fsyncs_total counter"),
        "{text}"
    );
}
