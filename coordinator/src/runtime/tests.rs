//! The runtime's ordering promises, on the WAL's simulated storage: no client answer and no
//! phase-two message before the decision is durable, and none at all if it never becomes
//! durable; decision queries answered without writing anything; and a participant that fences
//! this run out stops it taking new work.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};

use protocol::{
    DecisionQuery, DecisionStatus, Epoch, GlobalTxId, Incarnation, Outcome, ParticipantName, TxId,
};

use crate::config::Config;
use crate::digest::Digest;
use crate::engine::{Reply, WaitFor};
use crate::metrics::Metrics;
use crate::runtime::{Core, NewTransaction, recover_on};

type Log = Arc<Mutex<Vec<(&'static str, Instant)>>>;

/// The answers a stub participant gives: to prepares, commits and aborts (the epoch probe at
/// start is an abort).
#[derive(Debug, Clone)]
struct Answers {
    prepare: (StatusCode, Value),
    commit: (StatusCode, Value),
    abort: (StatusCode, Value),
}

fn cooperative() -> Answers {
    Answers {
        prepare: (StatusCode::OK, json!({"vote": "yes"})),
        commit: (StatusCode::OK, json!({"ack": true})),
        abort: (StatusCode::OK, json!({"ack": true})),
    }
}

/// A participant that answers as told and notes when each message arrived.
async fn participant(log: Log, answers: Answers) -> String {
    let on = |route: &'static str, (status, answer): (StatusCode, Value)| {
        let log = Arc::clone(&log);
        post(move |body: axum::body::Bytes| async move {
            // The epoch probe at start is an abort too; tests count transactions' messages.
            let probe = serde_json::from_slice::<Value>(&body)
                .is_ok_and(|b| b["txid"] == crate::runtime::PROBE_TXID);
            let route = if probe { "probe" } else { route };
            log.lock().unwrap().push((route, Instant::now()));
            (status, axum::Json(answer))
        })
    };
    let app = Router::new()
        .route("/2pc/prepare", on("prepare", answers.prepare))
        .route("/2pc/commit", on("commit", answers.commit))
        .route("/2pc/abort", on("abort", answers.abort));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn setup_with(
    answers: Answers,
    retained_max: usize,
    retention_ms: u64,
) -> (Arc<Core>, Arc<wal::sim::SimStorage>, Log) {
    let log: Log = Arc::default();
    let url = participant(Arc::clone(&log), answers).await;
    let participants: BTreeMap<_, _> = [(ParticipantName::new("inventory").unwrap(), url)].into();
    // The log is simulated; the outcome index is a real file, in a directory kept for the
    // test process's life.
    let dir = tempfile::tempdir().unwrap().keep();
    let mut config = Config::for_tests(dir, participants);
    config.retained_max = retained_max;
    config.retention_ms = retention_ms;
    let storage = Arc::new(wal::sim::SimStorage::new());
    let core = recover_on(storage.clone(), &config, Arc::new(Metrics::default()))
        .await
        .unwrap();
    (core, storage, log)
}

async fn setup() -> (Arc<Core>, Arc<wal::sim::SimStorage>, Log) {
    setup_with(
        cooperative(),
        crate::config::defaults::RETAINED_MAX,
        crate::config::defaults::RETENTION_MS,
    )
    .await
}

fn one(txid: &str) -> NewTransaction {
    NewTransaction {
        txid: TxId::new(txid).unwrap(),
        digest: Digest(1),
        participants: vec![(ParticipantName::new("inventory").unwrap(), json!({}))],
        timeout_ms: 5_000,
        wait: WaitFor::Decision,
        client: None,
    }
}

/// The query a participant prepared for attempt `gtid` of `core` sends.
fn query_of(core: &Core, gtid: &GlobalTxId) -> DecisionQuery {
    let (_, incarnation, position) = gtid.parts().unwrap();
    DecisionQuery {
        gtid: gtid.clone(),
        incarnation,
        epoch: core.identity().epoch,
        position,
    }
}

/// The attempt at `position` of this run, whether or not it was begun.
fn attempt_at(core: &Core, position: u64) -> DecisionQuery {
    let identity = core.identity();
    let gtid = GlobalTxId::compose(&identity.coordinator_id, identity.incarnation, position);
    query_of(core, &gtid)
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
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
    until("the commit", || {
        log.lock().unwrap().iter().any(|(r, _)| *r == "commit")
    })
    .await;
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
    let routes: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(r, _)| *r)
        .filter(|r| *r != "probe")
        .collect();
    assert_eq!(routes, ["prepare"]);
    assert!(core.is_poisoned());
    let txid = TxId::new("t-bad-disk").unwrap();
    let gtid = core.status(&txid).unwrap().unwrap().gtid;
    assert_eq!(
        core.decision_query(&txid, Some(&query_of(&core, &gtid)))
            .decision,
        DecisionStatus::Pending
    );
    // An attempt this run never began: unknown, never a guessed abort.
    assert_eq!(
        core.decision_query(
            &TxId::new("t-never-seen").unwrap(),
            Some(&attempt_at(&core, 2))
        )
        .decision,
        DecisionStatus::Unknown
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presumed_abort_writes_nothing_and_is_given_only_inside_the_logs_span() {
    // A zero retention window: t-1's outcome is forgotten once archived (the index treats it
    // as out of the window at once).
    let (core, _storage, log) =
        setup_with(cooperative(), crate::config::defaults::RETAINED_MAX, 0).await;
    let acked = |txid: &str| NewTransaction {
        wait: WaitFor::Acked,
        ..one(txid)
    };
    let mut gtids = Vec::new();
    for txid in ["t-1", "t-2"] {
        let reply = core.submit(acked(txid)).await.unwrap();
        let Reply::Outcome(response) = reply else {
            panic!("{reply:?}");
        };
        assert_eq!(response.outcome, Outcome::Committed);
        gtids.push(response.gtid);
    }
    let t1 = TxId::new("t-1").unwrap();
    until("t-1 is archived, and so forgotten", || {
        core.status(&t1).unwrap().is_none()
    })
    .await;
    // The epoch record, then Begin, Decision and End for each (the last ack is in the End).
    until("every record written", || {
        core.wal_stats().records_appended == 7
    })
    .await;
    let metrics = core.metrics();

    let covered = core.decision_query(&t1, Some(&query_of(&core, &gtids[0])));
    assert_eq!(covered.decision, DecisionStatus::Abort, "{covered:?}");
    assert!(
        covered
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("presumed abort")),
        "{covered:?}"
    );
    assert_eq!(
        (
            covered.coordinator_id.as_ref(),
            covered.epoch,
            covered.incarnation
        ),
        (
            Some(&core.identity().coordinator_id),
            Some(core.identity().epoch),
            Some(core.identity().incarnation)
        )
    );
    assert_eq!(metrics.presumed_aborts.load(Ordering::Relaxed), 1);
    // Past what the log holds of this run (2 attempts): unknown.
    let past = core.decision_query(&TxId::new("t-3").unwrap(), Some(&attempt_at(&core, 3)));
    assert_eq!(past.decision, DecisionStatus::Unknown, "{past:?}");
    assert_eq!(metrics.unknown_answers.load(Ordering::Relaxed), 1);
    assert_eq!(
        core.log_behind(),
        None,
        "a position past the reach proves nothing"
    );
    // Nothing was logged for either answer.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(core.wal_stats().records_appended, 7);

    // The client reuses t-1 with another body: a new attempt with a new id, which commits;
    // the first attempt's participants still hear abort, never the second attempt's commit.
    let reply = core
        .submit(NewTransaction {
            digest: Digest(2),
            ..acked("t-1")
        })
        .await
        .unwrap();
    let Reply::Outcome(again) = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(again.outcome, Outcome::Committed);
    assert!(!gtids.contains(&again.gtid), "{} reused", again.gtid);
    assert_eq!(
        log.lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| *r == "prepare")
            .count(),
        3
    );
    assert_eq!(
        core.decision_query(&t1, Some(&query_of(&core, &again.gtid)))
            .decision,
        DecisionStatus::Commit
    );
    assert_eq!(
        core.decision_query(&t1, Some(&query_of(&core, &gtids[0])))
            .decision,
        DecisionStatus::Abort
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_naming_a_run_this_log_does_not_hold_is_counted_never_believed() {
    let (core, storage, _log) = setup().await;
    let config = core.config().clone();
    let lost = Incarnation(core.identity().incarnation.0 ^ 1);
    let gtid = GlobalTxId::compose(&core.identity().coordinator_id, lost, 5);
    let query = DecisionQuery {
        gtid: gtid.clone(),
        incarnation: lost,
        epoch: Epoch(7),
        position: 5,
    };
    let answer = core.decision_query(&TxId::new("t").unwrap(), Some(&query));
    assert_eq!(answer.decision, DecisionStatus::Unknown);
    assert_eq!(core.log_behind(), None, "a query is a claim, not evidence");
    assert_eq!(core.metrics().log_behind.load(Ordering::Relaxed), 0);
    assert_eq!(
        core.metrics().unknown_run_queries.load(Ordering::Relaxed),
        1
    );
    // New work is taken, and after a restart too.
    let reply = core.submit(one("after-the-query")).await.unwrap();
    assert!(matches!(reply, Reply::Outcome(_)), "{reply:?}");
    // Deliveries in flight hold the core; the process they stand for is gone once they end.
    until("the core's tasks end", || Arc::strong_count(&core) == 1).await;
    let closing = Arc::clone(&core);
    tokio::task::spawn_blocking(move || closing.close_log())
        .await
        .unwrap();
    storage.crash(wal::sim::Unsynced::Drop);
    storage.reboot();
    drop(core);
    let restarted = recover_on(storage.clone(), &config, Arc::new(Metrics::default()))
        .await
        .unwrap();
    assert_eq!(restarted.log_behind(), None);
    let reply = restarted.submit(one("after-the-restart")).await.unwrap();
    assert!(matches!(reply, Reply::Outcome(_)), "{reply:?}");
}

/// A participant that holds epoch `held` of another run of this coordinator id: it refuses
/// every message below or at it with `stale_epoch` naming that epoch, and takes the rest.
async fn passed_participant(log: Log, held: u64) -> String {
    let on = |route: &'static str, yes: Value| {
        let log = Arc::clone(&log);
        post(move |axum::Json(body): axum::Json<Value>| async move {
            log.lock().unwrap().push((route, Instant::now()));
            let epoch = body["epoch"].as_u64().unwrap_or(0);
            if epoch <= held {
                let refusal = json!({
                    "error": "stale_epoch",
                    "message": format!("epoch {epoch} is below {held}"),
                    "highest_epoch": held,
                });
                (StatusCode::CONFLICT, axum::Json(refusal))
            } else {
                (StatusCode::OK, axum::Json(yes))
            }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_passed_by_another_raises_its_epoch_by_itself_and_an_operator_clears_the_mark() {
    let log: Log = Arc::default();
    let url = passed_participant(Arc::clone(&log), 9).await;
    let participants: BTreeMap<_, _> = [(ParticipantName::new("inventory").unwrap(), url)].into();
    let dir = tempfile::tempdir().unwrap().keep();
    let config = Config::for_tests(dir, participants);
    let storage = Arc::new(wal::sim::SimStorage::new());
    let metrics = Arc::new(Metrics::default());
    let core = recover_on(storage.clone(), &config, Arc::clone(&metrics))
        .await
        .unwrap();
    assert_eq!(core.identity().epoch, Epoch(1));
    // The probe at start is refused: the mark, and a raise past the participant's epoch 9,
    // with no restart and nobody's help.
    until("the raise", || core.identity().epoch == Epoch(10)).await;
    let evidence = core.log_behind().expect("the refusal is evidence");
    assert!(
        evidence.starts_with("inventory: refused the epoch probe sent at epoch 1: stale_epoch"),
        "{evidence}"
    );
    assert_eq!(metrics.epoch_raises.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.log_behind.load(Ordering::Relaxed), 1);

    // An operator who accepts the loss clears the mark (audited); work runs at epoch 10.
    let cleared = core
        .clear_behind(protocol::operator::ClearBehindRequest {
            operator: "alice".into(),
            reason: "restored from last night's backup; checked".into(),
        })
        .await
        .unwrap();
    assert_eq!(cleared.cleared, evidence);
    assert_eq!(core.log_behind(), None);
    assert_eq!(metrics.log_behind.load(Ordering::Relaxed), 0);
    let again = core
        .clear_behind(protocol::operator::ClearBehindRequest {
            operator: "alice".into(),
            reason: "twice".into(),
        })
        .await;
    assert!(again.is_err(), "nothing to clear the second time");
    let reply = core.submit(one("after-the-clear")).await.unwrap();
    let Reply::Outcome(response) = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(response.outcome, Outcome::Committed);
    assert_eq!(
        metrics.epoch_raises.load(Ordering::Relaxed),
        1,
        "one raise sufficed"
    );

    // A restart starts above the raised epoch, and the clear holds.
    // Deliveries in flight hold the core; the process they stand for is gone once they end.
    until("the core's tasks end", || Arc::strong_count(&core) == 1).await;
    let closing = Arc::clone(&core);
    tokio::task::spawn_blocking(move || closing.close_log())
        .await
        .unwrap();
    storage.crash(wal::sim::Unsynced::Drop);
    storage.reboot();
    drop(core);
    let restarted = recover_on(storage.clone(), &config, Arc::new(Metrics::default()))
        .await
        .unwrap();
    assert_eq!(restarted.identity().epoch, Epoch(11));
    assert_eq!(restarted.log_behind(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_that_fences_this_run_out_sets_log_behind() {
    let refuse = |code: &str| {
        (
            StatusCode::CONFLICT,
            json!({"error": code, "message": "seen run 00000000000000ff at epoch 9"}),
        )
    };
    let ok = cooperative();
    // (what, answers, the evidence names)
    let cases = [
        (
            "a prepare refused with incarnation_conflict",
            Answers {
                prepare: refuse("incarnation_conflict"),
                ..ok.clone()
            },
            Some("refused a prepare sent at epoch 1: incarnation_conflict: seen run"),
        ),
        (
            "a prepare refused with stale_epoch",
            Answers {
                prepare: refuse("stale_epoch"),
                ..ok.clone()
            },
            Some("refused a prepare sent at epoch 1: stale_epoch: seen run"),
        ),
        (
            "a commit refused with stale_epoch",
            Answers {
                commit: refuse("stale_epoch"),
                ..ok.clone()
            },
            Some("refused a commit sent at epoch 1: stale_epoch: seen run"),
        ),
        (
            "a commit refused with incarnation_conflict",
            Answers {
                commit: refuse("incarnation_conflict"),
                ..ok.clone()
            },
            Some("refused a commit sent at epoch 1: incarnation_conflict: seen run"),
        ),
        (
            "a prepare refused with another 409 proves nothing",
            Answers {
                prepare: refuse("not_prepared"),
                ..ok.clone()
            },
            None,
        ),
        (
            "a prepare answered 500 proves nothing",
            Answers {
                prepare: (StatusCode::INTERNAL_SERVER_ERROR, json!({"oops": 1})),
                ..ok.clone()
            },
            None,
        ),
    ];
    for (what, answers, evidence) in cases {
        let commits = answers.prepare.0 == StatusCode::OK;
        let (core, _storage, log) =
            setup_with(answers, 10, crate::config::defaults::RETENTION_MS).await;
        let reply = core.submit(one("t-fenced")).await.unwrap();
        let Reply::Outcome(response) = reply else {
            panic!("{what}: {reply:?}");
        };
        let expected = if commits {
            Outcome::Committed
        } else {
            Outcome::Aborted
        };
        assert_eq!(response.outcome, expected, "{what}");
        // Phase two is under way (or done) once a decision message arrived.
        until(what, || {
            log.lock()
                .unwrap()
                .iter()
                .any(|(r, _)| *r == "commit" || *r == "abort")
        })
        .await;
        match evidence {
            Some(names) => {
                until(what, || core.log_behind().is_some()).await;
                let got = core.log_behind().unwrap_or_default();
                assert!(got.contains(names), "{what}: {got}");
                assert!(got.starts_with("inventory: refused"), "{what}: {got}");
                assert_eq!(core.metrics().log_behind.load(Ordering::Relaxed), 1);
            }
            None => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert_eq!(core.log_behind(), None, "{what}");
            }
        }
    }
}
