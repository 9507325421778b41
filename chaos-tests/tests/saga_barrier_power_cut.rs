//! Issue 25, item 2, against the real participant: a saga op's repeat and its status are not
//! told before the op's record is durable. The log writer is stalled between write and fsync
//! (a disk that never finishes), the coordinator's questions arrive (a repeated action, the
//! probe `GET /saga/ops/{op_id}`), then the power goes: the unsynced tail is cut and the
//! participant restarts. Nothing may have said `done` for the step the cut took back, or the
//! coordinator would complete a saga whose step never happened.
//!
//! Before the fix both questions were answered `done` from the barrier in memory at once.

use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use chaos_tests::disk_faults::{last_segment, truncate_at, wal_dir};
use chaos_tests::lease_nodes::{self, blocking};
use protocol::auth::Kind;
use serde_json::{Value, json};

const OP_ID: &str = "s-cut:reserve:action";
/// The coordinator's question names it: without it the barrier, holding an op on the step,
/// would refuse the question (422 `coordinator_id_required`) rather than answer it.
const PROBE: &str = "s-cut:reserve:action?coordinator_id=c-cut";

fn action() -> Value {
    json!({"op_id": OP_ID, "saga_id": "s-cut", "step": "reserve", "coordinator_id": "c-cut",
           "epoch": 1, "payload": {"ops": [{"op": "put", "key": "reserved", "value": true}]}})
}

/// The answer to one question, or `None` when none came within `wait` (it is waiting for the
/// stalled fsync, as it must).
async fn ask(request: reqwest::RequestBuilder, wait: Duration) -> Option<(u16, Value)> {
    let response = request.timeout(wait).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.unwrap_or(Value::Null)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_saga_answer_rests_on_a_record_a_power_cut_takes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = lease_nodes::participant(failpoints_binary(), dir.path(), None);
    let data_dir = dir.path().join("participant");
    let segment = last_segment(&wal_dir(&data_dir))
        .ok()
        .flatten()
        .expect("the participant's log has a segment");
    let synced_len = std::fs::metadata(&segment).unwrap().len();

    // From now on the log writer writes and never syncs.
    p.set_env(vec![
        ("RUST_LOG".into(), "info".into()),
        (
            "FAILPOINTS".into(),
            "wal::between_write_and_fsync=pause".into(),
        ),
    ]);
    blocking(|| {
        p.kill();
        p.restart();
        p.wait_ready(Duration::from_secs(30))
    })
    .unwrap();
    let peer = p.http_as(Kind::Peer);
    let url = p.url();
    // The first action: applied in memory, its record written, never synced; it hangs.
    let first = tokio::spawn({
        let request = peer.post(format!("{url}/saga/action")).json(&action());
        async move { ask(request, Duration::from_secs(60)).await }
    });
    // The coordinator's probe and its resend, while the first is in flight. Any answer that
    // comes must not say the step is done: nothing about it is durable.
    let mut asked = 0;
    while asked < 6 {
        asked += 1;
        let probe = ask(
            peer.get(format!("{url}/saga/ops/{PROBE}")),
            Duration::from_millis(500),
        )
        .await;
        if let Some((_, body)) = &probe {
            assert_ne!(
                body["status"], "done",
                "the probe told a step not yet durable: {body}"
            );
        }
        let resend = ask(
            peer.post(format!("{url}/saga/action")).json(&action()),
            Duration::from_millis(500),
        )
        .await;
        if let Some((_, body)) = &resend {
            assert_ne!(
                body["status"], "done",
                "a resend was told done from memory: {body}"
            );
        }
    }
    assert!(
        !first.is_finished(),
        "the first action answered before its fsync"
    );

    // The power cut: the process dies and what was never synced is gone.
    blocking(|| p.kill());
    let cut = std::fs::metadata(&segment).unwrap().len();
    assert!(
        cut > synced_len,
        "the stalled run wrote its record ({synced_len} -> {cut} bytes)"
    );
    truncate_at(&segment, synced_len).unwrap();
    p.set_env(vec![("RUST_LOG".into(), "info".into())]);
    blocking(|| {
        p.restart();
        p.wait_ready(Duration::from_secs(30))
    })
    .unwrap();
    let (status, body) = ask(
        peer.get(format!("{url}/saga/ops/{PROBE}")),
        Duration::from_secs(10),
    )
    .await
    .expect("the restarted participant answers");
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("not_found")),
        "{body}"
    );
    first.abort();
}
