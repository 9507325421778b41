//! Batched phase messages through the library's routes (`Router::oneshot`): the capabilities
//! answer, each item answered as it would be alone, answer lines streamed as each item is ready
//! (a prepare queued behind a lock holds back no other item) and the lines ready together in
//! one chunk, items run to their end when nobody reads the answer, one fsync shared by a
//! batch's records, and the refusals of a batch as a whole.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Tally, add, decision, from, gtid, prepare, prepare_as};
use http_body_util::BodyExt;
use participant::{Participant, ParticipantConfig, finish};
use protocol::batch::{BatchAnswer, BatchedDecision, DecisionBatch, PrepareBatch};
use protocol::{Decision, PrepareRequest};
use serde_json::{Value, json};
use tower::ServiceExt;

fn app() -> (Router, Participant<Tally>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let participant =
        Participant::open(ParticipantConfig::new(dir.path()), Tally::default).unwrap();
    (finish(participant.router()), participant, dir)
}

fn post(path: &str, body: &impl serde::Serialize) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

/// Reads a batch's answer to its end: its lines in the order they came.
async fn lines(app: &Router, request: Request<Body>) -> Vec<BatchAnswer> {
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], protocol::batch::NDJSON);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// `n` prepares of fresh attempts, each on a key of its own.
fn fresh_prepares(n: usize) -> PrepareBatch {
    PrepareBatch {
        prepares: (0..n)
            .map(|i| prepare(&format!("t{i}"), 1, add(&format!("k{i}"), 1)))
            .collect(),
    }
}

fn waiting(txid: &str, payload: Value) -> PrepareRequest {
    let mut request = prepare(txid, 1, payload);
    request.lock_wait_ms = Some(5_000);
    request
}

