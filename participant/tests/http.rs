//! The library's HTTP surface through `Router::oneshot`: protocol routes, error bodies and
//! statuses, health, readiness and metrics.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{C1, Tally, add, decision, from, gtid, gtid_of, prepare, prepare_as, run};
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

/// A request as JSON, to edit before sending.
fn wire(request: impl serde::Serialize) -> Value {
    serde_json::to_value(request).unwrap()
}

#[tokio::test]
async fn protocol_round_trip_over_http() {
    let (app, participant, _dir) = app();
    // Spelled out once: the wire shape of a prepare and a decision.
    let prepare = json!({"txid": "t1", "gtid": "c1:0000000000000001:1", "coordinator_id": "c1",
        "epoch": 1, "incarnation": "0000000000000001", "position": 1,
        "payload": {"key": "a", "n": 4}});
    assert_eq!(
        post(&app, "/2pc/prepare", &prepare.to_string()).await,
        (StatusCode::OK, json!({"vote": "yes"}))
    );
    let decision = json!({"txid": "t1", "gtid": "c1:0000000000000001:1", "coordinator_id": "c1",
        "epoch": 1, "incarnation": "0000000000000001"})
    .to_string();
    assert_eq!(
        post(&app, "/2pc/commit", &decision).await,
        (StatusCode::OK, json!({"ack": true}))
    );
    assert_eq!(
        post(&app, "/2pc/commit", &decision).await,
        (StatusCode::OK, json!({"ack": true}))
    );
    assert_eq!(participant.read(|t| t.counts["a"]), 4);
    let no = wire(prepare_as("t2", &gtid("t2"), &from(C1, 1), add("a", -1)));
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
    let ghost = wire(decision("ghost", 3)).to_string();
    let (status, body) = post(&app, "/2pc/commit", &ghost).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::CONFLICT, json!("not_prepared"))
    );
    let stale = wire(decision("t", 2)).to_string();
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
    let mut extra = wire(decision("t", 3));
    extra["url"] = json!("http://evil");
    let (status, body) = post(&app, "/2pc/commit", &extra.to_string()).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::BAD_REQUEST, json!("malformed_json"))
    );
    let mut bad_id = wire(decision("t", 3));
    bad_id["txid"] = json!("a/b");
    assert_eq!(
        post(&app, "/2pc/abort", &bad_id.to_string()).await.0,
        StatusCode::BAD_REQUEST
    );
    let invalid = wire(prepare("t", 3, json!({"key": 1})));
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
    let prepare = wire(prepare("t1", 1, add("a", 1)));
    post(&app, "/2pc/prepare", &prepare.to_string()).await;
    let (status, text) = send(&app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("twopc_participant_votes_total{vote=\"yes\"} 1"),
        "{text}"
    );
    assert!(text.contains("twopc_participant_prepared 1"), "{text}");
    assert!(text.contains("twopc_participant_locked_keys 1"), "{text}");
    let age: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("twopc_participant_oldest_prepared_age_ms "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no oldest prepared age in\n{text}"));
    assert!(age < 60_000, "t1 was prepared just now, not {age} ms ago");
    assert!(
        text.contains("# TYPE twopc_wal_fsyncs_total counter"),
        "{text}"
    );
}

