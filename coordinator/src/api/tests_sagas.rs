//! The saga routes end to end against a scripted saga participant: shapes, idempotency
//! (also across a restart on the same log), 409, 202, compensation, bad inputs, metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use protocol::ParticipantName;

use super::{AppState, router};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::{Core, recover};

/// Every (route, op id) the scripted participant received.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Answers `done` to every action whose payload lacks `"fail": true` (then `failed`), and
/// `done` to every compensation; remembers what it saw.
async fn scripted_participant(seen: Seen) -> String {
    async fn op(State(seen): State<Seen>, route: &str, body: Value) -> axum::Json<Value> {
        seen.lock().unwrap().push((
            route.to_string(),
            body["op_id"].as_str().unwrap().to_string(),
        ));
        if route == "action" && body["payload"]["fail"] == true {
            return axum::Json(json!({"status": "failed", "reason": "declined"}));
        }
        axum::Json(json!({"status": "done", "result": {"route": route}}))
    }
    let app = Router::new()
        .route(
            "/saga/action",
            post(|s: State<Seen>, b: axum::Json<Value>| async move { op(s, "action", b.0).await }),
        )
        .route(
            "/saga/compensate",
            post(|s: State<Seen>, b: axum::Json<Value>| async move {
                op(s, "compensate", b.0).await
            }),
        )
        .route(
            "/saga/ops/{op_id}",
            get(|Path(op_id): Path<String>| async move {
                axum::Json(json!({"op_id": op_id, "status": "not_found"}))
            }),
        )
        .with_state(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

pub(super) async fn app_on(dir: &std::path::Path, url: &str) -> (Router, Arc<Core>) {
    let participants: BTreeMap<_, _> = ["inventory", "payments", "mailer"]
        .iter()
        .map(|n| (ParticipantName::new(*n).unwrap(), url.to_string()))
        .collect();
    let config = Config::for_tests(dir.to_path_buf(), participants);
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics));
    let core = recover(&config, metrics).await.unwrap();
    state.set_ready(Arc::clone(&core));
    (router(state), core)
}

