//! The real `twopc coordinator` against in-test participants: commit, the three kinds of
//! abort (no, timeout, malformed vote), and phase-two retry while a participant is down.

mod coordinator_support;

use std::time::Duration;

use coordinator_support::{AckMode, Coordinator, TestParticipant, VoteMode, two_party};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_path_reaches_every_participant_with_identity_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
    let c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);

    let (status, body) = c.submit("?wait=acked", &two_party("order-1", &a, &b)).await;
    assert_eq!(status, 200, "{body}");
    // The answer names the attempt participants know it by: the first position of this run.
    let gtid = body["gtid"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        body,
        json!({"id": "order-1", "gtid": gtid, "outcome": "committed", "reason": null,
            "participants": [
            {"name": "inventory", "vote": "yes", "acked": true},
            {"name": "payments", "vote": "yes", "acked": true}]})
    );
    for p in [&a, &b] {
        let got = p.received();
        let routes: Vec<_> = got.iter().map(|r| r.route).collect();
        assert_eq!(routes, ["prepare", "commit"], "{}", p.name);
        let prepare = &got[0].body;
        assert_eq!(prepare["txid"], "order-1");
        assert_eq!(prepare["epoch"], 1);
        let coordinator_id = prepare["coordinator_id"].as_str().unwrap();
        assert!(coordinator_id.starts_with("c-"), "{prepare}");
        let incarnation = prepare["incarnation"].as_str().unwrap();
        assert!(
            incarnation.len() == 16
                && incarnation
                    .chars()
                    .all(|ch| matches!(ch, '0'..='9' | 'a'..='f')),
            "incarnation is 16 lowercase hex digits: {prepare}"
        );
        assert_eq!(prepare["position"], 1, "{prepare}");
        assert_eq!(
            prepare["gtid"].as_str(),
            Some(format!("{coordinator_id}:{incarnation}:1").as_str()),
            "gtid = coordinator_id:incarnation:position"
        );
        assert_eq!(prepare["gtid"].as_str(), Some(gtid.as_str()));
        assert!(prepare["payload"]["ops"].is_array());
        // The commit names the same attempt, from the same run.
        let commit = &got[1].body;
        for field in ["txid", "gtid", "coordinator_id", "epoch", "incarnation"] {
            assert_eq!(commit[field], prepare[field], "{field}: {commit}");
        }
    }
    // At start each participant was asked, by an abort of position 0 of this run, which
    // epoch it holds; the probe names this run and is never an attempt clients can see.
    for p in [&a, &b] {
        let deadline = std::time::Instant::now() + WAIT;
        while p.probes().is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let probes = p.probes();
        assert_eq!(probes.len(), 1, "{}: one probe, acknowledged", p.name);
        let (probe, prepare) = (&probes[0], p.prepare_of("order-1"));
        assert_eq!(probe.route, "abort", "{}", p.name);
        let run = format!(
            "{}:{}:",
            prepare["coordinator_id"].as_str().unwrap_or_default(),
            prepare["incarnation"].as_str().unwrap_or_default()
        );
        assert_eq!(probe.body["gtid"], format!("{run}0"), "{}", probe.body);
        for field in ["coordinator_id", "incarnation", "epoch"] {
            assert_eq!(probe.body[field], prepare[field], "{field}: {}", probe.body);
        }
    }
    let status = c.wait_state("order-1", "committed", WAIT).await;
    assert!(status["ended_at_ms"].is_u64(), "{status}");
    assert_eq!(status["gtid"].as_str(), Some(gtid.as_str()), "{status}");
    let decision = c.decision_for(&a.prepare_of("order-1")).await;
    assert_eq!(decision["decision"], "commit", "{decision}");
    assert_eq!(
        decision["coordinator_id"],
        a.prepare_of("order-1")["coordinator_id"]
    );
    assert_eq!(
        decision["incarnation"],
        a.prepare_of("order-1")["incarnation"]
    );
    // A bare query names no attempt: the coordinator cannot prove anything about it.
    let (_, bare) = c
        .get_as(
            protocol::auth::Kind::Peer,
            "/v1/transactions/order-1/decision",
        )
        .await;
    assert_eq!(bare["decision"], "unknown", "{bare}");

    // Without an id the coordinator makes one; the default wait is for the decision only.
    let (status, body) = c
        .submit(
            "",
            &json!({"participants": [{"name": "inventory", "payload": {}}]}),
        )
        .await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("committed")),
        "{body}"
    );
    // Generated: `tx-` and 32 hex digits (docs/api.md).
    let id = body["id"].as_str().unwrap();
    assert!(id.starts_with("tx-") && id.len() == 35, "{id}");

    let (_, metrics) = {
        let text = reqwest::get(format!("{}/metrics", c.url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        (0, text)
    };
    assert!(
        metrics.contains("twopc_coordinator_transactions_total{outcome=\"committed\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_vote_aborts_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::No, AckMode::Ack).await;
    let c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let (status, body) = c.submit("", &two_party("order-no", &a, &b)).await;
    assert_eq!(status, 200);
    assert_eq!(body["outcome"], "aborted");
    assert_eq!(body["participants"][1]["vote"], "no");
    assert!(
        body["reason"].as_str().unwrap().contains("out of stock"),
        "{body}"
    );
    a.wait_for("abort", "order-no", 1, WAIT).await;
    assert_eq!(
        a.count("commit", "order-no") + b.count("commit", "order-no"),
        0
    );
    c.wait_state("order-no", "aborted", WAIT).await;
    // Presumed abort: the abort is owed only to the yes voter; the no voter holds nothing and
    // hears nothing (docs/protocol.md, "Presumed abort: who is owed an abort").
    assert_eq!(b.count("abort", "order-no"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_timeout_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Slow(3_000), AckMode::Ack).await;
    let c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let mut request = two_party("order-slow", &a, &b);
    request["timeout_ms"] = json!(300);
    let (status, body) = c.submit("", &request).await;
    assert_eq!(status, 200);
    assert_eq!(body["outcome"], "aborted", "{body}");
    assert_eq!(body["participants"][1]["vote"], "timeout", "{body}");
    a.wait_for("abort", "order-slow", 1, WAIT).await;
    b.wait_for("abort", "order-slow", 1, WAIT).await;
    assert_eq!(
        a.count("commit", "order-slow") + b.count("commit", "order-slow"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_vote_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Malformed, AckMode::Ack).await;
    let c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let (status, body) = c.submit("", &two_party("order-bad", &a, &b)).await;
    assert_eq!(status, 200);
    assert_eq!(body["outcome"], "aborted", "{body}");
    assert_eq!(body["participants"][1]["vote"], "error", "{body}");
    a.wait_for("abort", "order-bad", 1, WAIT).await;
    assert_eq!(a.count("commit", "order-bad"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phase_two_is_retried_while_a_participant_is_down_then_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Down).await;
    let c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let (status, body) = c.submit("", &two_party("order-retry", &a, &b)).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("committed")));

    // b refuses several times; the pending ack is visible with its attempts and last error.
    b.wait_for("commit", "order-retry", 3, WAIT).await;
    let stuck = c.wait_state("order-retry", "committing", WAIT).await;
    let pb = &stuck["participants"][1];
    assert_eq!(pb["acked"], false, "{stuck}");
    assert!(pb["attempts"].as_u64().unwrap() >= 2, "{stuck}");
    assert!(
        pb["last_error"].as_str().unwrap().contains("503"),
        "{stuck}"
    );
    let (_, listing) = c.get("/v1/transactions?state=committing").await;
    assert_eq!(listing["transactions"][0]["id"], "order-retry");
    let metrics = reqwest::get(format!("{}/metrics", c.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("twopc_coordinator_pending_acks 1"),
        "{metrics}"
    );

    b.set_ack(AckMode::Ack);
    c.wait_state("order-retry", "committed", WAIT).await;
    assert_eq!(
        a.count("commit", "order-retry"),
        1,
        "a acked the first time"
    );
}
