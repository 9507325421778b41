//! HTTP tests through `Router::oneshot`: every bad input with its status and error code,
//! readiness, and the OpenAPI document against the routes actually served.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use protocol::ParticipantName;
use protocol::limits::{BODY_BYTES_MAX, PARTICIPANTS_MAX, PAYLOAD_BYTES_MAX, TIMEOUT_MS_MAX};

use super::{AppState, ROUTES, router};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::recover;

async fn ready_router() -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let participants: BTreeMap<_, _> = ["inventory", "payments"]
        .into_iter()
        // Port 9 (discard) on loopback: nothing listens; no test here reaches phase one.
        .map(|n| {
            (
                ParticipantName::new(n).unwrap(),
                "http://127.0.0.1:9".to_string(),
            )
        })
        .collect();
    let config = Config::for_tests(dir.path().to_path_buf(), participants);
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics));
    state.set_ready(recover(&config, metrics).await.unwrap());
    (router(state), dir)
}

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

fn two() -> Value {
    json!([{"name": "inventory", "payload": {"ops": []}}, {"name": "payments", "payload": {"ops": []}}])
}

const JSON: Option<&str> = Some("application/json");

#[tokio::test]
async fn every_bad_input_gets_its_status_and_code() {
    let (app, _dir) = ready_router().await;
    let many: Vec<Value> = (0..=PARTICIPANTS_MAX)
        .map(|i| json!({"name": format!("p{i}"), "payload": {}}))
        .collect();
    let big_payload = json!({"blob": "x".repeat(PAYLOAD_BYTES_MAX)});
    let body = |v: Value| serde_json::to_vec(&v).unwrap();
    let tx = "/v1/transactions";
    // (method, uri, content type, body, expected status, expected code)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "POST",
            tx,
            JSON,
            b"{not json".to_vec(),
            400,
            "malformed_json",
        ),
        ("POST", tx, JSON, Vec::new(), 400, "malformed_json"),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": "inventory"})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": [{"name": 1, "payload": {}}]})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": two(), "timeout_ms": "5"})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": two(), "timeout_ms": -1})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": two(), "url": "http://evil"})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            tx,
            JSON,
            body(
                json!({"participants": [{"name": "inventory", "payload": {}, "url": "http://evil:1"}]}),
            ),
            400,
            "malformed_json",
        ),
        ("POST", tx, JSON, body(json!([1, 2])), 400, "malformed_json"),
        (
            "POST",
            tx,
            Some("text/plain"),
            body(json!({"participants": two()})),
            415,
            "unsupported_media_type",
        ),
        (
            "POST",
            tx,
            None,
            body(json!({"participants": two()})),
            415,
            "unsupported_media_type",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": []})),
            422,
            "no_participants",
        ),
        (
            "POST",
            tx,
            JSON,
            body(
                json!({"participants": [{"name": "inventory", "payload": 1}, {"name": "inventory", "payload": 2}]}),
            ),
            422,
            "duplicate_participant",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": [{"name": "shipping", "payload": {}}]})),
            422,
            "unknown_participant",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": many})),
            422,
            "too_many_participants",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"id": "x".repeat(129), "participants": two()})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"id": "../etc/passwd", "participants": two()})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"id": "a b", "participants": two()})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"id": "", "participants": two()})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": [{"name": "in/ventory", "payload": {}}]})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": two(), "timeout_ms": 0})),
            422,
            "invalid_timeout",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": two(), "timeout_ms": TIMEOUT_MS_MAX + 1})),
            422,
            "invalid_timeout",
        ),
        (
            "POST",
            tx,
            JSON,
            body(json!({"participants": [{"name": "inventory", "payload": big_payload}]})),
            413,
            "payload_too_large",
        ),
        (
            "POST",
            tx,
            JSON,
            vec![b' '; BODY_BYTES_MAX + 1],
            413,
            "body_too_large",
        ),
        (
            "POST",
            "/v1/transactions?wait=forever",
            JSON,
            body(json!({"participants": two()})),
            400,
            "invalid_query",
        ),
        (
            "POST",
            "/v1/transactions?bogus=1",
            JSON,
            body(json!({"participants": two()})),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions?state=stuck",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions?limit=0",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions?limit=1000000",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions?limit=ten",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions?sort=asc",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions/never-seen",
            None,
            Vec::new(),
            404,
            "not_found",
        ),
        (
            "GET",
            "/v1/transactions/a%2Fb",
            None,
            Vec::new(),
            422,
            "invalid_id",
        ),
        (
            "GET",
            "/v1/transactions/a%20b/decision",
            None,
            Vec::new(),
            422,
            "invalid_id",
        ),
        ("DELETE", tx, None, Vec::new(), 405, "method_not_allowed"),
        (
            "PUT",
            "/v1/transactions/x",
            None,
            Vec::new(),
            405,
            "method_not_allowed",
        ),
        (
            "POST",
            "/healthz",
            None,
            Vec::new(),
            405,
            "method_not_allowed",
        ),
        (
            "GET",
            "/v2/transactions",
            None,
            Vec::new(),
            404,
            "unknown_route",
        ),
        (
            "GET",
            "/v1/transactions/x/decision/extra",
            None,
            Vec::new(),
            404,
            "unknown_route",
        ),
    ];
    for (method, uri, content_type, body, status, code) in cases {
        let (got_status, got) = call(&app, method, uri, content_type, body).await;
        assert_eq!(
            (got_status.as_u16(), got["error"].as_str()),
            (status, Some(code)),
            "{method} {uri}: {got}"
        );
        assert!(
            got["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {uri}: no message in {got}"
        );
    }
}

