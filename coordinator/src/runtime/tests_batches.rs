//! Batched phase messages from the coordinator's side (`runtime::batches`), against stub
//! participants on loopback: honest ones that answer lines out of order, one that lies about
//! which item a line answers, one that answers half a batch and hangs up, one whose batch
//! route is gone. Every transaction ends as its answers (not the batch) say.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};
use serde_json::json;

use protocol::batch::{BatchAnswer, DecisionBatch, PrepareBatch};
use protocol::{Decision, Outcome, ParticipantName, TxId};

use crate::config::Config;
use crate::digest::Digest;
use crate::engine::{Reply, WaitFor};
use crate::metrics::Metrics;
use crate::runtime::{Core, NewTransaction, recover_on};

/// How a stub answers a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Manner {
    /// Every item yes / acked, lines in reverse order.
    Honest,
    /// Every line names the next item's attempt (a yes credited to the wrong attempt).
    Misattributed,
    /// Lines for the first half of the items only, then the answer ends.
    Half,
    /// Offers batches, then answers the batch routes 404 `unknown_route`.
    RouteGone,
}

/// What a stub saw: batch sizes, messages sent alone, and the attempts committed.
#[derive(Debug, Default)]
struct Seen {
    prepare_batches: Vec<usize>,
    decision_batches: Vec<usize>,
    alone: usize,
    alone_prepares: usize,
    /// Each prepare sent alone: its txid and the payload it carried.
    alone_payloads: Vec<(String, serde_json::Value)>,
    committed: Vec<String>,
}

