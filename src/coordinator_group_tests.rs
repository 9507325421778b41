//! The address list and the try-in-turn policy, against small axum servers on loopback: a
//! follower answering 503 `not_leader` (naming a leader), an address nobody listens on, and a
//! leader answering 200.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode as AxumStatus;
use axum::response::IntoResponse;
use serde_json::json;

use super::*;

/// A server answering every request with `status` and `body`; counts what it received.
async fn server(status: u16, body: Value) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    let status = AxumStatus::from_u16(status).unwrap();
    let app = axum::Router::new().fallback(move || {
        let seen = Arc::clone(&seen);
        let body = body.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            (status, axum::Json(body)).into_response()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, count)
}

async fn leader() -> (String, Arc<AtomicUsize>) {
    server(200, json!({"from": "leader"})).await
}

async fn follower(leader: Option<&str>) -> (String, Arc<AtomicUsize>) {
    let mut body = ErrorBody::new(ErrorCode::NotLeader, "this node follows");
    body.leader = leader.map(str::to_string);
    server(503, serde_json::to_value(body).unwrap()).await
}

/// A loopback address nobody listens on: a port bound and let go.
fn unreachable() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

fn group(urls: &[&str]) -> Group {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    Group::new(client, Addresses::parse(&urls.join(",")).unwrap()).with_patience(Patience {
        rounds: 2,
        pause: Duration::from_millis(10),
    })
}

#[test]
fn a_list_is_checked_and_duplicates_refused() {
    let one = Addresses::parse("http://127.0.0.1:7100/").unwrap();
    assert_eq!(one.urls(), ["http://127.0.0.1:7100"]);
    let two = Addresses::parse("http://a:7100, https://b:7100").unwrap();
    assert_eq!(two.urls(), ["http://a:7100", "https://b:7100"]);
    // Two spellings of one address are one address.
    let twice = Addresses::parse("http://A:80,http://a/").unwrap_err();
    assert!(twice.contains("named twice"), "{twice}");
    for bad in [
        "",
        "http://a:7100,",
        "ftp://a",
        "a:7100",
        "http://a?x=1",
        "http://u@a",
    ] {
        assert!(Addresses::parse(bad).is_err(), "{bad:?} was taken");
    }
}

#[tokio::test]
async fn the_request_lands_on_the_leader_the_follower_names() {
    let (leader, at_leader) = leader().await;
    let (follower, at_follower) = follower(Some(&leader)).await;
    // Asked in list order, the bystander would come next; the named leader goes first.
    let (bystander, at_bystander) = server(
        503,
        serde_json::to_value(ErrorBody::new(ErrorCode::NotReady, "recovering")).unwrap(),
    )
    .await;
    let group = group(&[&follower, &bystander, &leader]);
    let answer = group.send(&Request::get("/v1/audit")).await.unwrap();
    assert_eq!(answer.base, leader);
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(at_follower.load(Ordering::SeqCst), 1);
    assert_eq!(at_bystander.load(Ordering::SeqCst), 0);
    assert_eq!(at_leader.load(Ordering::SeqCst), 1);
    // The next request goes to the address that answered last.
    assert_eq!(group.current(), leader);
    group.send(&Request::get("/v1/audit")).await.unwrap();
    assert_eq!(at_follower.load(Ordering::SeqCst), 1);
    assert_eq!(at_leader.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unreachable_address_moves_on_in_turn() {
    let (leader, at_leader) = leader().await;
    let (follower, _) = follower(None).await;
    let group = group(&[&unreachable(), &follower, &leader]);
    let answer = group
        .send(&Request::post(
            "/v1/transactions",
            json!({"id": "order-1"}),
            Resend::Safe,
        ))
        .await
        .unwrap();
    assert_eq!(answer.base, leader);
    assert_eq!(at_leader.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_leader_outside_the_list_is_not_followed() {
    let (outside, at_outside) = leader().await;
    let (follower, at_follower) = follower(Some(&outside)).await;
    let dead = unreachable();
    let group = group(&[&follower, &dead]);
    let Err(SendError::Exhausted(exhausted)) = group.send(&Request::get("/v1/audit")).await else {
        panic!("a request was taken");
    };
    assert_eq!(at_outside.load(Ordering::SeqCst), 0);
    // Two rounds over both addresses, each named with what it said.
    assert_eq!(at_follower.load(Ordering::SeqCst), 2);
    assert_eq!(exhausted.attempts.len(), 4);
    assert!(!exhausted.none_answered());
    let text = exhausted.to_string();
    assert!(text.contains(&format!("{follower}: not_leader")), "{text}");
    assert!(text.contains(&format!("{dead}: cannot reach it")), "{text}");
}

#[tokio::test]
async fn a_post_without_an_id_is_not_resent() {
    let (leader, at_leader) = leader().await;
    let (follower, at_follower) = follower(Some(&leader)).await;
    let clear = Request::post("/v1/log-behind/clear", json!({}), Resend::Never);
    let Err(SendError::Exhausted(declined)) = group(&[&follower, &leader]).send(&clear).await
    else {
        panic!("the request was taken");
    };
    assert_eq!(at_follower.load(Ordering::SeqCst), 1);
    assert_eq!(declined.attempts.len(), 1);
    // The operator is told where the leader is, to ask it by hand.
    assert!(declined.to_string().contains(&leader), "{declined}");
    let Err(SendError::Exhausted(unreached)) = group(&[&unreachable(), &leader]).send(&clear).await
    else {
        panic!("the request was taken");
    };
    assert!(unreached.none_answered());
    assert_eq!(at_leader.load(Ordering::SeqCst), 0);
}

#[test]
fn what_a_node_said_is_escaped() {
    let mut body = ErrorBody::new(ErrorCode::NotLeader, "no\nfake line\u{1b}[2J");
    body.leader = Some("http://x\n".into());
    let text = Exhausted {
        attempts: vec![("http://a".into(), Said::Declined(body))],
    }
    .to_string();
    assert!(!text.contains(['\n', '\u{1b}']), "{text:?}");
}

#[tokio::test]
async fn one_address_is_asked_once_and_reported_as_before() {
    let dead = unreachable();
    let Err(SendError::Exhausted(exhausted)) =
        group(&[&dead]).send(&Request::get("/v1/audit")).await
    else {
        panic!("nobody listens there");
    };
    assert_eq!(exhausted.attempts.len(), 1);
    assert!(
        exhausted
            .to_string()
            .starts_with(&format!("cannot reach the coordinator at {dead}: ")),
        "{exhausted}"
    );
}

#[tokio::test]
async fn any_other_answer_is_the_answer() {
    let (refusing, _) = server(
        404,
        serde_json::to_value(ErrorBody::new(ErrorCode::NotFound, "no such id")).unwrap(),
    )
    .await;
    let (leader, at_leader) = leader().await;
    let group = group(&[&refusing, &leader]);
    let answer = group
        .send(&Request::get("/v1/transactions/x"))
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(at_leader.load(Ordering::SeqCst), 0);
    assert_eq!(group.leader().await.unwrap(), refusing);
}
