//! The participant's decision client (`participant::decision_client`, what both backends use
//! to ask the coordinator) under the outbound policy: a redirect is an error and is not
//! followed, an endless answer is cut off at 1 MiB, a silent coordinator costs one decision
//! timeout; over HTTPS it trusts the given CA and nobody else. With a coordinator group
//! (`Coordinators`), the query reaches the leader past followers and dead addresses, and never
//! goes to a `leader` that is not configured.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use net::outbound::AnswerError;
use net::test_certs::TestCa;
use net::test_servers::{endless_server, raw_server, redirecting_server, silent_server};
use participant::decision_client::{Coordinators, QueryError, ask, build};
use protocol::DecisionStatus;
use protocol::auth::KeyRing;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

const COMMIT: &[u8] = br#"{"decision":"commit","coordinator_id":"c-1"}"#;

fn answer_ok(body: &[u8]) -> Vec<u8> {
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body);
    answer
}

#[tokio::test]
async fn a_well_behaved_coordinator_is_understood() {
    let coordinator = raw_server(|mut socket| async move {
        let _ = socket.write_all(&answer_ok(COMMIT)).await;
    })
    .await;
    let client = build(2_000, None).unwrap();
    let answer = ask(&client, &format!("{coordinator}/d"), &KeyRing::default())
        .await
        .unwrap();
    assert_eq!(answer.decision, DecisionStatus::Commit);
}

#[tokio::test]
async fn a_redirect_is_an_error_and_is_not_followed() {
    let (redirecting, followed) = redirecting_server("302 Found", answer_ok(COMMIT)).await;
    let client = build(2_000, None).unwrap();
    let error = ask(&client, &format!("{redirecting}/d"), &KeyRing::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            QueryError::Answer(AnswerError::Redirect { status: 302, .. })
        ),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !followed.load(Ordering::SeqCst),
        "the redirect was followed"
    );
}

#[tokio::test]
async fn an_endless_answer_is_cut_off_at_the_cap() {
    let written = Arc::new(AtomicU64::new(0));
    let endless = endless_server(b' ', Arc::clone(&written)).await;
    let client = build(5_000, None).unwrap();
    let started = Instant::now();
    let error = ask(&client, &format!("{endless}/d"), &KeyRing::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            QueryError::Answer(AnswerError::TooLarge { max: 1_048_576 })
        ),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "cut off by the cap, not the timeout"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = written.load(Ordering::SeqCst);
    assert!(sent < 32 << 20, "{sent} bytes sent for a 1 MiB cap");
}

#[tokio::test]
async fn a_silent_coordinator_costs_one_decision_timeout() {
    let silent = silent_server().await;
    let client = build(400, None).unwrap();
    let started = Instant::now();
    let error = ask(&client, &format!("{silent}/d"), &KeyRing::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, QueryError::Send(e) if e.is_timeout()),
        "{error:?}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn https_trusts_the_given_ca_and_nobody_else() {
    use axum::routing::get;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("cluster ca").unwrap();
    let files = ca
        .server(&["127.0.0.1"])
        .unwrap()
        .write(dir.path(), "coordinator")
        .unwrap();
    let server = net::server_config(&files.cert, &files.key).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/d",
        get(|| async { ([("content-type", "application/json")], COMMIT) }),
    );
    tokio::spawn(net::serve(
        listener,
        app,
        Some(server),
        std::future::pending(),
    ));
    let url = format!("https://127.0.0.1:{port}/d");

    let trusted = net::client_config(&ca.write_cert(dir.path()).unwrap()).unwrap();
    let client = build(2_000, Some(trusted)).unwrap();
    let answer = ask(&client, &url, &KeyRing::default()).await.unwrap();
    assert_eq!(answer.decision, DecisionStatus::Commit);

    let other_dir = tempfile::tempdir().unwrap();
    let other = TestCa::new("another ca").unwrap();
    let untrusted = net::client_config(&other.write_cert(other_dir.path()).unwrap()).unwrap();
    for (who, client) in [
        ("another CA", build(2_000, Some(untrusted)).unwrap()),
        ("no CA", build(2_000, None).unwrap()),
    ] {
        let error = ask(&client, &url, &KeyRing::default()).await.unwrap_err();
        assert!(
            format!("{error:?}").contains("UnknownIssuer"),
            "{who}: {error:?}"
        );
    }
}