async fn stub(manner: Manner, seen: Arc<Mutex<Seen>>) -> String {
    let prepares = {
        let seen = Arc::clone(&seen);
        post(
            move |axum::Json(batch): axum::Json<PrepareBatch>| async move {
                seen.lock()
                    .unwrap()
                    .prepare_batches
                    .push(batch.prepares.len());
                let n = batch.prepares.len();
                let lines: Vec<BatchAnswer> = match manner {
                    Manner::RouteGone => {
                        return (
                            axum::http::StatusCode::NOT_FOUND,
                            axum::Json(
                                json!({"error": "unknown_route", "message": "no such route"}),
                            ),
                        )
                            .into_response_string();
                    }
                    Manner::Honest => (0..n).rev().map(|i| yes(i, &batch, i)).collect(),
                    Manner::Misattributed => (0..n).map(|i| yes(i, &batch, (i + 1) % n)).collect(),
                    Manner::Half => (0..n / 2).map(|i| yes(i, &batch, i)).collect(),
                };
                ndjson(&lines)
            },
        )
    };
    let decisions = {
        let seen = Arc::clone(&seen);
        post(
            move |axum::Json(batch): axum::Json<DecisionBatch>| async move {
                let mut seen = seen.lock().unwrap();
                seen.decision_batches.push(batch.decisions.len());
                if manner == Manner::RouteGone {
                    return (
                        axum::http::StatusCode::NOT_FOUND,
                        axum::Json(json!({"error": "unknown_route", "message": "no such route"})),
                    )
                        .into_response_string();
                }
                let lines: Vec<BatchAnswer> = batch
                    .decisions
                    .iter()
                    .enumerate()
                    .map(|(index, item)| {
                        if item.decision == Decision::Commit {
                            seen.committed.push(item.request.txid.to_string());
                        }
                        BatchAnswer {
                            index,
                            gtid: item.request.gtid.clone(),
                            status: 200,
                            body: json!({"ack": true}),
                        }
                    })
                    .collect();
                ndjson(&lines)
            },
        )
    };
    let alone = |route: &'static str| {
        let seen = Arc::clone(&seen);
        post(
            move |axum::Json(body): axum::Json<serde_json::Value>| async move {
                let mut seen = seen.lock().unwrap();
                if body["txid"] != crate::runtime::PROBE_TXID {
                    seen.alone += 1;
                    if route == "prepare" {
                        seen.alone_prepares += 1;
                        let txid = body["txid"].as_str().unwrap_or_default().to_string();
                        seen.alone_payloads.push((txid, body["payload"].clone()));
                    }
                    if route == "commit" {
                        seen.committed
                            .push(body["txid"].as_str().unwrap_or_default().to_string());
                    }
                }
                let answer = if route == "prepare" {
                    json!({"vote": "yes"})
                } else {
                    json!({"ack": true})
                };
                axum::Json(answer)
            },
        )
    };
    let app = Router::new()
        .route(
            "/2pc/capabilities",
            get(|| async { axum::Json(json!({"batch": {"max_items": 8}})) }),
        )
        .route("/2pc/batch/prepare", prepares)
        .route("/2pc/batch/decide", decisions)
        .route("/2pc/prepare", alone("prepare"))
        .route("/2pc/commit", alone("commit"))
        .route("/2pc/abort", alone("abort"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn yes(index: usize, batch: &PrepareBatch, named: usize) -> BatchAnswer {
    BatchAnswer {
        index,
        gtid: batch.prepares[named].gtid.clone(),
        status: 200,
        body: json!({"vote": "yes"}),
    }
}

fn ndjson(lines: &[BatchAnswer]) -> (axum::http::StatusCode, String) {
    let mut text = String::new();
    for line in lines {
        text.push_str(&serde_json::to_string(line).unwrap());
        text.push('\n');
    }
    (axum::http::StatusCode::OK, text)
}

trait IntoResponseString {
    fn into_response_string(self) -> (axum::http::StatusCode, String);
}

impl IntoResponseString for (axum::http::StatusCode, axum::Json<serde_json::Value>) {
    fn into_response_string(self) -> (axum::http::StatusCode, String) {
        (self.0, self.1.0.to_string())
    }
}

async fn core_with(manner: Manner) -> (Arc<Core>, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let url = stub(manner, Arc::clone(&seen)).await;
    let participants: BTreeMap<_, _> = [(ParticipantName::new("inventory").unwrap(), url)].into();
    let dir = tempfile::tempdir().unwrap().keep();
    let config = Config::for_tests(dir, participants);
    assert!(config.phase_batching, "batching is on by default");
    let storage = Arc::new(wal::sim::SimStorage::new());
    // A slow disk holds the decisions of concurrent transactions together, so they batch.
    storage.set_sync_delay(std::time::Duration::from_millis(30));
    let core = recover_on(storage, &config, Arc::new(Metrics::default()))
        .await
        .unwrap();
    (core, seen)
}

/// One transaction at the stub participant `inventory`, answered once decided; its payload
/// names it, so that a message can be checked to carry its own transaction's payload.
fn transaction(txid: &str, digest: u128) -> NewTransaction {
    NewTransaction {
        txid: TxId::new(txid).unwrap(),
        digest: Digest(digest),
        participants: vec![(
            ParticipantName::new("inventory").unwrap(),
            json!({"order": txid}),
        )],
        timeout_ms: 5_000,
        wait: WaitFor::Decision,
        client: None,
    }
}

/// Submits `n` transactions at once; their outcomes by txid.
async fn submit_all(core: &Arc<Core>, n: usize) -> BTreeMap<String, Outcome> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let core = Arc::clone(core);
            tokio::spawn(async move {
                let txid = format!("t{i:02}");
                let reply = core.submit(transaction(&txid, i as u128)).await.unwrap();
                let Reply::Outcome(response) = reply else {
                    panic!("{reply:?}");
                };
                (txid, response.outcome)
            })
        })
        .collect();
    let mut outcomes = BTreeMap::new();
    for task in tasks {
        let (txid, outcome) = task.await.unwrap();
        outcomes.insert(txid, outcome);
    }
    outcomes
}

