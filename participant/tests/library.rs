//! The library with a real log in a temporary directory: what survives a restart, the data
//! directory lock, bounded logs, and in-doubt resolution against a stub coordinator.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    C1, Tally, add, coord, decision, decision_as, from, gtid, gtid_of, prepare, prepare_as, run,
};
use participant::record::Fence;
use participant::{OpenError, Participant, ParticipantConfig, RequestError};
use protocol::{Epoch, ErrorCode, Incarnation, Vote};

fn config(dir: &tempfile::TempDir) -> ParticipantConfig {
    ParticipantConfig::new(dir.path())
}

fn open(config: ParticipantConfig) -> Participant<Tally> {
    Participant::open(config, Tally::default).unwrap()
}

fn code(result: Result<impl std::fmt::Debug, RequestError>) -> ErrorCode {
    match result {
        Err(RequestError::Rejected(rejection)) => rejection.code(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn highest_epoch_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(config(&dir));
    assert_eq!(
        p.prepare(prepare("t1", 5, add("a", 1))).await.unwrap(),
        Vote::Yes
    );
    // Raised by a message that leaves no other record.
    assert_eq!(
        code(p.commit(decision("ghost", 6)).await),
        ErrorCode::NotPrepared
    );
    drop(p);
    let p = open(config(&dir));
    assert_eq!(
        code(p.prepare(prepare("t2", 5, add("b", 1))).await),
        ErrorCode::StaleEpoch
    );
    assert_eq!(
        code(p.commit(decision("t1", 5)).await),
        ErrorCode::StaleEpoch
    );
    p.commit(decision("t1", 6)).await.unwrap();
    assert_eq!(p.read(|t| t.counts["a"]), 1);
}

#[tokio::test]
async fn the_run_holding_an_epoch_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(config(&dir));
    assert_eq!(
        p.prepare(prepare("t1", 5, add("a", 1))).await.unwrap(),
        Vote::Yes
    );
    // Epoch 6 claimed by run 0x66, by a message that leaves no record but the fence.
    let six = from(C1, 6).in_run(0x66);
    assert_eq!(
        code(p.commit(decision_as("ghost", &gtid("ghost"), &six)).await),
        ErrorCode::NotPrepared
    );
    drop(p);
    let p = open(config(&dir));
    assert_eq!(
        p.with_engine(|e| e.highest_epoch(&coord(C1))),
        Some(Fence {
            epoch: Epoch(6),
            incarnation: Incarnation(0x66)
        })
    );
    // Another run claiming epoch 6 (a coordinator restored from a backup) is refused.
    assert_eq!(
        code(p.prepare(prepare("t2", 6, add("b", 1))).await),
        ErrorCode::IncarnationConflict
    );
    assert_eq!(
        code(p.commit(decision("t1", 6)).await),
        ErrorCode::IncarnationConflict
    );
    assert_eq!(p.prepared_list().len(), 1);
    p.commit(decision_as("t1", &gtid("t1"), &six))
        .await
        .unwrap();
    assert_eq!(p.read(|t| t.applied), 1);
}

#[tokio::test]
async fn a_reused_client_id_after_a_restart_is_a_new_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (from(C1, 1), from(C1, 2));
    let first = gtid_of(C1, run(1), 1);
    let p = open(config(&dir));
    assert_eq!(
        p.prepare(prepare_as("order-1", &first, &one, add("a", 1)))
            .await
            .unwrap(),
        Vote::Yes
    );
    p.commit(decision_as("order-1", &first, &one))
        .await
        .unwrap();
    drop(p);

    // The coordinator's next run begins the client's retry of order-1 as its first attempt.
    let p = open(config(&dir));
    let second = gtid_of(C1, run(2), 1);
    assert_eq!(
        p.prepare(prepare_as("order-1", &second, &two, add("a", 5)))
            .await
            .unwrap(),
        Vote::Yes
    );
    assert_eq!(p.prepared_list()[0].gtid, second);
    p.commit(decision_as("order-1", &second, &two))
        .await
        .unwrap();
    assert_eq!(p.read(|t| (t.counts["a"], t.applied)), (6, 2));
    // The first attempt's tombstone still knows its payload.
    assert!(matches!(
        p.prepare(prepare_as("order-1", &first, &two, add("a", 5)))
            .await
            .unwrap(),
        Vote::No { .. }
    ));
    assert_eq!(
        p.prepare(prepare_as("order-1", &first, &two, add("a", 1)))
            .await
            .unwrap(),
        Vote::Yes
    );
    assert_eq!(p.read(|t| t.applied), 2);
    assert!(p.prepared_list().is_empty());
}

