use super::*;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use serde_json::json;

#[test]
fn the_event_id_becomes_the_id_and_another_id_is_refused() {
    let body = json!({"participants": [{"name": "payments", "payload": {}}]});
    assert_eq!(with_id(&body, "evt-1").unwrap()["id"], "evt-1");
    assert!(with_id(&json!({"id": "evt-1", "steps": []}), "evt-1").is_ok());
    assert!(with_id(&json!({"id": "other"}), "evt-1").is_err());
    assert!(with_id(&json!([1]), "evt-1").is_err());
}

#[test]
fn final_outcomes_deliver_and_the_rest_is_asked_again() {
    let committed = br#"{"id":"e","outcome":"committed"}"#;
    assert!(matches!(
        classify(Kind::Transaction, StatusCode::OK, committed),
        Some(Answer::Delivered(_))
    ));
    let running = br#"{"id":"e","state":"running"}"#;
    assert_eq!(classify(Kind::Saga, StatusCode::ACCEPTED, running), None);
    let done = br#"{"id":"e","state":"compensated"}"#;
    assert!(matches!(
        classify(Kind::Saga, StatusCode::OK, done),
        Some(Answer::Delivered(_))
    ));
    let conflict = br#"{"error":"id_conflict","message":"exists"}"#;
    assert!(matches!(
        classify(Kind::Transaction, StatusCode::CONFLICT, conflict),
        Some(Answer::Refused(_))
    ));
    let overloaded = br#"{"error":"overloaded","message":"busy"}"#;
    assert_eq!(
        classify(
            Kind::Transaction,
            StatusCode::SERVICE_UNAVAILABLE,
            overloaded
        ),
        None
    );
    assert!(matches!(
        classify(Kind::Transaction, StatusCode::UNPROCESSABLE_ENTITY, b"{}"),
        Some(Answer::Refused(_))
    ));
}

/// What the fake group saw: (address index, method, path, body).
type Seen = Arc<Mutex<Vec<(usize, String, String, Value)>>>;

#[derive(Clone)]
struct Node {
    index: usize,
    seen: Seen,
    /// Saga status reads answered so far (the second says `completed`).
    saga_reads: Arc<Mutex<u32>>,
}

async fn serve(node: Node) -> String {
    let follower = node.index == 0;
    let not_leader = || {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "not_leader", "message": "ask the leader"})),
        )
    };
    let post_tx = move |State(n): State<Node>, Json(body): Json<Value>| async move {
        n.seen
            .lock()
            .unwrap()
            .push((n.index, "POST".into(), "tx".into(), body.clone()));
        if follower {
            return not_leader();
        }
        match body["id"].as_str() {
            Some("evt-conflict") => (
                StatusCode::CONFLICT,
                Json(json!({"error": "id_conflict", "message": "another body"})),
            ),
            Some("evt-slow") => {
                tokio::time::sleep(Duration::from_secs(5)).await;
                (StatusCode::OK, Json(json!({})))
            }
            _ => (
                StatusCode::OK,
                Json(json!({"id": body["id"], "outcome": "committed"})),
            ),
        }
    };
    let post_saga = move |State(n): State<Node>, Json(body): Json<Value>| async move {
        n.seen
            .lock()
            .unwrap()
            .push((n.index, "POST".into(), "saga".into(), body.clone()));
        if follower {
            return not_leader();
        }
        (
            StatusCode::ACCEPTED,
            Json(json!({"id": body["id"], "state": "running"})),
        )
    };
    let get_saga = move |State(n): State<Node>, Path(id): Path<String>| async move {
        n.seen
            .lock()
            .unwrap()
            .push((n.index, "GET".into(), id.clone(), Value::Null));
        if follower {
            return not_leader();
        }
        let mut reads = n.saga_reads.lock().unwrap();
        *reads += 1;
        let state = if *reads >= 2 { "completed" } else { "running" };
        (StatusCode::OK, Json(json!({"id": id, "state": state})))
    };
    let router = axum::Router::new()
        .route(routes::TRANSACTIONS, post(post_tx))
        .route(routes::SAGAS, post(post_saga))
        .route("/v1/sagas/{id}", get(get_saga))
        .with_state(node);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_tried_in_turn_and_outcomes_are_waited_for_under_the_same_id() {
    let seen: Seen = Arc::default();
    let saga_reads = Arc::new(Mutex::new(0));
    let mut urls = Vec::new();
    for index in 0..2 {
        let node = Node {
            index,
            seen: seen.clone(),
            saga_reads: saga_reads.clone(),
        };
        urls.push(serve(node).await);
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut group = Coordinators::new(crate::credentials::Authed::without_token(client), urls);
    group.poll = Duration::from_millis(10);
    let time = Duration::from_secs(2);
    let request = json!({"participants": [{"name": "payments", "payload": {"amount": 5}}]});

    let answer = group
        .deliver(Kind::Transaction, "evt-1", &request, time)
        .await;
    assert_eq!(
        answer,
        Answer::Delivered(json!({"id": "evt-1", "outcome": "committed"}))
    );
    let posts: Vec<(usize, Value)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(i, _, _, body)| (*i, body["id"].clone()))
        .collect();
    assert_eq!(
        posts,
        [(0, json!("evt-1")), (1, json!("evt-1"))],
        "the follower, then the leader"
    );

    // The leader is asked first from now on.
    seen.lock().unwrap().clear();
    let answer = group
        .deliver(Kind::Saga, "evt-2", &json!({"steps": []}), time)
        .await;
    assert_eq!(
        answer,
        Answer::Delivered(json!({"id": "evt-2", "state": "completed"}))
    );
    let calls: Vec<(usize, String, String)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(i, m, p, _)| (*i, m.clone(), p.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (1, "POST".into(), "saga".into()),
            (1, "GET".into(), "evt-2".into()),
            (1, "GET".into(), "evt-2".into())
        ]
    );

    let answer = group
        .deliver(Kind::Transaction, "evt-conflict", &request, time)
        .await;
    assert!(matches!(answer, Answer::Refused(e) if e.contains("id_conflict")));
    let answer = group
        .deliver(
            Kind::Transaction,
            "evt-slow",
            &request,
            Duration::from_millis(300),
        )
        .await;
    assert!(matches!(answer, Answer::Unknown(_)), "{answer:?}");
    let answer = group
        .deliver(Kind::Transaction, "evt-3", &json!({"id": "x"}), time)
        .await;
    assert!(
        matches!(answer, Answer::Refused(_)),
        "never under another id"
    );
}
