//! The library on the simulated disk (`wal::sim`): a power loss that drops every unsynced write
//! loses no promise (no yes vote, no ack), and a failing fsync turns into 503 `log_failed`.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Tally, add, decision, prepare};
use participant::{Participant, ParticipantConfig, RequestError, finish};
use protocol::Vote;
use tower::ServiceExt;
use wal::sim::{SimStorage, Unsynced};

fn open(dir: &tempfile::TempDir, disk: &SimStorage) -> Participant<Tally> {
    Participant::open_with_storage(
        ParticipantConfig::new(dir.path()),
        Arc::new(disk.clone()),
        Tally::default,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_keeps_every_vote_and_ack() {
    for mode in [
        Unsynced::Drop,
        Unsynced::Tear { seed: 7 },
        Unsynced::Tear { seed: 8 },
    ] {
        let dir = tempfile::tempdir().unwrap();
        let disk = SimStorage::new();
        let p = open(&dir, &disk);
        let mut voted_yes = Vec::new();
        let mut acked = Vec::new();
        for i in 0..40 {
            let txid = format!("t{i}");
            assert_eq!(
                p.prepare(prepare(&txid, 1, add(&format!("k{i}"), 1)))
                    .await
                    .unwrap(),
                Vote::Yes
            );
            voted_yes.push(txid.clone());
            if i % 2 == 0 {
                p.commit(decision(&txid, 1)).await.unwrap();
                acked.push(txid);
            }
        }
        // Lazy records (no votes) may be lost; nothing that was answered may be.
        p.prepare(prepare("refused", 1, add("z", -1)))
            .await
            .unwrap();
        disk.crash(mode);
        drop(p);
        disk.reboot();

        let p = open(&dir, &disk);
        let prepared: Vec<String> = p
            .prepared_list()
            .into_iter()
            .map(|e| e.txid.to_string())
            .collect();
        for txid in &voted_yes {
            let committed = acked.contains(txid);
            assert_eq!(!committed, prepared.contains(txid), "{mode:?}: {txid}");
        }
        assert_eq!(p.read(|t| t.applied), acked.len() as u64, "{mode:?}");
        // The acked commits answer duplicates without applying again.
        p.commit(decision("t0", 1)).await.unwrap();
        assert_eq!(p.read(|t| t.applied), acked.len() as u64, "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_503_log_failed_and_stays_failed() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SimStorage::new();
    let p = open(&dir, &disk);
    let app = finish(p.router());
    assert_eq!(
        p.prepare(prepare("t1", 1, add("a", 1))).await.unwrap(),
        Vote::Yes
    );

    disk.set_fail_sync(true);
    let failed = p.prepare(prepare("t2", 1, add("b", 1))).await;
    assert!(
        matches!(failed, Err(RequestError::LogFailed(_))),
        "{failed:?}"
    );
    // `failed()` resolves: the service shuts down (exit 1).
    tokio::time::timeout(std::time::Duration::from_secs(5), p.failed())
        .await
        .unwrap();
    // Healthy disk again: nothing is retried, every write is still refused.
    disk.set_fail_sync(false);
    let body = serde_json::to_string(&decision("t1", 1)).unwrap();
    let response = app
        .clone()
        .oneshot(
            Request::post("/2pc/commit")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&bytes).contains("\"log_failed\""));
    let ready = app
        .oneshot(Request::get("/readyz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(p.metrics_text().contains("twopc_participant_log_failed 1"));
}