#[tokio::test]
async fn reads_on_a_ready_coordinator() {
    let (app, _dir) = ready_router().await;
    let (status, body) = call(
        &app,
        "GET",
        "/v1/transactions/unknown-1/decision",
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["decision"], "abort");
    assert!(
        body["coordinator_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "the answer names its coordinator: {body}"
    );
    let (status, body) = call(
        &app,
        "GET",
        "/v1/transactions?state=committing&limit=5",
        None,
        vec![],
    )
    .await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({"transactions": []}))
    );
    let (status, body) = call(&app, "GET", "/readyz", None, vec![]).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ready"})));
    let (status, body) = call(&app, "GET", "/metrics", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    let text = body.as_str().unwrap();
    assert!(text.contains("twopc_coordinator_ready 1"), "{text}");
    assert!(text.contains("twopc_coordinator_epoch 1"), "{text}");
}

#[tokio::test]
async fn before_recovery_everything_but_health_is_not_ready() {
    let app = router(AppState::new(Arc::new(Metrics::default())));
    let valid = serde_json::to_vec(&json!({"participants": two()})).unwrap();
    for (method, uri, body) in [
        ("POST", "/v1/transactions", valid),
        ("GET", "/v1/transactions", vec![]),
        ("GET", "/v1/transactions/t-1", vec![]),
        // Presumed abort before the log is replayed would be a lie: not ready instead.
        ("GET", "/v1/transactions/t-1/decision", vec![]),
        ("GET", "/readyz", vec![]),
    ] {
        let (status, body) = call(&app, method, uri, JSON, body).await;
        assert_eq!(
            (status.as_u16(), body["error"].as_str()),
            (503, Some("not_ready")),
            "{method} {uri}"
        );
    }
    let (status, body) = call(&app, "GET", "/healthz", None, vec![]).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
    let (status, _) = call(&app, "GET", "/metrics", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn openapi_document_lists_exactly_the_served_routes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                documented.insert((method.clone(), path.clone()));
            }
        }
    }
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, served);
    // And each one really is routed: not 404 unknown_route, not 405.
    let (app, _dir) = ready_router().await;
    for (method, path) in &served {
        let uri = path.replace("{id}", "t-1");
        let (status, body) = call(&app, &method.to_uppercase(), &uri, JSON, b"{}".to_vec()).await;
        assert!(
            body["error"] != "unknown_route" && status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {uri}: {status} {body}"
        );
    }
}

