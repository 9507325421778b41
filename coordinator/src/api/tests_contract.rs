//! Where the server was looser than docs/openapi.json states (found by schemathesis and by
//! reading the document against the handlers), each now answered as the document says: a body
//! that is a JSON array where an object is due, a number with a sign, a cursor too long for the
//! pattern, a saga step without `compensation`, and an operator claim that breaks the rules
//! while an operator token replaces it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use protocol::ParticipantName;
use protocol::auth::{KeyRing, Keys, parse_named};

use super::tests::{JSON, call, ready_router};
use super::{AppState, router};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::recover;

const OPERATOR: &str = "contract-operator-token-01";

fn error(status: u16, code: &str) -> (u16, Option<String>) {
    (status, Some(code.to_string()))
}

fn answer(status: axum::http::StatusCode, body: &Value) -> (u16, Option<String>) {
    (
        status.as_u16(),
        body["error"].as_str().map(ToString::to_string),
    )
}

#[tokio::test]
async fn a_json_array_is_not_an_object_body_anywhere() {
    let (app, _dir) = ready_router().await;
    let cases = [
        (
            "POST",
            "/v1/transactions",
            json!([null, [{"name": "inventory", "payload": {}}]]),
        ),
        (
            "POST",
            "/v1/transactions",
            json!({"participants": [["inventory", {}]]}),
        ),
        (
            "POST",
            "/v1/sagas",
            json!(["s-1", [["a", "inventory", {}, null]]]),
        ),
        (
            "POST",
            "/v1/sagas",
            json!({"id": "s-1", "steps": [["a", "inventory", {}, null]]}),
        ),
        ("POST", "/v1/leases/l-1", json!(["holder-1"])),
        ("POST", "/v1/leases/l-1/renew", json!(["holder-1", 1])),
        ("POST", "/v1/transactions/t-1/retry", json!([])),
        ("POST", "/v1/participants/inventory/retry", json!([])),
        ("POST", "/v1/sagas/s-1/retry", json!([])),
        (
            "POST",
            "/v1/transactions/t-1/resolve",
            json!(["abort", "olga", "why"]),
        ),
        ("POST", "/v1/sagas/s-1/resolve", json!(["olga", "why"])),
        ("POST", "/v1/transactions/t-1/retry", json!("retry")),
    ];
    for (method, uri, body) in cases {
        let (status, got) = call(&app, method, uri, JSON, body.to_string().into_bytes()).await;
        assert_eq!(
            answer(status, &got),
            error(400, "malformed_json"),
            "{method} {uri} {body}: {got}"
        );
        assert!(
            got["message"]
                .as_str()
                .unwrap()
                .contains("expected a JSON object"),
            "{got}"
        );
    }
}

