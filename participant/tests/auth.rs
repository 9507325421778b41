//! Authentication on every participant route (issue 17): no token, a wrong token, a token of
//! the wrong kind and a rotated-out token get the documented status and JSON error; the right
//! token gets through; and forged protocol messages change nothing.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use participant::auth::{ROUTES, access};
use participant::kv::{KvStore, routes};
use participant::{Participant, ParticipantConfig};
use protocol::CoordinatorId;
use protocol::auth::{Access, KeyRing, Keys, parse_named, parse_plain};
use serde_json::{Value, json};
use tower::ServiceExt;

const CLIENT_OLD: &str = "client-old-token-0001";
const CLIENT_NEW: &str = "client-new-token-0002";
const OPERATOR_OLD: &str = "operator-old-token-0003";
const OPERATOR_NEW: &str = "operator-new-token-0004";
const PEER_OLD: &str = "peer-old-token-000005";
const PEER_NEW: &str = "peer-new-token-000006";
const METRICS_OLD: &str = "metrics-old-token-0007";
const METRICS_NEW: &str = "metrics-new-token-0008";
const WRONG: &str = "nobody-knows-this-token";

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
                &format!("worker {}", pick(CLIENT_OLD, CLIENT_NEW)),
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

fn kv(ring: &KeyRing) -> (Router, Participant<KvStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let seed = KvStore::from_seed(br#"{"stock:sku-1": 10}"#).unwrap();
    let mut config = ParticipantConfig::new(dir.path());
    config.keys = ring.clone();
    let participant = Participant::open(config, || seed).unwrap();
    (routes::app(&participant), participant, dir)
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value, Vec<String>) {
    let path = path
        .replace("{key}", "stock:sku-1")
        .replace("{gtid}", "c1:0000000000000001:1")
        .replace("{op_id}", "op-1");
    let mut request = Request::builder()
        .method(method.to_ascii_uppercase().as_str())
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let body = match body {
        Some(body) => body.to_string(),
        None if method == "get" => String::new(),
        None => "{}".to_string(),
    };
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
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        challenges,
    )
}

fn right_token(access: Access, new: bool) -> &'static str {
    let pick = |old, fresh| if new { fresh } else { old };
    match access {
        Access::Client => pick(CLIENT_OLD, CLIENT_NEW),
        Access::Peer | Access::PeerOrOperator => pick(PEER_OLD, PEER_NEW),
        Access::Operator => pick(OPERATOR_OLD, OPERATOR_NEW),
        Access::Metrics => pick(METRICS_OLD, METRICS_NEW),
        Access::Open => WRONG,
    }
}

fn wrong_kind(access: Access) -> &'static str {
    match access {
        Access::Client | Access::Metrics => PEER_OLD,
        Access::Peer | Access::Operator | Access::PeerOrOperator => CLIENT_OLD,
        Access::Open => WRONG,
    }
}