#[tokio::test]
async fn prepared_survives_a_restart_with_locks_and_commits_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(config(&dir));
    assert_eq!(
        p.prepare(prepare("t1", 1, add("a", 5))).await.unwrap(),
        Vote::Yes
    );
    drop(p);

    let p = open(config(&dir));
    let listed = p.prepared_list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].keys, vec!["a".to_string()]);
    match p.prepare(prepare("t2", 1, add("a", 1))).await.unwrap() {
        Vote::No { reason } => assert!(reason.contains(gtid("t1").as_str()), "{reason}"),
        Vote::Yes => panic!("a's lock must survive the restart"),
    }
    // A duplicate prepare after the restart gives the same yes.
    assert_eq!(
        p.prepare(prepare("t1", 1, add("a", 5))).await.unwrap(),
        Vote::Yes
    );
    p.commit(decision("t1", 1)).await.unwrap();
    drop(p);

    let p = open(config(&dir));
    p.commit(decision("t1", 1)).await.unwrap();
    assert_eq!(p.read(|t| (t.counts["a"], t.applied)), (5, 1));
    assert!(p.prepared_list().is_empty());
}

#[tokio::test]
async fn abort_tombstone_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(config(&dir));
    p.abort(decision("early", 1)).await.unwrap();
    drop(p);
    let p = open(config(&dir));
    assert!(matches!(
        p.prepare(prepare("early", 1, add("a", 1))).await.unwrap(),
        Vote::No { .. }
    ));
    assert!(p.prepared_list().is_empty());
}

#[tokio::test]
async fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _p = open(config(&dir));
    match Participant::open(config(&dir), Tally::default) {
        Err(error @ OpenError::Locked { .. }) => {
            assert_eq!(error.exit_code(), 3);
            assert!(
                error
                    .to_string()
                    .contains(&dir.path().display().to_string())
            );
        }
        other => panic!("expected Locked, got {other:?}"),
    }
}