/// A coordinator answering every request with `status` and `body` (JSON); counts requests.
async fn answering(status: u16, body: serde_json::Value) -> (String, Arc<AtomicU64>) {
    let count = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&count);
    let status = axum::http::StatusCode::from_u16(status).unwrap();
    let app = axum::Router::new().fallback(move || {
        let seen = Arc::clone(&seen);
        let body = body.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            (status, axum::Json(body))
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, count)
}

fn declined(code: protocol::ErrorCode, leader: Option<&str>) -> serde_json::Value {
    let mut body = protocol::ErrorBody::new(code, "not me");
    body.leader = leader.map(str::to_string);
    serde_json::to_value(body).unwrap()
}

fn leader_body() -> serde_json::Value {
    serde_json::from_slice(COMMIT).unwrap()
}

/// A loopback address nobody listens on: a port bound and let go.
fn unreachable() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

#[tokio::test]
async fn a_group_query_reaches_the_leader_a_follower_names() {
    use protocol::ErrorCode::{NotLeader, NotReady};
    let (leader, at_leader) = answering(200, leader_body()).await;
    let (follower, at_follower) = answering(503, declined(NotLeader, Some(&leader))).await;
    // In list order the recovering node would come next; the named leader goes first.
    let (recovering, at_recovering) = answering(503, declined(NotReady, None)).await;
    let group = Coordinators::new(
        build(2_000, None).unwrap(),
        &[unreachable(), follower, recovering, format!("{leader}/")],
    );
    let answer = group.ask("/d", &KeyRing::default()).await.unwrap();
    assert_eq!(answer.decision, DecisionStatus::Commit);
    assert_eq!(at_follower.load(Ordering::SeqCst), 1);
    assert_eq!(at_recovering.load(Ordering::SeqCst), 0);
    assert_eq!(at_leader.load(Ordering::SeqCst), 1);
    // The next query goes straight to the coordinator that answered.
    group.ask("/d", &KeyRing::default()).await.unwrap();
    assert_eq!(at_follower.load(Ordering::SeqCst), 1);
    assert_eq!(at_leader.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_leader_that_is_not_configured_is_never_asked() {
    let (outside, at_outside) = answering(200, leader_body()).await;
    let (follower, at_follower) = answering(
        503,
        declined(protocol::ErrorCode::NotLeader, Some(&outside)),
    )
    .await;
    let dead = unreachable();
    let group = Coordinators::new(
        build(2_000, None).unwrap(),
        &[follower.clone(), dead.clone()],
    );
    let error = group.ask("/d", &KeyRing::default()).await.unwrap_err();
    assert_eq!(at_outside.load(Ordering::SeqCst), 0);
    assert_eq!(at_follower.load(Ordering::SeqCst), 1);
    assert_eq!(error.0.len(), 2, "each address once: {error}");
    let text = error.to_string();
    assert!(text.contains(&format!("{follower}: not_leader")), "{text}");
    assert!(text.contains(&dead), "{text}");
}

#[tokio::test]
async fn another_refusal_is_that_coordinators_word() {
    // A 401 is no reason to ask elsewhere (it would only spread the token): it ends the query.
    let (refusing, _) = answering(
        401,
        serde_json::to_value(protocol::ErrorBody::new(
            protocol::ErrorCode::Unauthorized,
            "no token",
        ))
        .unwrap(),
    )
    .await;
    let (leader, at_leader) = answering(200, leader_body()).await;
    let group = Coordinators::new(build(2_000, None).unwrap(), &[refusing, leader]);
    let error = group.ask("/d", &KeyRing::default()).await.unwrap_err();
    assert!(
        matches!(
            error.0.as_slice(),
            [(_, QueryError::Status { status: 401 })]
        ),
        "{error}"
    );
    assert_eq!(at_leader.load(Ordering::SeqCst), 0);
}
