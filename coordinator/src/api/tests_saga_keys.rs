//! Issue 25, item 5, from the coordinator's side: its op queries name it and the payload it
//! sent (`?coordinator_id=..&payload_digest=..`), and a 409 `op_id_conflict`, to an op or to
//! a query, is a definite failure of that op (the saga goes backward, the step says why, the
//! counter rises), never an unknown asked about for ever.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};

use protocol::digest::Digest;

use super::tests_sagas::{app_on, call};

/// What the scripted participant saw: the coordinator id on the ops, and each op query.
#[derive(Debug, Default)]
struct Seen {
    coordinator_ids: Vec<String>,
    queries: Vec<(String, Option<String>)>,
}

type Shared = Arc<Mutex<Seen>>;

fn conflict() -> axum::response::Response {
    (
        StatusCode::CONFLICT,
        axum::Json(json!({"error": "op_id_conflict", "message": "recorded with another payload"})),
    )
        .into_response()
}

/// Actions: `{"conflict": true}` is refused 409 `op_id_conflict`, `{"unknown": true}` is 503
/// (unknown); the rest, and every compensation, are `done`. Every op query is 409
/// `op_id_conflict`.
async fn scripted_participant(seen: Shared) -> String {
    async fn action(
        State(seen): State<Shared>,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::response::Response {
        let from = body["coordinator_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        seen.lock().unwrap().coordinator_ids.push(from);
        if body["payload"]["conflict"] == json!(true) {
            return conflict();
        }
        if body["payload"]["unknown"] == json!(true) {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({"error": "not_ready", "message": "busy"})),
            )
                .into_response();
        }
        axum::Json(json!({"status": "done"})).into_response()
    }
    async fn op_query(
        State(seen): State<Shared>,
        Path(op_id): Path<String>,
        RawQuery(query): RawQuery,
    ) -> axum::response::Response {
        seen.lock().unwrap().queries.push((op_id, query));
        conflict()
    }
    let app = Router::new()
        .route("/saga/action", post(action))
        .route(
            "/saga/compensate",
            post(|| async { axum::Json(json!({"status": "done"})) }),
        )
        .route("/saga/ops/{op_id}", get(op_query))
        .with_state(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn saga(id: &str, charge: Value) -> Value {
    json!({"id": id, "timeout_ms": 30000, "steps": [
        {"name":"reserve","participant":"inventory","action":{"sku":"a"},"compensation":{"undo":true}},
        {"name":"charge","participant":"payments","action":charge,"compensation":{"refund":true}}]})
}

#[tokio::test]
async fn an_op_id_conflict_fails_the_op_and_the_probe_names_the_coordinator_and_payload() {
    let seen = Shared::default();
    let url = scripted_participant(Arc::clone(&seen)).await;
    let dir = tempfile::tempdir().unwrap();
    let (app, _core) = app_on(dir.path(), &url).await;

    // The charge's answer is lost (503): the coordinator asks, and hears op_id_conflict.
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sagas",
        Some(saga("s-probe", json!({"unknown": true}))),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "compensated", "{body}");
    assert_eq!(body["steps"][0]["status"], "compensated", "{body}");
    assert_eq!(body["steps"][1]["status"], "failed", "{body}");
    assert!(
        body["steps"][1]["last_error"]
            .as_str()
            .unwrap()
            .starts_with("op_id_conflict: recorded with another payload"),
        "{body}"
    );
    let coordinator_id = {
        let seen = seen.lock().unwrap();
        let first = seen.coordinator_ids[0].clone();
        assert!(seen.coordinator_ids.iter().all(|c| *c == first));
        first
    };
    let digest = String::from(Digest::of_payload(&json!({"unknown": true})));
    assert_eq!(
        seen.lock().unwrap().queries,
        vec![(
            "s-probe:charge:action".to_string(),
            Some(format!(
                "coordinator_id={coordinator_id}&payload_digest={digest}"
            ))
        )],
        "one question, naming this coordinator and the charge it sent"
    );

    // The action itself refused op_id_conflict: failed at once, no question asked.
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sagas",
        Some(saga("s-direct", json!({"conflict": true}))),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "compensated", "{body}");
    assert_eq!(body["steps"][1]["status"], "failed", "{body}");
    assert_eq!(body["steps"][1]["attempts"], 1, "{body}");
    assert!(
        body["steps"][1]["last_error"]
            .as_str()
            .unwrap()
            .starts_with("op_id_conflict: "),
        "{body}"
    );
    assert_eq!(seen.lock().unwrap().queries.len(), 1);
    let (_, metrics) = call(&app, "GET", "/metrics", None).await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("twopc_saga_op_id_conflicts_total 2"),
        "{metrics}"
    );
}
