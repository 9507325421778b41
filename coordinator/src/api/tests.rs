//! HTTP tests through `Router::oneshot`: every bad input with its status and error code,
//! readiness (the OpenAPI document against the routes served is `tests_openapi`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use protocol::limits::{BODY_BYTES_MAX, PARTICIPANTS_MAX, PAYLOAD_BYTES_MAX, TIMEOUT_MS_MAX};
use protocol::{GlobalTxId, Incarnation, ParticipantName};

use super::{AppState, router};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::{Core, recover};

/// A ready coordinator with `participants` (name, URL) and at most `retained_max` outcomes.
async fn ready_app(
    participants: &[(&str, &str)],
    retained_max: usize,
) -> (Router, Arc<Core>, tempfile::TempDir) {
    ready_app_with(participants, |config| config.retained_max = retained_max).await
}

/// A ready coordinator with `participants` (name, URL) and its configuration changed by
/// `configure`.
pub(super) async fn ready_app_with(
    participants: &[(&str, &str)],
    configure: impl FnOnce(&mut Config),
) -> (Router, Arc<Core>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let participants: BTreeMap<_, _> = participants
        .iter()
        .map(|(n, url)| (ParticipantName::new(*n).unwrap(), url.to_string()))
        .collect();
    let mut config = Config::for_tests(dir.path().to_path_buf(), participants);
    configure(&mut config);
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics));
    let core = recover(&config, metrics).await.unwrap();
    state.set_ready(Arc::clone(&core));
    (router(state), core, dir)
}

/// Port 9 (discard) on loopback: nothing listens, so every vote is an error and every
/// transaction aborts (and phase two keeps retrying).
const NOBODY: &str = "http://127.0.0.1:9";

pub(super) async fn ready_router() -> (Router, tempfile::TempDir) {
    let (app, _core, dir) = ready_app(
        &[("inventory", NOBODY), ("payments", NOBODY)],
        crate::config::defaults::RETAINED_MAX,
    )
    .await;
    (app, dir)
}

