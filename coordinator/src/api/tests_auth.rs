//! Authentication on every route (issue 17): no token, a wrong token, a token of the wrong
//! kind and a rotated-out token each get the documented status and JSON error; the right
//! token gets through; `/ui` takes the operator token as HTTP Basic and asks browsers for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use protocol::ParticipantName;
use protocol::auth::{Access, KeyRing, Keys, encode_base64, parse_named, parse_plain};

use super::auth::access;
use super::{AppState, ROUTES, router};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::recover;

const CLIENT_OLD: &str = "client-old-token-0001";
const CLIENT_NEW: &str = "client-new-token-0002";
const OPERATOR_OLD: &str = "operator-old-token-0003";
const OPERATOR_NEW: &str = "operator-new-token-0004";
const PEER_OLD: &str = "peer-old-token-000005";
const PEER_NEW: &str = "peer-new-token-000006";
const METRICS_OLD: &str = "metrics-old-token-0007";
const METRICS_NEW: &str = "metrics-new-token-0008";
const WRONG: &str = "nobody-knows-this-token";

/// The key set before a rotation (old tokens) or after it (new tokens only).
fn keys(new: bool) -> Keys {
    let pick = |old: &str, fresh: &str| {
        if new {
            fresh.to_string()
        } else {
            old.to_string()
        }
    };
    Keys {
        client: Some(
            parse_named(
                "clients",
                &format!("alice {}", pick(CLIENT_OLD, CLIENT_NEW)),
            )
            .unwrap(),
        ),
        operator: Some(
            parse_named(
                "operators",
                &format!("olga {}", pick(OPERATOR_OLD, OPERATOR_NEW)),
            )
            .unwrap(),
        ),
        peer: Some(parse_plain("peers", &pick(PEER_OLD, PEER_NEW)).unwrap()),
        metrics: Some(parse_plain("metrics", &pick(METRICS_OLD, METRICS_NEW)).unwrap()),
    }
}

async fn app(keys: &KeyRing) -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let participants: BTreeMap<_, _> = [("inventory", "http://127.0.0.1:9")]
        .iter()
        .map(|(n, url)| (ParticipantName::new(*n).unwrap(), url.to_string()))
        .collect();
    let mut config = Config::for_tests(dir.path().to_path_buf(), participants);
    config.keys = keys.clone();
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics)).with_keys(keys.clone());
    let core = recover(&config, metrics).await.unwrap();
    state.set_ready(core);
    (router(state), dir)
}

/// A concrete URI for a route template.
fn uri(path: &str) -> String {
    path.replace("{id}", "t-auth-1")
        .replace("{name}", "inventory")
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> (StatusCode, Value, Vec<String>) {
    let mut request = Request::builder()
        .method(method.to_ascii_uppercase().as_str())
        .uri(uri(path))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let body = if method == "post" { "{}" } else { "" };
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let challenges = response
        .headers()
        .get_all(header::WWW_AUTHENTICATE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value, challenges)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A token this route accepts, before (`new = false`) or after the rotation.
fn right_token(access: Access, new: bool) -> &'static str {
    let pick = |old, fresh| if new { fresh } else { old };
    match access {
        Access::Client => pick(CLIENT_OLD, CLIENT_NEW),
        Access::Peer => pick(PEER_OLD, PEER_NEW),
        Access::Operator | Access::PeerOrOperator => pick(OPERATOR_OLD, OPERATOR_NEW),
        Access::Metrics => pick(METRICS_OLD, METRICS_NEW),
        Access::Open => WRONG,
    }
}

/// A valid token this route does not take.
fn wrong_kind(access: Access) -> &'static str {
    match access {
        Access::Client | Access::Metrics => PEER_OLD,
        Access::Peer | Access::Operator | Access::PeerOrOperator => CLIENT_OLD,
        Access::Open => WRONG,
    }
}

fn assert_refused(
    what: &str,
    (status, body, challenges): &(StatusCode, Value, Vec<String>),
    expected: StatusCode,
) {
    assert_eq!(*status, expected, "{what}: {body}");
    let code = if expected == StatusCode::UNAUTHORIZED {
        "unauthorized"
    } else {
        "forbidden"
    };
    assert_eq!(body["error"], code, "{what}: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}"
    );
    if expected == StatusCode::UNAUTHORIZED {
        assert!(
            challenges.iter().any(|c| c.starts_with("Bearer")),
            "{what}: challenges {challenges:?}"
        );
    }
}

fn assert_through(what: &str, (status, body, _): &(StatusCode, Value, Vec<String>)) {
    assert!(
        *status != StatusCode::UNAUTHORIZED && *status != StatusCode::FORBIDDEN,
        "{what}: {status} {body}"
    );
}

