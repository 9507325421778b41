//! Requests the `participant_messages` fuzz target (fuzz/, docs/fuzzing.md) found, minimized
//! and inlined. Each got an answer outside the contract (every bad input: a status and the
//! JSON body `{"error", "message"}`).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use participant::kv::{KvStore, routes};
use participant::{Participant, ParticipantConfig};
use serde_json::Value;
use tower::ServiceExt;

/// Found as `GET /v1/attempts/Y-see::00.00000000f%ed::1`: a path parameter whose
/// percent-encoding is not UTF-8 got axum's plain-text 400 ("Invalid URL: Invalid UTF-8 in
/// `gtid`"). Every route with a path parameter now answers 422 `invalid_id` in JSON.
#[tokio::test]
async fn a_path_parameter_that_is_not_utf8_gets_the_json_error() {
    let dir = tempfile::tempdir().unwrap();
    let participant = Participant::open(ParticipantConfig::new(dir.path()), KvStore::new).unwrap();
    let app = routes::app(&participant);
    for (method, path) in [
        ("GET", "/v1/attempts/Y-see::00.00000000f%ed::1"),
        ("GET", "/saga/ops/op-%ed"),
        ("GET", "/v1/kv/key-%ed"),
        ("PUT", "/v1/kv/key-%ed"),
    ] {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"value":1,"fence":{"resource":"r","token":1},"op_id":"o"}"#,
            ))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {bytes:?}"));
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_id")),
            "{method} {path}: {body}"
        );
        assert!(body["message"].is_string(), "{method} {path}: {body}");
    }
}