async fn settled(seen: &Arc<Mutex<Seen>>, committed: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen.lock().unwrap().committed.len() < committed {
        assert!(
            std::time::Instant::now() < deadline,
            "commits not delivered: {seen:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_batches_answered_out_of_order_commit_everything_in_batches() {
    let (core, seen) = core_with(Manner::Honest).await;
    let outcomes = submit_all(&core, 24).await;
    assert!(
        outcomes.values().all(|o| *o == Outcome::Committed),
        "{outcomes:?}"
    );
    settled(&seen, 24).await;
    let seen = seen.lock().unwrap();
    // A flush that found one message sent it alone.
    assert_eq!(
        seen.prepare_batches.iter().sum::<usize>() + seen.alone_prepares,
        24,
        "{seen:?}"
    );
    assert!(
        !seen.prepare_batches.is_empty(),
        "24 at once made batches: {seen:?}"
    );
    assert!(
        seen.prepare_batches.iter().all(|&n| n <= 8),
        "max_items is the participant's: {seen:?}"
    );
    assert!(
        seen.decision_batches.len() < 24,
        "24 decisions held by one slow fsync went in fewer batches: {seen:?}"
    );
    let mut committed = seen.committed.clone();
    committed.sort();
    committed.dedup();
    assert_eq!(committed.len(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_that_names_another_attempt_is_no_vote() {
    let (core, seen) = core_with(Manner::Misattributed).await;
    let outcomes = submit_all(&core, 12).await;
    let seen = seen.lock().unwrap();
    // A prepare sent alone (its flush found only it) is answered honestly and commits, and so
    // is the one item of a batch of one (a flush that found one prepare beside decisions, or
    // the last of a split): its line can name no other attempt. Every item of a larger batch
    // got only lines naming other attempts: none of them may commit.
    let lone = seen.alone_prepares + seen.prepare_batches.iter().filter(|&&n| n == 1).count();
    let committed = outcomes
        .values()
        .filter(|o| **o == Outcome::Committed)
        .count();
    assert_eq!(committed, lone, "{outcomes:?} {seen:?}");
    assert!(
        seen.committed.len() <= lone,
        "a commit went to an attempt whose vote was misattributed: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_without_a_line_abort_and_those_answered_commit() {
    let (core, seen) = core_with(Manner::Half).await;
    let outcomes = submit_all(&core, 16).await;
    let answered: usize = {
        let seen = seen.lock().unwrap();
        seen.prepare_batches.iter().map(|n| n / 2).sum::<usize>() + seen.alone_prepares
    };
    let committed = outcomes
        .values()
        .filter(|o| **o == Outcome::Committed)
        .count();
    assert_eq!(committed, answered, "{outcomes:?} {seen:?}");
    assert!(
        committed < 16,
        "half of each batch went unanswered: {outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_whose_batch_route_is_gone_is_sent_messages_alone() {
    let (core, seen) = core_with(Manner::RouteGone).await;
    let outcomes = submit_all(&core, 6).await;
    assert!(
        outcomes.values().all(|o| *o == Outcome::Committed),
        "{outcomes:?}"
    );
    settled(&seen, 6).await;
    let batches_before = {
        let seen = seen.lock().unwrap();
        seen.prepare_batches.len() + seen.decision_batches.len()
    };
    assert!(
        batches_before >= 1,
        "it offered batches, so the first went as one"
    );
    // From the 404 on, messages go alone.
    let more: Vec<_> = (0..4)
        .map(|i| {
            let core = Arc::clone(&core);
            tokio::spawn(async move {
                core.submit(transaction(&format!("again{i}"), 100 + i))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for task in more {
        let reply = task.await.unwrap();
        assert!(
            matches!(&reply, Reply::Outcome(r) if r.outcome == Outcome::Committed),
            "{reply:?}"
        );
    }
    settled(&seen, 10).await;
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.prepare_batches.len() + seen.decision_batches.len(),
        batches_before,
        "no batch after the 404: {seen:?}"
    );
    assert!(seen.alone >= 8, "4 prepares and 4 commits alone: {seen:?}");
    // The first batch's items went again alone after its 404: each with its own payload, not
    // an empty one left behind when the batch was built.
    assert!(seen.alone_prepares >= 10, "{seen:?}");
    for (txid, payload) in &seen.alone_payloads {
        assert_eq!(payload, &json!({"order": txid}), "{txid} sent alone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_at_a_time_sends_every_message_alone() {
    let (core, seen) = core_with(Manner::Honest).await;
    for round in 0..5u32 {
        let reply = core
            .submit(transaction(&format!("lone{round}"), u128::from(round)))
            .await
            .unwrap();
        assert!(
            matches!(&reply, Reply::Outcome(r) if r.outcome == Outcome::Committed),
            "{reply:?}"
        );
        settled(&seen, round as usize + 1).await;
    }
    let seen = seen.lock().unwrap();
    assert!(
        seen.prepare_batches.is_empty() && seen.decision_batches.is_empty(),
        "a lone transaction waits for no company and is never batched: {seen:?}"
    );
    assert_eq!(seen.alone_prepares, 5, "{seen:?}");
}