fn assert_refused(what: &str, answer: &(StatusCode, Value, Vec<String>), expected: StatusCode) {
    let (status, body, challenges) = answer;
    assert_eq!(*status, expected, "{what}: {body}");
    let code = if expected == StatusCode::UNAUTHORIZED {
        assert!(
            challenges.iter().any(|c| c.starts_with("Bearer")),
            "{what}: {challenges:?}"
        );
        "unauthorized"
    } else {
        "forbidden"
    };
    assert_eq!(body["error"], code, "{what}: {body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

fn assert_through(what: &str, (status, body, _): &(StatusCode, Value, Vec<String>)) {
    assert!(
        *status != StatusCode::UNAUTHORIZED && *status != StatusCode::FORBIDDEN,
        "{what}: {status} {body}"
    );
}

#[tokio::test]
async fn every_route_checks_its_callers_and_a_rotation_retires_old_tokens() {
    let ring = KeyRing::new(keys(false));
    let (app, _participant, _dir) = kv(&ring);
    for (method, path) in ROUTES {
        let access = access(path).unwrap();
        let what = format!("{method} {path}");
        if access == Access::Open {
            assert_through(&what, &call(&app, method, path, None, None).await);
            continue;
        }
        for (case, token, expected) in [
            ("no token", None, StatusCode::UNAUTHORIZED),
            ("wrong token", Some(WRONG), StatusCode::UNAUTHORIZED),
            (
                "wrong kind",
                Some(wrong_kind(access)),
                StatusCode::FORBIDDEN,
            ),
        ] {
            let answer = call(&app, method, path, token, None).await;
            assert_refused(&format!("{what}, {case}"), &answer, expected);
        }
        let right = right_token(access, false);
        assert_through(&what, &call(&app, method, path, Some(right), None).await);
        if access == Access::PeerOrOperator {
            let answer = call(&app, method, path, Some(OPERATOR_OLD), None).await;
            assert_through(&format!("{what}, operator"), &answer);
        }
    }
    ring.replace(keys(true));
    for (method, path) in ROUTES {
        let access = access(path).unwrap();
        if access == Access::Open {
            continue;
        }
        let what = format!("{method} {path}");
        let old = call(&app, method, path, Some(right_token(access, false)), None).await;
        assert_refused(
            &format!("{what}, rotated out"),
            &old,
            StatusCode::UNAUTHORIZED,
        );
        let new = call(&app, method, path, Some(right_token(access, true)), None).await;
        assert_through(&format!("{what}, successor"), &new);
    }
}

#[tokio::test]
async fn forged_protocol_messages_change_nothing() {
    let ring = KeyRing::new(keys(false));
    let (app, participant, _dir) = kv(&ring);
    let ops = json!({"ops": [{"op": "add", "key": "stock:sku-1", "delta": -1, "min": 0}]});
    let prepare = serde_json::to_value(common::prepare("t1", 1, ops.clone())).unwrap();
    let (status, vote, _) = call(&app, "post", "/2pc/prepare", Some(PEER_OLD), Some(prepare)).await;
    assert_eq!((status, vote), (StatusCode::OK, json!({"vote": "yes"})));

    let before = observe(&app, &participant).await;
    let decision = serde_json::to_value(common::decision("t1", 1)).unwrap();
    let forged_epoch = serde_json::to_value(common::decision("t1", u64::MAX)).unwrap();
    let forged_prepare = serde_json::to_value(common::prepare("t2", u64::MAX, ops)).unwrap();
    for token in [None, Some(WRONG), Some(CLIENT_OLD), Some(OPERATOR_OLD)] {
        for (route, body) in [
            ("/2pc/commit", &decision),
            ("/2pc/abort", &decision),
            ("/2pc/commit", &forged_epoch),
            ("/2pc/abort", &forged_epoch),
            ("/2pc/prepare", &forged_prepare),
        ] {
            let (status, answer, _) = call(&app, "post", route, token, Some(body.clone())).await;
            assert!(
                status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN,
                "{route} with {token:?}: {status} {answer}"
            );
        }
    }
    assert_eq!(observe(&app, &participant).await, before);
    assert_eq!(
        before.0.as_array().map(Vec::len),
        Some(1),
        "t1 still prepared"
    );
}

/// What a forged message could change: the prepared set and the store (read through the
/// participant's own routes with valid tokens), and the epoch it holds for `c1`.
async fn observe(app: &Router, participant: &Participant<KvStore>) -> (Value, Value, Option<u64>) {
    let (status, prepared, _) = call(app, "get", "/v1/prepared", Some(OPERATOR_OLD), None).await;
    assert_eq!(status, StatusCode::OK, "{prepared}");
    let (status, stock, _) = call(app, "get", "/v1/kv/{key}", Some(CLIENT_OLD), None).await;
    assert_eq!(status, StatusCode::OK, "{stock}");
    let c1 = CoordinatorId::new("c1").unwrap();
    let epoch = participant.with_engine(|engine| engine.highest_epoch(&c1).map(|f| f.epoch.0));
    (prepared["prepared"].clone(), stock, epoch)
}