#[tokio::test]
async fn checkpoints_keep_the_log_bounded_and_state_survives() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.checkpoint_every_records = 20;
    // Checkpoints come no more often than every `live entries` records; keep that small.
    cfg.engine.tombstones_max = 50;
    cfg.wal.segment_bytes_max = 4096;
    let p = open(cfg.clone());
    // Positions rise in the order attempts begin, as a coordinator run numbers them: dropped
    // tombstones leave a mark per run, and attempts at or below it vote no.
    let one = from(C1, 1);
    let attempt = |i: u64| (format!("t{i}"), gtid_of(C1, run(1), i + 1));
    for i in 0..400 {
        let (txid, g) = attempt(i);
        assert_eq!(
            p.prepare(prepare_as(&txid, &g, &one, add("a", 1)))
                .await
                .unwrap(),
            Vote::Yes
        );
        p.commit(decision_as(&txid, &g, &one)).await.unwrap();
    }
    let (open_txid, open_gtid) = attempt(400);
    p.prepare(prepare_as(&open_txid, &open_gtid, &one, add("b", 2)))
        .await
        .unwrap();
    // Checkpoints complete in the background; poll until old segments are gone.
    let mut bytes = u64::MAX;
    for _ in 0..200 {
        bytes = p
            .metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix("twopc_wal_bytes_on_disk "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        if bytes < 32 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // 800 records of ~150 bytes would be >100 KiB without checkpoints.
    assert!(bytes < 32 * 1024, "log is {bytes} bytes");
    drop(p);
    let p = open(cfg);
    assert_eq!(p.read(|t| (t.counts["a"], t.applied)), (400, 400));
    assert_eq!(p.prepared_list().len(), 1);
    let (last, last_gtid) = attempt(399);
    p.commit(decision_as(&last, &last_gtid, &one))
        .await
        .unwrap(); // a tombstone carried across the restart
    assert_eq!(p.read(|t| t.applied), 400);
    // The oldest tombstones went with the count bound, leaving a mark for their run. A very
    // late duplicate commit below the mark is acked (only a commit can have ended an attempt
    // whose decision is commit) and never applied twice; a very late duplicate prepare votes
    // no, since a yes could be followed by a second commit.
    let (first, first_gtid) = attempt(0);
    p.commit(decision_as(&first, &first_gtid, &one))
        .await
        .unwrap();
    assert!(matches!(
        p.prepare(prepare_as(&first, &first_gtid, &one, add("a", 1)))
            .await
            .unwrap(),
        Vote::No { .. }
    ));
    // Above the mark nothing was forgotten: a commit for an attempt never prepared is refused.
    let (never, never_gtid) = attempt(500);
    assert!(matches!(
        p.commit(decision_as(&never, &never_gtid, &one)).await,
        Err(RequestError::Rejected(
            participant::Rejection::NotPrepared { .. }
        ))
    ));
    assert_eq!(p.read(|t| t.applied), 400);
    assert_eq!(p.prepared_list().len(), 1);
}

type StubState = (
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<VecDeque<&'static str>>>,
    &'static str,
);

/// A stub coordinator: answers decision queries from a script (the last answer repeats) and
/// records each query as `{txid}?{query string}`.
async fn stub_coordinator(script: Vec<&'static str>) -> (String, Arc<Mutex<Vec<String>>>) {
    stub_coordinator_named("c1", script).await
}

/// A stub coordinator with coordinator id `id` (the tests' prepares come from `c1`).
async fn stub_coordinator_named(
    id: &'static str,
    script: Vec<&'static str>,
) -> (String, Arc<Mutex<Vec<String>>>) {
    use axum::extract::{Path, RawQuery, State};
    let asked = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(Mutex::new(script.into_iter().collect::<VecDeque<_>>()));
    let state = (asked.clone(), script, id);
    let app = axum::Router::new()
        .route(
            protocol::routes::TRANSACTION_DECISION,
            axum::routing::get(
                |State((asked, script, me)): State<StubState>,
                 Path(id): Path<String>,
                 RawQuery(query): RawQuery| async move {
                    asked
                        .lock()
                        .unwrap()
                        .push(format!("{id}?{}", query.unwrap_or_default()));
                    let mut script = script.lock().unwrap();
                    let answer = if script.len() > 1 {
                        script.pop_front().unwrap()
                    } else {
                        script[0]
                    };
                    axum::Json(serde_json::json!({
                        "decision": answer,
                        "coordinator_id": me,
                        "reason": format!("the stub says {answer}"),
                    }))
                },
            ),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, asked)
}

async fn poll(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_doubt_asks_the_coordinator_and_obeys_after_pending() {
    let (url, asked) = stub_coordinator(vec!["pending", "pending", "commit"]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.coordinator_urls = vec![url];
    cfg.engine.in_doubt_after_ms = 50;
    cfg.engine.decision_backoff_base_ms = 10;
    cfg.engine.decision_backoff_max_ms = 40;
    cfg.tick_ms = 5;
    let p = open(cfg);
    p.prepare(prepare("t1", 1, add("a", 3))).await.unwrap();
    let resolver = p.spawn_resolver();
    poll("the commit from the coordinator", || {
        p.read(|t| t.applied) == 1
    })
    .await;
    resolver.abort();
    assert_eq!(p.read(|t| t.counts["a"]), 3);
    assert!(p.prepared_list().is_empty());
    let asked = asked.lock().unwrap().clone();
    let g = gtid("t1");
    let query = format!(
        "t1?gtid={g}&incarnation={}&epoch=1&position={}",
        run(1),
        g.parts().unwrap().2
    );
    assert_eq!(
        asked,
        vec![query.clone(), query.clone(), query],
        "asked about the attempt until a decision, nothing more"
    );
    // The coordinator's own resend afterwards is a harmless duplicate.
    p.commit(decision("t1", 1)).await.unwrap();
    assert_eq!(p.read(|t| t.applied), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_doubt_reaches_the_leader_of_a_group_through_a_follower() {
    let (leader, asked) = stub_coordinator(vec!["commit"]).await;
    // A follower of the group: 503 not_leader naming the leader, on every route.
    let named = leader.clone();
    let follower_app = axum::Router::new().fallback(move || {
        let body = protocol::ErrorBody::new(ErrorCode::NotLeader, "this node follows")
            .with_leader(named.clone());
        async move {
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(body),
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let follower = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, follower_app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.coordinator_urls = vec![follower, leader];
    cfg.engine.in_doubt_after_ms = 20;
    cfg.tick_ms = 5;
    let p = open(cfg);
    p.prepare(prepare("t1", 1, add("a", 3))).await.unwrap();
    let resolver = p.spawn_resolver();
    poll("the commit from the leader", || p.read(|t| t.applied) == 1).await;
    resolver.abort();
    assert_eq!(p.read(|t| t.counts["a"]), 3);
    assert_eq!(asked.lock().unwrap().len(), 1, "the leader was asked once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_another_coordinator_is_not_obeyed() {
    // A coordinator that never saw the transaction (a wiped directory, a wrong URL) would
    // presume abort; the one that prepared it may have decided commit.
    let (url, asked) = stub_coordinator_named("someone-else", vec!["abort"]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.coordinator_urls = vec![url];
    cfg.engine.in_doubt_after_ms = 10;
    cfg.engine.decision_backoff_base_ms = 5;
    cfg.engine.decision_backoff_max_ms = 5;
    cfg.tick_ms = 2;
    let p = open(cfg);
    p.prepare(prepare("t1", 1, add("a", 3))).await.unwrap();
    let resolver = p.spawn_resolver();
    poll("several decision queries", || {
        asked.lock().unwrap().len() >= 3
    })
    .await;
    resolver.abort();
    assert_eq!(p.prepared_list().len(), 1, "still in doubt, locks held");
    assert_eq!(p.read(|t| t.applied + t.released), 0);
    // The real coordinator's decision still lands.
    p.commit(decision("t1", 1)).await.unwrap();
    assert_eq!(p.read(|t| t.applied), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_answer_keeps_it_in_doubt_and_shows_why() {
    let (url, asked) = stub_coordinator(vec!["unknown"]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.coordinator_urls = vec![url];
    cfg.engine.in_doubt_after_ms = 10;
    cfg.engine.decision_backoff_base_ms = 5;
    cfg.engine.decision_backoff_max_ms = 5;
    cfg.tick_ms = 2;
    let p = open(cfg);
    p.prepare(prepare("t1", 1, add("a", 3))).await.unwrap();
    let resolver = p.spawn_resolver();
    poll("several decision queries", || {
        asked.lock().unwrap().len() >= 3
    })
    .await;
    resolver.abort();
    let listed = p.prepared_list();
    assert_eq!(listed.len(), 1, "still in doubt, locks held");
    let shown = listed[0].last_answer.clone().unwrap_or_default();
    assert!(
        shown.contains("unknown") && shown.contains("the stub says unknown"),
        "{shown}"
    );
    assert_eq!(p.read(|t| t.applied + t.released), 0);
    p.commit(decision("t1", 1)).await.unwrap();
    assert_eq!(p.read(|t| t.applied), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_answer_releases_and_no_answer_keeps_waiting() {
    let (url, _asked) = stub_coordinator(vec!["abort"]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.coordinator_urls = vec![url];
    cfg.engine.in_doubt_after_ms = 20;
    cfg.tick_ms = 5;
    let p = open(cfg);
    p.prepare(prepare("t1", 1, add("a", 3))).await.unwrap();
    let resolver = p.spawn_resolver();
    poll("the abort", || p.read(|t| t.released) == 1).await;
    resolver.abort();
    assert_eq!(p.read(|t| t.counts.get("a").copied()), None);

    // Without a coordinator URL it keeps asking nobody and never decides.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.engine.in_doubt_after_ms = 10;
    cfg.engine.decision_backoff_base_ms = 5;
    cfg.engine.decision_backoff_max_ms = 5;
    cfg.tick_ms = 2;
    let p = open(cfg);
    p.prepare(prepare("t1", 1, add("a", 3))).await.unwrap();
    let resolver = p.spawn_resolver();
    poll("several decision attempts", || {
        p.metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix("twopc_participant_decision_queries_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n >= 5)
    })
    .await;
    resolver.abort();
    assert_eq!(p.prepared_list().len(), 1);
    assert_eq!(p.read(|t| t.applied + t.released), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_traffic_recovers_to_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(config(&dir));
    let mut tasks = Vec::new();
    for i in 0..64 {
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            // Four hot keys: many prepares conflict and vote no; duplicates race the original.
            let txid = format!("t{i}");
            let key = format!("k{}", i % 4);
            let (a, b) = tokio::join!(
                p.prepare(prepare(&txid, 1, add(&key, 1))),
                p.prepare(prepare(&txid, 1, add(&key, 1)))
            );
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a, b, "a duplicate prepare answers the same vote");
            match a {
                Vote::Yes if i % 3 == 0 => p.abort(decision(&txid, 1)).await.unwrap(),
                Vote::Yes => p.commit(decision(&txid, 1)).await.unwrap(),
                Vote::No { .. } => p.abort(decision(&txid, 1)).await.unwrap(),
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let before = p.read(|t| t.clone());
    assert!(before.applied > 0);
    assert_eq!(before.counts.values().sum::<i64>(), before.applied as i64);
    assert!(p.prepared_list().is_empty());
    drop(p);
    let p = open(config(&dir));
    assert_eq!(p.read(|t| t.clone()), before);
}

#[tokio::test]
async fn the_participants_a_prepare_named_survive_a_restart_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let list: Vec<protocol::ParticipantName> = ["inventory", "payments"]
        .iter()
        .map(|n| protocol::ParticipantName::new(*n).unwrap())
        .collect();
    let p = open(config(&dir));
    let request = protocol::PrepareRequest {
        participants: Some(list.clone()),
        ..prepare("t1", 1, add("a", 1))
    };
    assert_eq!(p.prepare(request).await.unwrap(), Vote::Yes);
    drop(p);
    let p = open(config(&dir));
    let status = p.with_engine(|e| e.attempt_status(&gtid("t1")));
    assert_eq!(status.participants, Some(list), "{status:?}");
    assert_eq!(status.txid.map(|t| t.to_string()), Some("t1".to_string()));
}