#[tokio::test]
async fn a_failed_log_answers_log_failed_and_never_an_outcome() {
    let storage = Arc::new(wal::sim::SimStorage::new());
    let participants: BTreeMap<_, _> = [(
        ParticipantName::new("inventory").unwrap(),
        "http://127.0.0.1:9".to_string(),
    )]
    .into();
    let config = Config::for_tests(std::path::PathBuf::from("/sim/coordinator"), participants);
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics));
    let core = crate::runtime::recover_on(storage.clone(), &config, metrics)
        .await
        .unwrap();
    state.set_ready(core);
    let app = router(state);

    storage.set_fail_sync(true);
    let request = json!({"id": "t-poison", "participants": [{"name": "inventory", "payload": {}}]});
    let body = serde_json::to_vec(&request).unwrap();
    // Nothing listens on port 9, so the vote is an error and the decision is abort; its record
    // cannot be made durable, so the client must not hear "aborted" either.
    let (status, got) = call(&app, "POST", "/v1/transactions", JSON, body.clone()).await;
    assert_eq!(
        (status.as_u16(), got["error"].as_str()),
        (503, Some("log_failed")),
        "{got}"
    );
    let (status, got) = call(&app, "POST", "/v1/transactions", JSON, body).await;
    assert_eq!(
        (status.as_u16(), got["error"].as_str()),
        (503, Some("log_failed")),
        "{got}"
    );
    let (status, got) = call(&app, "GET", "/readyz", None, vec![]).await;
    assert_eq!(
        (status.as_u16(), got["error"].as_str()),
        (503, Some("log_failed")),
        "{got}"
    );
    let (status, got) = call(
        &app,
        "GET",
        "/v1/transactions/t-poison/decision",
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["decision"], "pending");
    // No record and a log that cannot make a presumed abort durable: 503, not "abort".
    let (status, got) = call(
        &app,
        "GET",
        "/v1/transactions/t-never-seen/decision",
        None,
        vec![],
    )
    .await;
    assert_eq!(
        (status.as_u16(), got["error"].as_str()),
        (503, Some("log_failed")),
        "{got}"
    );
    let (_, got) = call(&app, "GET", "/metrics", None, vec![]).await;
    assert!(
        got.as_str()
            .unwrap()
            .contains("twopc_coordinator_log_poisoned 1")
    );
}

#[tokio::test]
async fn an_id_presumed_aborted_stays_aborted_for_a_client_retry() {
    let (app, _dir) = ready_router().await;
    let (status, got) = call(&app, "GET", "/v1/transactions/o-4/decision", None, vec![]).await;
    assert_eq!(
        (status, got["decision"].as_str()),
        (StatusCode::OK, Some("abort"))
    );
    // The client retries o-4 (whatever its body): the recorded abort, not a new attempt. (An
    // attempt would prepare and list both participants; nothing listens on port 9, so it
    // would abort too, but with another reason and with votes.)
    for participants in [
        two(),
        json!([{"name": "inventory", "payload": {"ops": []}}]),
    ] {
        let body = serde_json::to_vec(&json!({"id": "o-4", "participants": participants})).unwrap();
        let (status, got) = call(&app, "POST", "/v1/transactions", JSON, body).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_eq!(got["outcome"], "aborted", "{got}");
        assert!(
            got["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("presumed abort")),
            "{got}"
        );
        assert_eq!(got["participants"], json!([]), "{got}");
    }
    let (status, got) = call(&app, "GET", "/v1/transactions/o-4", None, vec![]).await;
    assert_eq!(
        (status, got["state"].as_str()),
        (StatusCode::OK, Some("aborted")),
        "{got}"
    );
    // Asking again: the same answer from the record, and no second record.
    let (_, got) = call(&app, "GET", "/v1/transactions/o-4/decision", None, vec![]).await;
    assert_eq!(got["decision"], "abort");
    let (_, got) = call(&app, "GET", "/metrics", None, vec![]).await;
    let text = got.as_str().unwrap();
    assert!(
        text.contains("twopc_coordinator_presumed_aborts_total 1"),
        "{text}"
    );
}
