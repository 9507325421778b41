//! The lease routes over HTTP (`Router::oneshot`): the contract's shapes, every bad input as a
//! 4xx JSON error, and tokens that stay higher than any given across a restart.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::tests::{JSON, call, ready_router};
use super::{AppState, router};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::recover;

fn body(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

#[tokio::test]
async fn acquire_renew_release_read_and_list_keep_the_contract_shapes() {
    let (app, _dir) = ready_router().await;
    let uri = "/v1/leases/orders-partition-3";
    let (status, a) = call(
        &app,
        "POST",
        uri,
        JSON,
        body(json!({"holder": "worker-a", "ttl_ms": 5000})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(
        (
            a["name"].as_str(),
            a["holder"].as_str(),
            a["ttl_ms"].as_u64()
        ),
        (Some("orders-partition-3"), Some("worker-a"), Some(5000))
    );
    let token = a["token"].as_u64().unwrap();
    assert!(token >= 1 && a["expires_at_ms"].as_u64().unwrap() > 0);

    let (status, held) = call(
        &app,
        "POST",
        uri,
        JSON,
        body(json!({"holder": "worker-b", "ttl_ms": 5000})),
    )
    .await;
    assert_eq!(
        (status, held["error"].as_str(), held["holder"].as_str()),
        (StatusCode::CONFLICT, Some("lease_held"), Some("worker-a")),
        "{held}"
    );
    assert!(held["expires_in_ms"].as_u64().unwrap() <= 5000);

    // The same holder acquiring again renews under the same token.
    let (status, again) = call(
        &app,
        "POST",
        uri,
        JSON,
        body(json!({"holder": "worker-a", "ttl_ms": 5000})),
    )
    .await;
    assert_eq!(
        (status, again["token"].as_u64()),
        (StatusCode::OK, Some(token))
    );
    let (status, renewed) = call(
        &app,
        "POST",
        &format!("{uri}/renew"),
        JSON,
        body(json!({"holder": "worker-a", "token": token})),
    )
    .await;
    assert_eq!(
        (status, renewed["token"].as_u64()),
        (StatusCode::OK, Some(token)),
        "{renewed}"
    );

    let (status, one) = call(&app, "GET", uri, None, vec![]).await;
    assert_eq!(
        (status, one["holder"].as_str(), one["renewable"].as_bool()),
        (StatusCode::OK, Some("worker-a"), Some(true))
    );
    let (status, all) = call(&app, "GET", "/v1/leases", None, vec![]).await;
    assert_eq!(
        (status, all["leases"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(1))
    );

    let release = format!("{uri}?holder=worker-a&token={token}");
    let (status, first) = call(&app, "DELETE", &release, None, vec![]).await;
    assert_eq!(
        (status, first),
        (
            StatusCode::OK,
            json!({"name": "orders-partition-3", "token": token, "released": true})
        )
    );
    let (status, second) = call(&app, "DELETE", &release, None, vec![]).await;
    assert_eq!(
        (status, second["released"].as_bool()),
        (StatusCode::OK, Some(false)),
        "idempotent"
    );
    let (status, gone) = call(&app, "GET", uri, None, vec![]).await;
    assert_eq!(
        (status, gone["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, lost) = call(
        &app,
        "POST",
        &format!("{uri}/renew"),
        JSON,
        body(json!({"holder": "worker-a", "token": token})),
    )
    .await;
    assert_eq!(
        (status, lost["error"].as_str()),
        (StatusCode::CONFLICT, Some("lease_lost")),
        "never revived"
    );

    let (_, b) = call(&app, "POST", uri, JSON, body(json!({"holder": "worker-b"}))).await;
    assert_eq!(
        (b["token"].as_u64(), b["ttl_ms"].as_u64()),
        (Some(token + 1), Some(10_000)),
        "{b}"
    );
    let (status, small) = call(
        &app,
        "POST",
        "/v1/leases/tiny",
        JSON,
        body(json!({"holder": "x", "ttl_ms": 1})),
    )
    .await;
    assert_eq!(
        (status, small["ttl_ms"].as_u64()),
        (StatusCode::OK, Some(100)),
        "raised to the minimum"
    );
}

#[tokio::test]
async fn every_bad_lease_input_is_a_clear_4xx_json_error() {
    let (app, _dir) = ready_router().await;
    let (_, a) = call(
        &app,
        "POST",
        "/v1/leases/l",
        JSON,
        body(json!({"holder": "a"})),
    )
    .await;
    let token = a["token"].as_u64().unwrap();
    let long = "x".repeat(129);
    // (method, uri, content type, body, expected status, expected code)
    type Case<'a> = (&'a str, String, Option<&'a str>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            body(json!({"holder": "a", "ttl_ms": 0})),
            422,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            body(json!({"holder": "a", "ttl_ms": 600_001})),
            422,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            body(json!({"holder": "a", "ttl_ms": -5})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            format!("/v1/leases/{long}"),
            JSON,
            body(json!({"holder": "a"})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            body(json!({"holder": ""})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            body(json!({"holder": long})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            body(json!({"holder": "a b"})),
            422,
            "invalid_id",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            body(json!({"ttl_ms": 5})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            JSON,
            b"{not json".to_vec(),
            400,
            "malformed_json",
        ),
        (
            "POST",
            "/v1/leases/m".into(),
            None,
            body(json!({"holder": "a"})),
            415,
            "unsupported_media_type",
        ),
        (
            "POST",
            "/v1/leases/l/renew".into(),
            JSON,
            body(json!({"holder": "a", "token": "7"})),
            400,
            "malformed_json",
        ),
        (
            "POST",
            "/v1/leases/l/renew".into(),
            JSON,
            body(json!({"holder": "b", "token": token})),
            409,
            "lease_lost",
        ),
        (
            "POST",
            "/v1/leases/l/renew".into(),
            JSON,
            body(json!({"holder": "a", "token": token + 9})),
            409,
            "lease_lost",
        ),
        (
            "DELETE",
            "/v1/leases/l?holder=a&token=seven".into(),
            None,
            vec![],
            400,
            "invalid_query",
        ),
        (
            "DELETE",
            "/v1/leases/l?holder=a".into(),
            None,
            vec![],
            400,
            "invalid_query",
        ),
        (
            "DELETE",
            format!("/v1/leases/l?holder=b&token={token}"),
            None,
            vec![],
            409,
            "lease_lost",
        ),
        (
            "PUT",
            "/v1/leases/l".into(),
            JSON,
            vec![],
            405,
            "method_not_allowed",
        ),
    ];
    for (method, uri, content_type, payload, status, code) in cases {
        let (got, answer) = call(&app, method, &uri, content_type, payload).await;
        assert_eq!(
            (got.as_u16(), answer["error"].as_str()),
            (status, Some(code)),
            "{method} {uri}: {answer}"
        );
        assert!(
            answer["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
    }
    let (_, still) = call(&app, "GET", "/v1/leases/l", None, vec![]).await;
    assert_eq!(
        still["token"].as_u64(),
        Some(token),
        "nothing bad changed the lease"
    );
}

/// Restarts a coordinator on `dir` and returns its router.
async fn start(dir: &std::path::Path) -> (axum::Router, Arc<crate::runtime::Core>) {
    let config = Config::for_tests(dir.to_path_buf(), BTreeMap::new());
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(Arc::clone(&metrics));
    let core = recover(&config, metrics).await.unwrap();
    state.set_ready(Arc::clone(&core));
    (router(state), core)
}

#[tokio::test]
async fn after_a_restart_tokens_stay_higher_and_a_held_lease_stays_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut last = 0;
    for round in 0..3 {
        let (app, core) = start(dir.path()).await;
        if round == 1 {
            // A checkpoint carries the lease state (the log before it can go).
            core.checkpoint().await.unwrap();
        }
        let (status, held) = call(
            &app,
            "POST",
            "/v1/leases/x",
            JSON,
            body(json!({"holder": format!("w{round}"), "ttl_ms": 60_000})),
        )
        .await;
        if round == 0 {
            assert_eq!(status, StatusCode::OK, "{held}");
        } else {
            // Held by round 0's worker: a full TTL since each restart.
            assert_eq!(
                (status, held["holder"].as_str()),
                (StatusCode::CONFLICT, Some("w0")),
                "{held}"
            );
        }
        let (status, other) = call(
            &app,
            "POST",
            &format!("/v1/leases/y{round}"),
            JSON,
            body(json!({"holder": "w"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let token = other["token"].as_u64().unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
        core.close_log();
    }
}