pub(super) async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    let body = match body {
        Some(v) => {
            request = request.header("content-type", "application/json");
            Body::from(serde_json::to_vec(&v).unwrap())
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
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

fn checkout(id: &str, fail_charge: bool) -> Value {
    json!({"id": id, "timeout_ms": 30000, "steps": [
        {"name":"reserve","participant":"inventory","action":{"sku":"a"},"compensation":{"sku":"a","undo":true}},
        {"name":"charge","participant":"payments","action":{"fail": fail_charge},"compensation":{"refund":true}},
        {"name":"email","participant":"mailer","action":{"to":"x"},"compensation":null}]})
}

#[tokio::test]
async fn a_saga_completes_is_idempotent_across_a_restart_and_conflicts_on_another_body() {
    let seen = Seen::default();
    let url = scripted_participant(Arc::clone(&seen)).await;
    let dir = tempfile::tempdir().unwrap();
    let (app, core) = app_on(dir.path(), &url).await;
    let (status, body) = call(&app, "POST", "/v1/sagas", Some(checkout("order-7", false))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "completed");
    assert_eq!(body["reason"], Value::Null);
    assert_eq!(body["steps"][1]["status"], "succeeded");
    assert_eq!(body["steps"][1]["attempts"], 1);
    assert_eq!(body["steps"][1]["op_id"], "order-7:charge:action");
    assert_eq!(body["steps"][1]["last_error"], Value::Null);
    assert_eq!(seen.lock().unwrap().len(), 3);
    let (status, again) = call(&app, "POST", "/v1/sagas", Some(checkout("order-7", false))).await;
    assert_eq!((status, &again["steps"]), (StatusCode::OK, &body["steps"]));
    assert_eq!(seen.lock().unwrap().len(), 3, "a retry runs nothing again");
    let (status, conflict) = call(&app, "POST", "/v1/sagas", Some(checkout("order-7", true))).await;
    assert_eq!(
        (status, conflict["error"].as_str()),
        (StatusCode::CONFLICT, Some("id_conflict"))
    );
    let (_, metrics) = call(&app, "GET", "/metrics", None).await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("twopc_sagas{state=\"completed\"} 1"),
        "{metrics}"
    );
    // Restart on the same log (once with a checkpoint, once without): the saga is still there.
    core.checkpoint().await.unwrap();
    core.close_log();
    drop((app, core));
    let (app, core) = app_on(dir.path(), &url).await;
    let (status, after) = call(&app, "GET", "/v1/sagas/order-7", None).await;
    assert_eq!(
        (status, &after["state"]),
        (StatusCode::OK, &json!("completed"))
    );
    let (status, _) = call(&app, "POST", "/v1/sagas", Some(checkout("order-7", false))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(&app, "POST", "/v1/sagas", Some(checkout("order-7", true))).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(seen.lock().unwrap().len(), 3);
    core.close_log();
}

#[tokio::test]
async fn a_failed_step_compensates_only_what_succeeded_once() {
    let seen = Seen::default();
    let url = scripted_participant(Arc::clone(&seen)).await;
    let dir = tempfile::tempdir().unwrap();
    let (app, _core) = app_on(dir.path(), &url).await;
    let (status, body) = call(&app, "POST", "/v1/sagas", Some(checkout("order-8", true))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "compensated");
    assert!(
        body["reason"].as_str().unwrap().contains("charge"),
        "{body}"
    );
    let statuses: Vec<&str> = body["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["compensated", "failed", "pending"]);
    let compensations: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(route, _)| route == "compensate")
        .map(|(_, op)| op.clone())
        .collect();
    assert_eq!(compensations, ["order-8:reserve:compensation"]);
    let (status, list) = call(&app, "GET", "/v1/sagas?state=compensated&limit=5", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["sagas"][0]["id"], "order-8");
    assert!(list["sagas"][0]["age_ms"].is_u64());
}

#[tokio::test]
async fn wait_none_answers_202_and_bad_inputs_name_the_problem() {
    let url = scripted_participant(Seen::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (app, _core) = app_on(dir.path(), &url).await;
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sagas?wait=none",
        Some(checkout("o-9", false)),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["id"], "o-9");
    let mut unknown = checkout("o-10", false);
    unknown["steps"][0]["participant"] = json!("nobody");
    let mut duplicate = checkout("o-11", false);
    duplicate["steps"][1]["name"] = json!("reserve");
    let cases = [
        (
            "POST",
            "/v1/sagas",
            Some(unknown),
            422,
            "unknown_participant",
        ),
        (
            "POST",
            "/v1/sagas",
            Some(duplicate),
            422,
            "duplicate_participant",
        ),
        (
            "POST",
            "/v1/sagas",
            Some(json!({"id": "x", "steps": []})),
            422,
            "no_participants",
        ),
        (
            "POST",
            "/v1/sagas",
            Some(json!({"id": "x"})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            "/v1/sagas?wait=soon",
            Some(checkout("o-12", false)),
            400,
            "invalid_query",
        ),
        ("GET", "/v1/sagas?state=stuck", None, 400, "invalid_query"),
        ("GET", "/v1/sagas?limit=0", None, 400, "invalid_query"),
        ("GET", "/v1/sagas/nope", None, 404, "not_found"),
    ];
    for (method, uri, body, status, code) in cases {
        let (got, answer) = call(&app, method, uri, body).await;
        assert_eq!(
            (got.as_u16(), answer["error"].as_str()),
            (status, Some(code)),
            "{method} {uri}: {answer}"
        );
        assert!(answer["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

/// Found by the `coordinator_http` fuzz target: a saga whose compensation keeps failing never
/// ends (compensations are retried for ever), and `?wait=terminal` waited with it. The wait is
/// bounded by the saga's deadline plus two delivery timeouts; then the answer is 202 with the
/// saga as it stands.
#[tokio::test]
async fn a_saga_whose_compensation_keeps_failing_answers_202_once_the_wait_is_up() {
    async fn action(axum::Json(body): axum::Json<Value>) -> axum::Json<Value> {
        if body["payload"]["fail"] == json!(true) || body["action"]["fail"] == json!(true) {
            axum::Json(json!({"status": "failed", "reason": "declined"}))
        } else {
            axum::Json(json!({"status": "done", "result": {}}))
        }
    }
    let app = Router::new()
        .route("/saga/action", post(action))
        .route(
            "/saga/compensate",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "down") }),
        )
        .route(
            "/saga/ops/{op_id}",
            get(|Path(op_id): Path<String>| async move {
                axum::Json(json!({"op_id": op_id, "status": "not_found"}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let participants: BTreeMap<_, _> = ["inventory", "payments", "mailer"]
        .iter()
        .map(|n| (ParticipantName::new(*n).unwrap(), url.clone()))
        .collect();
    let mut config = Config::for_tests(dir.path().to_path_buf(), participants);
    config.delivery_timeout_ms = 200;
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics));
    let core = recover(&config, metrics).await.unwrap();
    state.set_ready(Arc::clone(&core));
    let app = router(state);
    let mut saga = checkout("order-stuck", true);
    saga["timeout_ms"] = json!(500);
    let started = std::time::Instant::now();
    let (status, body) = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        call(&app, "POST", "/v1/sagas", Some(saga)),
    )
    .await
    .expect("POST /v1/sagas still waiting after 20 s");
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["state"], "compensating", "{body}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );
    // The saga goes on compensating; a GET shows the same state.
    let (status, again) = call(&app, "GET", "/v1/sagas/order-stuck", None).await;
    assert_eq!(
        (status, &again["state"]),
        (StatusCode::OK, &json!("compensating"))
    );
}