#[tokio::test]
async fn a_saga_step_without_compensation_is_refused_not_made_a_pivot() {
    let (app, _dir) = ready_router().await;
    let body = json!({"id": "s-nocomp", "steps": [
        {"name": "a", "participant": "inventory", "action": {"ops": []}}]});
    let (status, got) = call(
        &app,
        "POST",
        "/v1/sagas",
        JSON,
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(answer(status, &got), error(400, "malformed_json"), "{got}");
    assert!(got["message"].as_str().unwrap().contains("compensation"));
}

#[tokio::test]
async fn numbers_in_queries_are_digits_and_cursors_fit_the_pattern() {
    let (app, _dir) = ready_router().await;
    for uri in [
        "/v1/transactions?limit=%2B5",
        "/v1/sagas?limit=%2B5",
        "/v1/audit?limit=%2B5",
        "/v1/audit?before=%2B5",
        "/v1/audit?before=-1",
        "/v1/transactions?after=%2B1-2",
        "/v1/transactions?after=12345678901234567890-1",
        "/v1/transactions?after=1-",
        "/v1/transactions/t-1/decision?gtid=c-1:00000000000000aa:1&incarnation=00000000000000aa&epoch=%2B1&position=1",
        "/v1/transactions/t-1/decision?gtid=c-1:00000000000000aa:1&incarnation=00000000000000aa&epoch=1&position=18446744073709551616",
    ] {
        let (status, got) = call(&app, "GET", uri, None, vec![]).await;
        assert_eq!(
            answer(status, &got),
            error(400, "invalid_query"),
            "{uri}: {got}"
        );
    }
    let (status, got) = call(
        &app,
        "DELETE",
        "/v1/leases/l-1?holder=h&token=%2B1",
        None,
        vec![],
    )
    .await;
    assert_eq!(answer(status, &got), error(400, "invalid_query"), "{got}");
    // What the document allows still works: the largest u64, a 19-digit cursor.
    for uri in [
        "/v1/transactions?limit=1000&after=9999999999999999999-9999999999999999999",
        "/v1/audit?limit=1&before=18446744073709551615",
        "/v1/transactions/t-1/decision?gtid=c-1:00000000000000aa:1&incarnation=00000000000000aa&epoch=18446744073709551615&position=0",
    ] {
        let (status, got) = call(&app, "GET", uri, None, vec![]).await;
        assert_eq!(status.as_u16(), 200, "{uri}: {got}");
    }
}

async fn authenticated_app() -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let participants: BTreeMap<_, _> = [("inventory", "http://127.0.0.1:9")]
        .iter()
        .map(|(n, url)| (ParticipantName::new(*n).unwrap(), url.to_string()))
        .collect();
    let keys = KeyRing::new(Keys {
        operator: Some(parse_named("operators", &format!("olga {OPERATOR}")).unwrap()),
        ..Keys::default()
    });
    let mut config = Config::for_tests(dir.path().to_path_buf(), participants);
    config.keys = keys.clone();
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics)).with_keys(keys);
    let core = recover(&config, metrics).await.unwrap();
    state.set_ready(core);
    (router(state), dir)
}

async fn as_operator(app: &Router, uri: &str, body: &Value) -> (u16, Value) {
    let request = Request::builder()
        .method("POST")
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {OPERATOR}"))
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn an_operator_claim_is_checked_even_when_the_token_name_replaces_it() {
    let (app, _dir) = authenticated_app().await;
    let long = "o".repeat(protocol::operator::OPERATOR_LEN_MAX + 1);
    let long_reason = "r".repeat(protocol::operator::REASON_LEN_MAX + 1);
    let cases = [
        ("/v1/transactions/t-1/retry", json!({"operator": ""})),
        ("/v1/transactions/t-1/retry", json!({"operator": long})),
        ("/v1/transactions/t-1/retry", json!({"reason": "  \t "})),
        (
            "/v1/participants/inventory/retry",
            json!({"reason": long_reason}),
        ),
        ("/v1/sagas/s-1/retry", json!({"operator": " "})),
        (
            "/v1/transactions/t-1/resolve",
            json!({"decision": "abort", "operator": long, "reason": "why"}),
        ),
        (
            "/v1/sagas/s-1/resolve",
            json!({"operator": "", "reason": "why"}),
        ),
    ];
    for (uri, body) in cases {
        let (status, got) = as_operator(&app, uri, &body).await;
        assert_eq!(
            (status, got["error"].as_str()),
            (422, Some("invalid_operator")),
            "{uri} {body}: {got}"
        );
    }
    // Within the rules the token's name is what the audit records; lengths are characters.
    let wide = "é".repeat(protocol::operator::OPERATOR_LEN_MAX);
    let (status, got) = as_operator(
        &app,
        "/v1/participants/inventory/retry",
        &json!({"operator": wide, "reason": "ü".repeat(protocol::operator::REASON_LEN_MAX)}),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    let request = Request::builder()
        .uri("/v1/audit")
        .header(header::AUTHORIZATION, format!("Bearer {OPERATOR}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let audit: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(audit["audit"][0]["operator"], "olga", "{audit}");
    assert_eq!(audit["audit"].as_array().unwrap().len(), 1, "{audit}");
}