#[tokio::test]
async fn every_route_checks_its_callers() {
    let ring = KeyRing::new(keys(false));
    let (app, _dir) = app(&ring).await;
    for (method, path) in ROUTES {
        let access = access(path).unwrap();
        let what = format!("{method} {path}");
        if access == Access::Open {
            assert_through(&what, &call(&app, method, path, None).await);
            continue;
        }
        assert_refused(
            &format!("{what}, no token"),
            &call(&app, method, path, None).await,
            StatusCode::UNAUTHORIZED,
        );
        assert_refused(
            &format!("{what}, wrong token"),
            &call(&app, method, path, Some(&bearer(WRONG))).await,
            StatusCode::UNAUTHORIZED,
        );
        assert_refused(
            &format!("{what}, token of the wrong kind"),
            &call(&app, method, path, Some(&bearer(wrong_kind(access)))).await,
            StatusCode::FORBIDDEN,
        );
        assert_through(
            &format!("{what}, right token"),
            &call(
                &app,
                method,
                path,
                Some(&bearer(right_token(access, false))),
            )
            .await,
        );
        if access == Access::Client {
            assert_through(
                &format!("{what}, operator token on a client route"),
                &call(&app, method, path, Some(&bearer(OPERATOR_OLD))).await,
            );
        }
    }
}

#[tokio::test]
async fn a_rotated_out_token_is_refused_and_its_successor_taken() {
    let ring = KeyRing::new(keys(false));
    let (app, _dir) = app(&ring).await;
    ring.replace(keys(true));
    for (method, path) in ROUTES {
        let access = access(path).unwrap();
        if access == Access::Open {
            continue;
        }
        let what = format!("{method} {path}");
        assert_refused(
            &format!("{what}, rotated-out token"),
            &call(
                &app,
                method,
                path,
                Some(&bearer(right_token(access, false))),
            )
            .await,
            StatusCode::UNAUTHORIZED,
        );
        assert_through(
            &format!("{what}, its successor"),
            &call(&app, method, path, Some(&bearer(right_token(access, true)))).await,
        );
    }
}

#[tokio::test]
async fn the_live_page_asks_a_browser_for_basic_credentials() {
    let ring = KeyRing::new(keys(false));
    let (app, _dir) = app(&ring).await;
    let (status, _, challenges) = call(&app, "get", "/ui", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        challenges.iter().any(|c| c == "Basic realm=\"twopc\""),
        "{challenges:?}"
    );
    let basic = format!(
        "Basic {}",
        encode_base64(format!("olga:{OPERATOR_OLD}").as_bytes())
    );
    for path in ["/ui", "/v1/cluster", "/v1/audit"] {
        let (status, body, _) = call(&app, "get", path, Some(&basic)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let client_basic = format!(
        "Basic {}",
        encode_base64(format!("alice:{CLIENT_OLD}").as_bytes())
    );
    let (status, _, _) = call(&app, "get", "/ui", Some(&client_basic)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_operator_named_by_the_token_is_the_one_audited() {
    let ring = KeyRing::new(keys(false));
    let (app, _dir) = app(&ring).await;
    let request = Request::post("/v1/participants/inventory/retry")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, bearer(OPERATOR_OLD))
        .body(Body::from(
            json!({"operator": "mallory", "reason": "testing"}).to_string(),
        ))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
        "{status} {}",
        String::from_utf8_lossy(&bytes)
    );
    let (status, audit, _) = call(&app, "get", "/v1/audit", Some(&bearer(OPERATOR_OLD))).await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let text = audit.to_string();
    assert!(text.contains("\"olga\""), "{text}");
    assert!(!text.contains("mallory"), "{text}");
}

#[tokio::test]
async fn auth_off_leaves_every_route_open() {
    let (app, _dir) = app(&KeyRing::default()).await;
    for (method, path) in ROUTES {
        assert_through(
            &format!("{method} {path}"),
            &call(&app, method, path, None).await,
        );
    }
}

#[tokio::test]
async fn the_client_named_by_the_token_is_recorded_on_the_transaction() {
    let ring = KeyRing::new(keys(false));
    let (app, _dir) = app(&ring).await;
    // The participant is unreachable, so the attempt aborts; the name is recorded either way.
    let request = Request::post("/v1/transactions")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, bearer(CLIENT_OLD))
        .body(Body::from(
            json!({
                "id": "t-named-1",
                "participants": [{"name": "inventory", "payload": {}}],
                "timeout_ms": 200
            })
            .to_string(),
        ))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let (status, shown, _) = call(
        &app,
        "get",
        "/v1/transactions/t-named-1",
        Some(&bearer(OPERATOR_OLD)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["client"], json!("alice"), "{shown}");
}

#[tokio::test]
async fn the_client_named_by_the_token_is_recorded_on_the_saga() {
    let ring = KeyRing::new(keys(false));
    let (app, _dir) = app(&ring).await;
    let saga = json!({"id": "s-named-1", "timeout_ms": 30000, "steps": [
        {"name": "reserve", "participant": "inventory", "action": {}, "compensation": null}]});
    let request = Request::post("/v1/sagas?wait=none")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, bearer(CLIENT_OLD))
        .body(Body::from(saga.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let accepted: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(accepted["client"], json!("alice"), "{accepted}");
    let (status, shown, _) = call(
        &app,
        "get",
        "/v1/sagas/s-named-1",
        Some(&bearer(OPERATOR_OLD)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["client"], json!("alice"), "{shown}");
}

#[tokio::test]
async fn with_tokens_any_host_is_answered() {
    // The Host rule is for the no-auth default only: with tokens a rebinding page has none.
    let ring = KeyRing::new(keys(false));
    let (app, _dir) = app(&ring).await;
    let request = Request::get("/v1/cluster")
        .header(header::HOST, "coordinator.internal.example:7100")
        .header(header::AUTHORIZATION, bearer(OPERATOR_OLD))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