#[tokio::test]
async fn the_prepared_listing_shows_the_attempt_and_its_run() {
    let (app, _participant, _dir) = app();
    let g = gtid_of(C1, run(2), 17);
    let prepare = wire(prepare_as("order-9", &g, &from(C1, 2), add("a", 1)));
    assert_eq!(
        post(&app, "/2pc/prepare", &prepare.to_string()).await,
        (StatusCode::OK, json!({"vote": "yes"}))
    );
    let (status, text) = send(
        &app,
        Request::get("/v1/prepared").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let listed: Value = serde_json::from_str(&text).unwrap();
    let entry = &listed["prepared"][0];
    assert_eq!(entry["txid"], "order-9");
    assert_eq!(entry["gtid"], "c1:0000000000000002:17");
    assert_eq!(entry["incarnation"], "0000000000000002");
    assert_eq!(entry["position"], 17);
    assert_eq!(entry["epoch"], 2);
    assert_eq!(entry["keys"], json!(["a"]));
    assert!(entry.get("last_answer").is_none(), "never asked: {entry}");
    assert_eq!(listed["prepared"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn a_request_without_its_attempt_id_is_malformed_and_changes_nothing() {
    let (app, participant, _dir) = app();
    for field in ["gtid", "incarnation", "position"] {
        let mut prepare = wire(prepare("t1", 1, add("a", 1)));
        prepare.as_object_mut().unwrap().remove(field);
        let (status, body) = post(&app, "/2pc/prepare", &prepare.to_string()).await;
        assert_eq!(
            (status, body["error"].clone()),
            (StatusCode::BAD_REQUEST, json!("malformed_json")),
            "{field}: {body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("missing field `{field}`")),
            "{message}"
        );
    }
    for route in ["/2pc/commit", "/2pc/abort"] {
        let mut decision = wire(decision("t1", 1));
        decision.as_object_mut().unwrap().remove("gtid");
        let (status, body) = post(&app, route, &decision.to_string()).await;
        assert_eq!(
            (status, body["error"].clone()),
            (StatusCode::BAD_REQUEST, json!("malformed_json")),
            "{route}: {body}"
        );
    }
    assert!(participant.prepared_list().is_empty());
    participant.with_engine(|e| {
        assert_eq!(
            (e.tombstones_len(), e.highest_epoch(&common::coord(C1))),
            (0, None)
        );
    });
}

#[tokio::test]
async fn fencing_and_foreign_attempts_have_their_codes() {
    let (app, participant, _dir) = app();
    let prepare = wire(prepare("t1", 3, add("a", 1)));
    assert_eq!(
        post(&app, "/2pc/prepare", &prepare.to_string()).await.0,
        StatusCode::OK
    );
    // Epoch 3 again, from another run of c1 (its log restored from a backup).
    let restored = from(C1, 3).in_run(0xbad);
    for (route, request) in [
        (
            "/2pc/prepare",
            wire(prepare_as("t2", &gtid("t2"), &restored, add("b", 1))),
        ),
        (
            "/2pc/commit",
            wire(common::decision_as("t1", &gtid("t1"), &restored)),
        ),
        (
            "/2pc/abort",
            wire(common::decision_as("t1", &gtid("t1"), &restored)),
        ),
    ] {
        let (status, body) = post(&app, route, &request.to_string()).await;
        assert_eq!(
            (status, body["error"].clone()),
            (StatusCode::CONFLICT, json!("incarnation_conflict")),
            "{route}: {body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("0000000000000bad"), "{message}");
        // The epoch another run claimed: a coordinator logs one above it to be obeyed again.
        assert_eq!(body["highest_epoch"], json!(3), "{route}: {body}");
    }
    let stale = wire(common::prepare("t4", 2, add("d", 1)));
    let (status, body) = post(&app, "/2pc/prepare", &stale.to_string()).await;
    assert_eq!(
        (status, body["error"].clone(), body["highest_epoch"].clone()),
        (StatusCode::CONFLICT, json!("stale_epoch"), json!(3)),
        "{body}"
    );
    let leap = wire(common::prepare("t5", 3 + 1_000_001, add("e", 1)));
    let (status, body) = post(&app, "/2pc/prepare", &leap.to_string()).await;
    assert_eq!(
        (status, body["error"].clone(), body["highest_epoch"].clone()),
        (StatusCode::CONFLICT, json!("epoch_too_high"), json!(3)),
        "{body}"
    );
    let foreign = wire(prepare_as(
        "t3",
        &gtid_of("c2", run(3), 1),
        &from(C1, 3),
        add("c", 1),
    ));
    let (status, body) = post(&app, "/2pc/prepare", &foreign.to_string()).await;
    assert_eq!(
        (status, body["error"].clone()),
        (StatusCode::UNPROCESSABLE_ENTITY, json!("invalid_id")),
        "{body}"
    );
    assert!(
        body.get("highest_epoch").is_none(),
        "not a fencing refusal: {body}"
    );
    assert_eq!(participant.prepared_list().len(), 1);
    assert_eq!(participant.read(|t| t.applied + t.released), 0);
}

#[tokio::test]
async fn a_prepare_behind_a_holder_waits_over_http_and_gets_yes_when_it_commits() {
    let (app, participant, _dir) = app();
    let mut holder = wire(prepare("holder", 1, add("k", 1)));
    holder["started_at_ms"] = json!(1);
    assert_eq!(
        post(&app, "/2pc/prepare", &holder.to_string()).await,
        (StatusCode::OK, json!({"vote": "yes"}))
    );
    let mut waiter = wire(prepare("waiter", 1, add("k", 2)));
    waiter["started_at_ms"] = json!(2);
    waiter["lock_wait_ms"] = json!(10_000);
    let queued = {
        let app = app.clone();
        tokio::spawn(async move { post(&app, "/2pc/prepare", &waiter.to_string()).await })
    };
    // It queues without holding the engine: the holder's commit gets through meanwhile.
    let mut waited = 0;
    while participant.with_engine(|e| e.waiting_len()) == 0 {
        assert!(waited < 200, "the prepare never queued");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        waited += 1;
    }
    assert!(!queued.is_finished(), "no answer while the key is held");
    let metrics = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert!(
        metrics.1.contains("twopc_participant_lock_waiters 1"),
        "{}",
        metrics.1
    );
    assert_eq!(
        post(
            &app,
            "/2pc/commit",
            &wire(decision("holder", 1)).to_string()
        )
        .await,
        (StatusCode::OK, json!({"ack": true}))
    );
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), queued)
        .await
        .expect("answered once the holder committed")
        .unwrap();
    assert_eq!(answer, (StatusCode::OK, json!({"vote": "yes"})));
    assert_eq!(participant.prepared_list()[0].gtid, gtid("waiter"));
    let metrics = send(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert!(
        metrics.1.contains("twopc_participant_lock_waits_total 1"),
        "{}",
        metrics.1
    );
    assert!(
        metrics
            .1
            .contains("twopc_participant_lock_wait_seconds_count 1"),
        "{}",
        metrics.1
    );
}

#[tokio::test]
async fn another_sites_writes_and_a_rebound_host_are_refused_before_the_handler() {
    let (app, _participant, _dir) = app();
    let prepare = json!({"txid": "t-x", "gtid": "c1:0000000000000001:1", "coordinator_id": "c1",
        "epoch": 1, "incarnation": "0000000000000001", "position": 1,
        "payload": {"key": "a", "n": 4}})
    .to_string();
    let cross_site = Request::post("/2pc/prepare")
        .header("host", "127.0.0.1:7001")
        .header("origin", "https://evil.example")
        .header("content-type", "application/json")
        .body(Body::from(prepare.clone()))
        .unwrap();
    let (status, text) = send(&app, cross_site).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("\"forbidden_origin\""), "{text}");
    let plain = Request::post("/2pc/prepare")
        .header("content-type", "text/plain")
        .body(Body::from(prepare.clone()))
        .unwrap();
    assert_eq!(
        send(&app, plain).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let untyped = Request::post("/2pc/prepare")
        .body(Body::from(prepare.clone()))
        .unwrap();
    assert_eq!(
        send(&app, untyped).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let rebound = Request::get("/v1/prepared")
        .header("host", "evil.example:7001")
        .body(Body::empty())
        .unwrap();
    let (status, text) = send(&app, rebound).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("\"forbidden_host\""), "{text}");
    let (status, text) = send(
        &app,
        Request::get("/v1/prepared")
            .header("host", "localhost:7001")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(
        !text.contains("t-x"),
        "a refused prepare prepared nothing: {text}"
    );
}