/// A participant that votes yes and acknowledges at once.
pub(super) async fn cooperative_participant() -> String {
    let app = Router::new()
        .route(
            "/2pc/prepare",
            post(|| async { axum::Json(json!({"vote": "yes"})) }),
        )
        .route(
            "/2pc/commit",
            post(|| async { axum::Json(json!({"ack": true})) }),
        )
        .route(
            "/2pc/abort",
            post(|| async { axum::Json(json!({"ack": true})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The decision route for attempt `gtid` of `txid`, with the query its participants send.
pub(super) fn decision_uri(txid: &str, gtid: &str, epoch: u64) -> String {
    let (_, incarnation, position) = GlobalTxId::new(gtid).unwrap().parts().unwrap();
    format!(
        "/v1/transactions/{txid}/decision?gtid={gtid}&incarnation={incarnation}&epoch={epoch}\
         &position={position}"
    )
}

pub(super) async fn call(
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

pub(super) fn two() -> Value {
    json!([{"name": "inventory", "payload": {"ops": []}}, {"name": "payments", "payload": {"ops": []}}])
}

pub(super) const JSON: Option<&str> = Some("application/json");

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
        (
            "GET",
            "/v1/transactions/t/decision?gtid=c-1:00000000000000aa:1",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions/t/decision?gtid=c:00000000000000aa:1&incarnation=aa&epoch=1\
             &position=1",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions/t/decision?gtid=c:00000000000000aa:1\
             &incarnation=00000000000000aa&epoch=one&position=1",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions/t/decision?gtid=c:00000000000000aa:1\
             &incarnation=00000000000000aa&epoch=1&position=-1",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions/t/decision?gtid=a%2Fb&incarnation=00000000000000aa&epoch=1\
             &position=1",
            None,
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/transactions/t/decision?txid=t",
            None,
            Vec::new(),
            400,
            "invalid_query",
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
    // A query that names no attempt: nothing can be proven about it.
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["decision"], "unknown", "{body}");
    assert!(
        body["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{body}"
    );
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
    assert_eq!(
        (status, body),
        (
            StatusCode::OK,
            json!({"status": "ready", "retention": {
                "configured_ms": crate::config::defaults::RETENTION_MS,
                "effective_ms": crate::config::defaults::RETENTION_MS,
                "evicted_early": 0,
                "disk_bytes": 0,
            }})
        )
    );
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
async fn a_failed_log_answers_log_failed_and_never_an_outcome() {
    let storage = Arc::new(wal::sim::SimStorage::new());
    let participants: BTreeMap<_, _> = [(
        ParticipantName::new("inventory").unwrap(),
        "http://127.0.0.1:9".to_string(),
    )]
    .into();
    // The log is simulated; the outcome index is a real file.
    let config = Config::for_tests(tempfile::tempdir().unwrap().keep(), participants);
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
    let (status, got) = call(&app, "GET", "/v1/transactions/t-poison", None, vec![]).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let gtid = got["gtid"].as_str().unwrap().to_string();
    let (status, got) = call(
        &app,
        "GET",
        &decision_uri("t-poison", &gtid, 1),
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["decision"], "pending", "{got}");
    // An attempt this run never began (position 2): unknown, never a guessed abort.
    let (_, incarnation, _) = GlobalTxId::new(gtid.as_str()).unwrap().parts().unwrap();
    let coordinator = gtid.split(':').next().unwrap();
    let never = format!("{coordinator}:{incarnation}:2");
    let (status, got) = call(
        &app,
        "GET",
        &decision_uri("t-never-seen", &never, 1),
        None,
        vec![],
    )
    .await;
    assert_eq!(
        (status, got["decision"].as_str()),
        (StatusCode::OK, Some("unknown")),
        "{got}"
    );
    let (_, got) = call(&app, "GET", "/metrics", None, vec![]).await;
    assert!(
        got.as_str()
            .unwrap()
            .contains("twopc_coordinator_log_poisoned 1")
    );
}

pub(super) fn post_body(id: &str, participants: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": id, "participants": participants})).unwrap()
}

#[tokio::test]
async fn a_reused_id_is_a_new_attempt_and_its_first_attempt_hears_abort() {
    // The report, end to end: `--retained-max 1`; o-4 commits, o-5 commits (o-4 is
    // forgotten), o-4 comes again with another body. It must be prepared and decided as a new
    // attempt under a new gtid, and the first attempt's participants must hear abort (its
    // run is in the log, its position within it), never the second attempt's commit.
    let url = cooperative_participant().await;
    // Forgotten today means out of the window: a zero window forgets o-4 once it is archived.
    let (app, core, _dir) = ready_app_with(&[("inventory", &url), ("payments", &url)], |c| {
        c.retention_ms = 0
    })
    .await;
    let epoch = core.identity().epoch.0;
    let acked = "/v1/transactions?wait=acked";
    let (status, first) = call(&app, "POST", acked, JSON, post_body("o-4", two())).await;
    assert_eq!(
        (status, first["outcome"].as_str()),
        (StatusCode::OK, Some("committed")),
        "{first}"
    );
    let first_gtid = first["gtid"].as_str().unwrap().to_string();
    let (status, got) = call(&app, "POST", acked, JSON, post_body("o-5", two())).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let mut tries = 0;
    loop {
        let (status, _) = call(&app, "GET", "/v1/transactions/o-4", None, vec![]).await;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        tries += 1;
        assert!(tries < 200, "o-4 is never forgotten: {status}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    let other = json!([{"name": "inventory", "payload": {"ops": [{"op": "put"}]}}]);
    let (status, second) = call(&app, "POST", acked, JSON, post_body("o-4", other)).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["outcome"], "committed", "{second}");
    assert_eq!(
        second["participants"].as_array().map(Vec::len),
        Some(1),
        "the new body's participants were prepared: {second}"
    );
    let second_gtid = second["gtid"].as_str().unwrap().to_string();
    assert_ne!(second_gtid, first_gtid);

    let (status, got) = call(
        &app,
        "GET",
        &decision_uri("o-4", &first_gtid, epoch),
        None,
        vec![],
    )
    .await;
    assert_eq!(
        (status, got["decision"].as_str()),
        (StatusCode::OK, Some("abort")),
        "{got}"
    );
    let (_, got) = call(
        &app,
        "GET",
        &decision_uri("o-4", &second_gtid, epoch),
        None,
        vec![],
    )
    .await;
    assert_eq!(got["decision"], "commit", "{got}");
    let (_, got) = call(&app, "GET", "/metrics", None, vec![]).await;
    let text = got.as_str().unwrap();
    assert!(
        text.contains("twopc_coordinator_presumed_aborts_total 1"),
        "{text}"
    );
}

#[tokio::test]
async fn the_decision_route_answers_an_attempt_with_this_runs_identity() {
    let (app, core, _dir) = ready_app(&[("inventory", NOBODY)], 10).await;
    let identity = core.identity().clone();
    let body = post_body("t-1", json!([{"name": "inventory", "payload": {}}]));
    let (status, posted) = call(&app, "POST", "/v1/transactions", JSON, body).await;
    assert_eq!(status, StatusCode::OK, "{posted}");
    let gtid = format!("{}:{}:1", identity.coordinator_id, identity.incarnation);
    assert_eq!(posted["gtid"], gtid.as_str(), "{posted}");
    // The status shows the attempt too.
    let (status, got) = call(&app, "GET", "/v1/transactions/t-1", None, vec![]).await;
    assert_eq!(
        (status, got["gtid"].as_str()),
        (StatusCode::OK, Some(gtid.as_str())),
        "{got}"
    );

    let (status, got) = call(
        &app,
        "GET",
        &decision_uri("t-1", &gtid, identity.epoch.0),
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        got,
        json!({
            "decision": "abort",
            "coordinator_id": identity.coordinator_id.as_str(),
            "epoch": identity.epoch.0,
            "incarnation": identity.incarnation.to_string(),
        })
    );
    // The next position was never given out: unknown, with why.
    let next = format!("{}:{}:2", identity.coordinator_id, identity.incarnation);
    let (status, got) = call(
        &app,
        "GET",
        &decision_uri("t-2", &next, identity.epoch.0),
        None,
        vec![],
    )
    .await;
    assert_eq!(
        (status, got["decision"].as_str()),
        (StatusCode::OK, Some("unknown")),
        "{got}"
    );
    assert!(
        got["reason"]
            .as_str()
            .is_some_and(|r| r.contains(next.as_str())),
        "{got}"
    );
    assert_eq!(got["incarnation"], identity.incarnation.to_string());
    // Neither answer proves the log behind.
    let (status, _) = call(&app, "GET", "/readyz", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_partial_or_malformed_decision_query_is_refused_naming_the_parameters() {
    let (app, _dir) = ready_router().await;
    let gtid = "c-1:00000000000000aa:3";
    let partial = [
        format!("gtid={gtid}"),
        format!("gtid={gtid}&incarnation=00000000000000aa&epoch=1"),
        "position=3&epoch=1".to_string(),
    ];
    for query in partial {
        let uri = format!("/v1/transactions/t/decision?{query}");
        let (status, got) = call(&app, "GET", &uri, None, vec![]).await;
        assert_eq!(
            (status, got["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_query")),
            "{uri}: {got}"
        );
        let message = got["message"].as_str().unwrap_or_default();
        for name in ["gtid", "incarnation", "epoch", "position"] {
            assert!(message.contains(name), "{uri}: {name} not in {message}");
        }
    }
    // A malformed incarnation is named with what was wrong with it.
    for bad in ["AA00000000000000", "aa", "00000000000000zz"] {
        let uri =
            format!("/v1/transactions/t/decision?gtid={gtid}&incarnation={bad}&epoch=1&position=3");
        let (status, got) = call(&app, "GET", &uri, None, vec![]).await;
        assert_eq!(
            (status, got["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_query")),
            "{uri}: {got}"
        );
        let message = got["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("incarnation") && message.contains(bad),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_query_naming_a_run_this_log_does_not_hold_is_unknown_counted_and_stops_nothing() {
    let (app, core, _dir) = ready_app(&[("inventory", NOBODY)], 10).await;
    let identity = core.identity().clone();
    // The query: a made-up run and epoch, no token needed on loopback.
    for (incarnation, epoch) in [
        (Incarnation(identity.incarnation.0 ^ 0xff), identity.epoch.0),
        (Incarnation(u64::MAX), 1),
        (Incarnation(7), u64::MAX),
    ] {
        let gtid = format!("{}:{incarnation}:1", identity.coordinator_id);
        let (status, got) = call(
            &app,
            "GET",
            &format!(
                "/v1/transactions/x/decision?gtid={gtid}&incarnation={incarnation}&epoch={epoch}\
                 &position=1"
            ),
            None,
            vec![],
        )
        .await;
        assert_eq!(
            (status, got["decision"].as_str()),
            (StatusCode::OK, Some("unknown")),
            "{got}"
        );
    }
    assert_eq!(core.log_behind(), None, "a query is a claim, not evidence");
    let body = post_body("t-new", json!([{"name": "inventory", "payload": {}}]));
    let (status, got) = call(&app, "POST", "/v1/transactions", JSON, body).await;
    assert_eq!(status, StatusCode::OK, "new work goes on: {got}");
    let (status, got) = call(&app, "GET", "/readyz", None, vec![]).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let (_, got) = call(&app, "GET", "/metrics", None, vec![]).await;
    let text = got.as_str().unwrap();
    assert!(text.contains("twopc_coordinator_log_behind 0"), "{text}");
    assert!(
        text.contains("twopc_coordinator_unknown_run_queries_total 3"),
        "{text}"
    );
}

/// A participant that accepts connections and never answers: every prepare sent to it stays
/// in phase one until the transaction's timeout.
async fn silent_participant() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

#[tokio::test]
async fn past_a_participants_bound_new_work_on_it_gets_503_overloaded_with_retry_after() {
    let healthy = cooperative_participant().await;
    let silent = silent_participant().await;
    let dir = tempfile::tempdir().unwrap();
    let participants: BTreeMap<_, _> = [("payments", healthy), ("shipping", silent)]
        .into_iter()
        .map(|(n, url)| (ParticipantName::new(n).unwrap(), url))
        .collect();
    let mut config = Config::for_tests(dir.path().to_path_buf(), participants);
    config.max_live_per_participant = 1;
    config.overload_retry_after_ms = 1_500;
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics));
    let core = recover(&config, metrics).await.unwrap();
    state.set_ready(Arc::clone(&core));
    let app = router(state);
    let on = |name: &str| json!([{"name": name, "payload": {"ops": []}}]);
    let body = |id: &str, parts: Value| {
        serde_json::to_vec(&json!({"id": id, "participants": parts, "timeout_ms": 3000})).unwrap()
    };
    // The first one on the silent participant takes the only place and waits in phase one.
    let first = {
        let app = app.clone();
        let body = body("stuck", on("shipping"));
        tokio::spawn(async move { call(&app, "POST", "/v1/transactions", JSON, body).await })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while core.participant_loads().iter().all(|l| l.live == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first never began"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let request = Request::builder()
        .method("POST")
        .uri("/v1/transactions")
        .header("content-type", "application/json")
        .body(Body::from(body("turned-away", on("shipping"))))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string()),
        Some("2".to_string()),
        "1500 ms rounds up to 2 s"
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let error: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(error["error"], "overloaded");
    assert!(
        error["message"].as_str().unwrap().contains("\"shipping\""),
        "{error}"
    );
    // Nothing was begun for it: the id is unknown.
    let (status, _) = call(&app, "GET", "/v1/transactions/turned-away", None, vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Work on the healthy participant carries on.
    let (status, answer) = call(
        &app,
        "POST",
        "/v1/transactions",
        JSON,
        body("healthy", on("payments")),
    )
    .await;
    assert_eq!(
        (status, answer["outcome"].clone()),
        (StatusCode::OK, json!("committed"))
    );
    let (_, metrics) = call(&app, "GET", "/metrics", None, vec![]).await;
    let text = metrics.as_str().unwrap();
    assert!(
        text.contains("twopc_coordinator_overloaded_total 1"),
        "{text}"
    );
    assert!(
        text.contains("twopc_coordinator_participant_live{participant=\"shipping\"} 1"),
        "{text}"
    );
    // Once the stuck one times out (an abort nobody voted yes to: nothing pending), there is
    // room again.
    let (status, answer) = first.await.unwrap();
    assert_eq!(
        (status, answer["outcome"].clone()),
        (StatusCode::OK, json!("aborted"))
    );
    assert_eq!(
        core.participant_loads()
            .iter()
            .map(|l| l.live + l.pending_acks)
            .sum::<u64>(),
        0
    );
}

/// Waits until the archiver has moved every ended outcome out of staging into the index.
async fn until_archived(core: &Core) {
    for _ in 0..500 {
        if core.gauges().retained == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("outcomes still staged: {:?}", core.gauges());
}

#[tokio::test]
async fn a_retry_is_answered_from_the_index_once_the_outcome_left_memory() {
    let url = cooperative_participant().await;
    let (app, core, _dir) = ready_app(&[("inventory", &url), ("payments", &url)], 10).await;
    let acked = "/v1/transactions?wait=acked";
    let (status, first) = call(&app, "POST", acked, JSON, post_body("k-1", two())).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    for n in 2..=4 {
        let (status, got) = call(
            &app,
            "POST",
            acked,
            JSON,
            post_body(&format!("k-{n}"), two()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{got}");
    }
    until_archived(&core).await;
    // k-1 is in the index only: nothing is staged any more.
    assert_eq!(core.gauges().retained, 0);

    // Same body: the recorded outcome, no new attempt (same gtid, everyone acked).
    let (status, again) = call(&app, "POST", acked, JSON, post_body("k-1", two())).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["gtid"], first["gtid"], "{again}");
    assert_eq!(again["outcome"], "committed");
    // Another body: 409, as for an outcome in memory.
    let other = json!([{"name": "inventory", "payload": {"ops": [{"op": "put"}]}}]);
    let (status, conflict) = call(&app, "POST", acked, JSON, post_body("k-1", other)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert_eq!(conflict["error"], "id_conflict");
    // Status comes from the index too.
    let (status, got) = call(&app, "GET", "/v1/transactions/k-1", None, vec![]).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["state"], "committed");
    assert!(got["ended_at_ms"].as_u64().is_some(), "{got}");

    // Listing pages through the index, oldest ended first, with a cursor.
    let (status, page) = call(
        &app,
        "GET",
        "/v1/transactions?state=committed&limit=3",
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let ids = |page: &Value| -> Vec<String> {
        page["transactions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&page), ["k-1", "k-2", "k-3"]);
    let next = page["next"]
        .as_str()
        .expect("more after this page")
        .to_string();
    let (status, rest) = call(
        &app,
        "GET",
        &format!("/v1/transactions?state=committed&limit=3&after={next}"),
        None,
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rest}");
    assert_eq!(ids(&rest), ["k-4"]);
    assert!(rest.get("next").is_none(), "the last page: {rest}");
    let (status, bad) = call(&app, "GET", "/v1/transactions?after=nope", None, vec![]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
}
