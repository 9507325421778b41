//! The runtime's ordering promises, on the WAL's simulated storage: no client answer and no
//! phase-two message before the decision is durable, and none at all if it never becomes
//! durable.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use serde_json::{Value, json};

use protocol::{Outcome, ParticipantName, TxId};

use crate::config::Config;
use crate::digest::Digest;
use crate::engine::{Reply, WaitFor};
use crate::metrics::Metrics;
use crate::runtime::{NewTransaction, QueryError, recover_on};

type Log = Arc<Mutex<Vec<(&'static str, Instant)>>>;

/// A participant that votes yes, acks, and notes when each message arrived.
async fn participant(log: Log) -> String {
    let on = |route: &'static str, answer: Value| {
        let log = Arc::clone(&log);
        post(move || async move {
            log.lock().unwrap().push((route, Instant::now()));
            axum::Json(answer)
        })
    };
    let app = Router::new()
        .route("/2pc/prepare", on("prepare", json!({"vote": "yes"})))
        .route("/2pc/commit", on("commit", json!({"ack": true})))
        .route("/2pc/abort", on("abort", json!({"ack": true})));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn setup() -> (Arc<crate::runtime::Core>, Arc<wal::sim::SimStorage>, Log) {
    let log: Log = Arc::default();
    let url = participant(Arc::clone(&log)).await;
    let participants: BTreeMap<_, _> = [(ParticipantName::new("a").unwrap(), url)].into();
    let config = Config::for_tests("/sim/c".into(), participants);
    let storage = Arc::new(wal::sim::SimStorage::new());
    let core = recover_on(storage.clone(), &config, Arc::new(Metrics::default()))
        .await
        .unwrap();
    (core, storage, log)
}

fn one(txid: &str) -> NewTransaction {
    NewTransaction {
        txid: TxId::new(txid).unwrap(),
        digest: Digest(1),
        participants: vec![(ParticipantName::new("a").unwrap(), json!({}))],
        timeout_ms: 5_000,
        wait: WaitFor::Decision,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_hears_the_decision_before_its_fsync() {
    let (core, storage, log) = setup().await;
    let sync_delay = Duration::from_millis(300);
    storage.set_sync_delay(sync_delay);
    let reply = core.submit(one("t-slow-disk")).await.unwrap();
    let answered = Instant::now();
    let Reply::Outcome(response) = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(response.outcome, Outcome::Committed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.lock().unwrap().iter().any(|(r, _)| *r == "commit") {
        assert!(
            Instant::now() < deadline,
            "no commit: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = log.lock().unwrap().clone();
    let voted = log.iter().find(|(r, _)| *r == "prepare").unwrap().1;
    let committed = log.iter().find(|(r, _)| *r == "commit").unwrap().1;
    // The decision record's fsync (at least one sync delay) sits between the vote and both
    // the client's answer and the commit message.
    assert!(
        answered.duration_since(voted) >= sync_delay,
        "client heard too early"
    );
    assert!(
        committed.duration_since(voted) >= sync_delay,
        "commit sent too early"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_that_never_becomes_durable_is_never_sent() {
    let (core, storage, log) = setup().await;
    storage.set_fail_sync(true);
    let reply = core.submit(one("t-bad-disk")).await.unwrap();
    assert!(matches!(reply, Reply::LogFailed { .. }), "{reply:?}");
    // Give a wrongly sent commit every chance to arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let routes: Vec<_> = log.lock().unwrap().iter().map(|(r, _)| *r).collect();
    assert_eq!(routes, ["prepare"]);
    assert!(core.is_poisoned());
    assert_eq!(
        core.decision_query(&TxId::new("t-bad-disk").unwrap()).await,
        Ok(protocol::DecisionStatus::Pending)
    );
    // An id with no record: an abort that could not be logged is never said.
    assert!(matches!(
        core.decision_query(&TxId::new("t-never-seen").unwrap())
            .await,
        Err(QueryError::LogFailed(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presumed_abort_is_durable_before_it_is_answered_and_settles_the_id() {
    let (core, storage, log) = setup().await;
    let sync_delay = Duration::from_millis(300);
    storage.set_sync_delay(sync_delay);
    let lost = TxId::new("t-lost").unwrap();
    let records_before = core.wal_stats().records_appended;
    let asked = Instant::now();
    // Two participants in doubt ask at once: one record, both hear abort after its fsync.
    let (first, second) = tokio::join!(core.decision_query(&lost), core.decision_query(&lost));
    assert_eq!(first, Ok(protocol::DecisionStatus::Abort));
    assert_eq!(second, Ok(protocol::DecisionStatus::Abort));
    assert!(asked.elapsed() >= sync_delay, "abort said before its fsync");
    assert_eq!(
        core.metrics()
            .presumed_aborts
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // The decision and the (lazy) End: no second decision for the second query.
    let appended = || core.wal_stats().records_appended - records_before;
    let deadline = Instant::now() + Duration::from_secs(10);
    while appended() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(appended(), 2);
    // The client retrying the id, with any body: the recorded abort, and no prepare is sent.
    let reply = core.submit(one("t-lost")).await.unwrap();
    let Reply::Outcome(response) = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(response.outcome, Outcome::Aborted);
    assert_eq!(
        response.reason.as_deref(),
        Some(crate::engine::PRESUMED_ABORT_REASON)
    );
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
}
