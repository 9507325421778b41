//! Operator actions on sagas, end to end against a scripted saga participant: a compensation
//! that keeps failing is retried now once the participant is back; a needs_attention saga is
//! settled by hand (audited, listed after the ones still waiting, kept across a restart); the
//! refusals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::tests_sagas::{app_on, call};

/// Actions with `"fail": true` fail; compensations answer 503 while `down` is set.
async fn participant(down: Arc<AtomicBool>) -> String {
    let app = Router::new()
        .route(
            "/saga/action",
            post(|axum::Json(body): axum::Json<Value>| async move {
                if body["payload"]["fail"] == true {
                    return axum::Json(json!({"status": "failed", "reason": "declined"}));
                }
                axum::Json(json!({"status": "done"}))
            }),
        )
        .route(
            "/saga/compensate",
            post(|State(down): State<Arc<AtomicBool>>| async move {
                if down.load(Ordering::SeqCst) {
                    return answer(StatusCode::SERVICE_UNAVAILABLE, "down");
                }
                answer(StatusCode::OK, r#"{"status":"done"}"#)
            }),
        )
        .route(
            "/saga/ops/{op_id}",
            get(
                |axum::extract::Path(op_id): axum::extract::Path<String>| async move {
                    axum::Json(json!({"op_id": op_id, "status": "not_found"}))
                },
            ),
        )
        .with_state(down);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A scripted answer: a status and a body.
fn answer(status: StatusCode, body: &'static str) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn saga(id: &str, steps: Value) -> Value {
    json!({"id": id, "timeout_ms": 600000, "steps": steps})
}

async fn wait_state(app: &Router, id: &str, want: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (_, body) = call(app, "GET", &format!("/v1/sagas/{id}"), None).await;
        if want(&body) {
            return body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("saga {id} never reached the state wanted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_compensation_is_retried_now_and_a_pivot_failure_is_settled_by_hand() {
    let down = Arc::new(AtomicBool::new(true));
    let url = participant(Arc::clone(&down)).await;
    let dir = tempfile::tempdir().unwrap();
    let (app, core) = app_on(dir.path(), &url).await;

    // reserve succeeds, charge is declined: reserve's compensation fails while it is down.
    let failing = saga(
        "s-comp",
        json!([
            {"name":"reserve","participant":"inventory","action":{},"compensation":{}},
            {"name":"charge","participant":"payments","action":{"fail":true},"compensation":{}}]),
    );
    let (status, _) = call(&app, "POST", "/v1/sagas?wait=none", Some(failing)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let stuck = wait_state(&app, "s-comp", |b| {
        b["steps"][0]["status"] == "compensation_failing"
    })
    .await;
    assert_eq!(stuck["state"], "compensating", "{stuck}");
    let (_, metrics) = call(&app, "GET", "/metrics", None).await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("twopc_saga_compensations_failing 1"),
        "{metrics}"
    );
    // The participant is back; an operator does not wait for the backoff.
    down.store(false, Ordering::SeqCst);
    let mut done = None;
    for _ in 0..50 {
        let (status, answer) = call(
            &app,
            "POST",
            "/v1/sagas/s-comp/retry",
            Some(json!({"operator":"ana","reason":"inventory is back"})),
        )
        .await;
        if status == StatusCode::CONFLICT {
            // Ended between two tries: the retry (or the timer) did it.
            assert_eq!(answer["error"], "not_pending", "{answer}");
            break;
        }
        assert_eq!(status, StatusCode::OK, "{answer}");
        let (_, now) = call(&app, "GET", "/v1/sagas/s-comp", None).await;
        if now["state"] == "compensated" {
            done = Some(now);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let done = match done {
        Some(done) => done,
        None => wait_state(&app, "s-comp", |b| b["state"] == "compensated").await,
    };
    assert_eq!(done["steps"][0]["status"], "compensated", "{done}");
    let (status, body) = call(&app, "POST", "/v1/sagas/s-comp/retry", Some(json!({}))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_pending")),
        "an ended saga has nothing to retry: {body}"
    );
    let (status, body) = call(&app, "POST", "/v1/sagas/nobody/retry", Some(json!({}))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // A failure after a step that cannot be undone: needs_attention, for a human.
    let pivot = |id: &str| {
        saga(
            id,
            json!([
                {"name":"email","participant":"mailer","action":{},"compensation":null},
                {"name":"charge","participant":"payments","action":{"fail":true},"compensation":{}}]),
        )
    };
    for id in ["s-pivot-1", "s-pivot-2"] {
        let (status, body) = call(&app, "POST", "/v1/sagas", Some(pivot(id))).await;
        assert_eq!(
            (status, body["state"].as_str()),
            (StatusCode::OK, Some("needs_attention"))
        );
    }
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sagas/s-pivot-1/resolve",
        Some(json!({"operator":"ana","reason":"refunded by phone"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["state"], "needs_attention",
        "it stays what it was: {body}"
    );
    assert_eq!(body["resolved_by_hand"]["operator"], "ana");
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sagas/s-pivot-1/resolve",
        Some(json!({"operator":"bo","reason":"again"})),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_in_doubt")),
        "{body}"
    );
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sagas/s-comp/resolve",
        Some(json!({"operator":"ana","reason":"x"})),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_in_doubt")),
        "only needs_attention sagas are settled by hand: {body}"
    );
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sagas/s-pivot-2/resolve",
        Some(json!({"operator":"","reason":"x"})),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_operator"))
    );
    // The one still waiting for a human is listed before the one settled.
    let (_, list) = call(&app, "GET", "/v1/sagas?state=needs_attention", None).await;
    let ids: Vec<&str> = list["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["s-pivot-2", "s-pivot-1"], "{list}");
    let (_, metrics) = call(&app, "GET", "/metrics", None).await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("twopc_sagas_resolved_by_hand 1"),
        "{metrics}"
    );

    // The evidence: the coordinator's step statuses beside what the participant says.
    let (status, evidence) = call(&app, "GET", "/v1/sagas/s-pivot-2/evidence", None).await;
    assert_eq!(status, StatusCode::OK, "{evidence}");
    assert_eq!(evidence["saga"]["state"], "needs_attention");
    assert_eq!(
        evidence["steps"][0]["coordinator_says"], "succeeded",
        "{evidence}"
    );
    assert_eq!(evidence["steps"][0]["op_id"], "s-pivot-2:email:action");
    assert_eq!(
        evidence["steps"][0]["participant_says"], "not_found",
        "the scripted participant keeps no ops: {evidence}"
    );
    let (status, _) = call(&app, "GET", "/v1/sagas/nobody/evidence", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Audited, and kept across a restart (with a checkpoint).
    let (_, audit) = call(&app, "GET", "/v1/audit", None).await;
    assert_eq!(
        audit["audit"][0]["action"], "resolve_saga_by_hand",
        "{audit}"
    );
    assert_eq!(audit["audit"][0]["id"], "s-pivot-1");
    assert!(
        audit["audit"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "retry_saga" && e["id"] == "s-comp"),
        "{audit}"
    );
    core.checkpoint().await.unwrap();
    core.close_log();
    drop((app, core));
    let (app, _core) = app_on(dir.path(), &url).await;
    let (_, after) = call(&app, "GET", "/v1/sagas/s-pivot-1", None).await;
    assert_eq!(
        after["resolved_by_hand"]["reason"], "refunded by phone",
        "{after}"
    );
    let (_, view) = call(&app, "GET", "/v1/cluster", None).await;
    let shown: Vec<&str> = view["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(shown, ["s-pivot-2", "s-pivot-1"], "{view}");
}