#[tokio::test]
async fn the_capabilities_offer_batches() {
    let (app, _participant, _dir) = app();
    let response = app
        .oneshot(
            Request::get("/2pc/capabilities")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body, json!({"batch": {"max_items": 256}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_item_is_answered_as_it_would_be_alone_and_the_batch_shares_fsyncs() {
    let (app, participant, _dir) = app();
    let fsyncs_before = participant.wal_stats().fsyncs;
    let mut prepares = fresh_prepares(20).prepares;
    // One no (a negative count), one from a stale epoch after a newer one was seen below.
    prepares.push(prepare("t-no", 1, add("k-no", -1)));
    let answers = lines(
        &app,
        post(
            "/2pc/batch/prepare",
            &PrepareBatch {
                prepares: prepares.clone(),
            },
        ),
    )
    .await;
    assert_eq!(answers.len(), 21, "a line per item");
    for answer in &answers {
        assert_eq!(
            answer.gtid, prepares[answer.index].gtid,
            "a line names its item"
        );
        let expected = if answer.index == 20 {
            json!({"vote": "no", "reason": "n -1 is negative"})
        } else {
            json!({"vote": "yes"})
        };
        assert_eq!((answer.status, &answer.body), (200, &expected));
    }
    let fsyncs = participant.wal_stats().fsyncs - fsyncs_before;
    assert!(
        fsyncs < 20,
        "20 prepared records answered through {fsyncs} fsyncs: a batch's records must share them"
    );
    // The decisions, one batch, the same again (a duplicate batch): acked both times, applied once.
    let decisions = DecisionBatch {
        decisions: (0..20)
            .map(|i| BatchedDecision {
                decision: Decision::Commit,
                request: decision(&format!("t{i}"), 1),
            })
            .collect(),
    };
    for _ in 0..2 {
        let acks = lines(&app, post("/2pc/batch/decide", &decisions)).await;
        assert_eq!(acks.len(), 20);
        assert!(
            acks.iter()
                .all(|a| a.status == 200 && a.body == json!({"ack": true}))
        );
    }
    assert_eq!(participant.read(|t| t.counts["k7"]), 1);
    assert_eq!(participant.prepared_list().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_ready_together_leave_together() {
    let (app, _participant, _dir) = app();
    let response = app
        .clone()
        .oneshot(post("/2pc/batch/prepare", &fresh_prepares(20)))
        .await
        .unwrap();
    let mut body = response.into_body();
    let (mut frames, mut text) = (0, Vec::new());
    while let Some(frame) = body.frame().await {
        frames += 1;
        text.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    let lines = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(lines, 20);
    // Items whose records share an fsync become ready together; a write per line would cost
    // the participant a system call and the coordinator a wake-up for each.
    assert!(
        frames < lines,
        "{lines} lines in {frames} chunks: lines ready together must go in one chunk"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_answer_is_never_read_still_runs_every_item() {
    let (app, participant, _dir) = app();
    let response = app
        .clone()
        .oneshot(post("/2pc/batch/prepare", &fresh_prepares(3)))
        .await
        .unwrap();
    // The sender went away before a line was read: the items are still prepared (their effect
    // stands, as a lone prepare's does), and the coordinator will ask or decide.
    drop(response);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while participant.prepared_list().len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "items of an unread batch did not run: {} prepared",
            participant.prepared_list().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_queued_behind_a_lock_holds_back_no_other_line() {
    let (app, participant, _dir) = app();
    // t-holder holds key "hot", prepared alone.
    let holder = prepare("t-holder", 1, add("hot", 1));
    participant.prepare(holder).await.unwrap();
    let batch = PrepareBatch {
        prepares: vec![
            waiting("t-waits", add("hot", 1)),
            waiting("t-free", add("cold", 1)),
        ],
    };
    let response = app
        .clone()
        .oneshot(post("/2pc/batch/prepare", &batch))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // The free item's line comes while the other still waits for the lock.
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the free item's line must not wait for the queued one")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    let first: BatchAnswer = serde_json::from_slice(first.trim_ascii_end()).unwrap();
    assert_eq!(
        (first.index, first.body.clone()),
        (1, json!({"vote": "yes"}))
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), body.frame())
            .await
            .is_err(),
        "the queued item cannot be answered while the lock is held"
    );
    // The holder commits: the queued item is granted and its line follows.
    participant.commit(decision("t-holder", 1)).await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    let second: BatchAnswer = serde_json::from_slice(second.trim_ascii_end()).unwrap();
    assert_eq!((second.index, second.body), (0, json!({"vote": "yes"})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_refused_alone_is_refused_in_its_line_and_the_others_stand() {
    let (app, participant, _dir) = app();
    // Epoch 5 seen; a batch with one item at epoch 4 (stale) and one at 5.
    participant
        .prepare(prepare_as(
            "t-new",
            &gtid("t-new"),
            &from(common::C1, 5),
            add("a", 1),
        ))
        .await
        .unwrap();
    let stale = prepare_as(
        "t-stale",
        &gtid("t-stale"),
        &from(common::C1, 4),
        add("b", 1),
    );
    let fine = prepare_as("t-fine", &gtid("t-fine"), &from(common::C1, 5), add("c", 1));
    let answers = lines(
        &app,
        post(
            "/2pc/batch/prepare",
            &PrepareBatch {
                prepares: vec![stale, fine],
            },
        ),
    )
    .await;
    let by_index = |i: usize| answers.iter().find(|a| a.index == i).unwrap();
    assert_eq!(by_index(0).status, 409);
    assert_eq!(by_index(0).body["error"], "stale_epoch");
    assert_eq!(by_index(0).body["highest_epoch"], 5);
    assert_eq!(
        (by_index(1).status, &by_index(1).body),
        (200, &json!({"vote": "yes"}))
    );
    // A commit of an attempt never prepared: not_prepared in its line, as alone.
    let ghost = DecisionBatch {
        decisions: vec![BatchedDecision {
            decision: Decision::Commit,
            request: decision("ghost", 5),
        }],
    };
    let answers = lines(&app, post("/2pc/batch/decide", &ghost)).await;
    assert_eq!(
        (answers[0].status, answers[0].body["error"].clone()),
        (409, json!("not_prepared"))
    );
}

#[tokio::test]
async fn a_batch_refused_as_a_whole_says_why() {
    let (app, _participant, _dir) = app();
    let status_and_error = |request: Request<Body>| {
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let body: Value =
                serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes())
                    .unwrap();
            (
                status,
                body["error"].as_str().unwrap_or_default().to_string(),
            )
        }
    };
    let too_many = PrepareBatch {
        prepares: (0..257)
            .map(|i| prepare(&format!("t{i}"), 1, add("k", 1)))
            .collect(),
    };
    assert_eq!(
        status_and_error(post("/2pc/batch/prepare", &too_many)).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large".into())
    );
    assert_eq!(
        status_and_error(post("/2pc/batch/prepare", &json!({"prepares": []}))).await,
        (StatusCode::BAD_REQUEST, "malformed_json".into())
    );
    assert_eq!(
        status_and_error(post(
            "/2pc/batch/decide",
            &json!({"decisions": [{"decision": "maybe"}]})
        ))
        .await,
        (StatusCode::BAD_REQUEST, "malformed_json".into())
    );
    let text = Request::post("/2pc/batch/prepare")
        .header("content-type", "text/plain")
        .body(Body::from("{}"))
        .unwrap();
    assert_eq!(
        status_and_error(text).await,
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type".into()
        )
    );
    // Over the single-message limit but within the batch limit: taken.
    let big = PrepareBatch {
        prepares: (0..40)
            .map(|i| {
                prepare(
                    &format!("big{i}"),
                    1,
                    json!({"key": format!("b{i}"), "n": 1, "pad": "x".repeat(30_000)}),
                )
            })
            .collect(),
    };
    assert!(serde_json::to_vec(&big).unwrap().len() > protocol::limits::BODY_BYTES_MAX);
    let response = app
        .clone()
        .oneshot(post("/2pc/batch/prepare", &big))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
