//! Each coordinator crash point, on the real binary built with `--features failpoints`: the
//! process aborts there, restarts without the crash point, and the outcome is what design
//! section 6 says: abort when no decision was durable, the decision delivered to everyone when
//! it was, and the client never told something that a restart changed.

mod coordinator_support;

use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use coordinator_support::{AckMode, Coordinator, TestParticipant, VoteMode, two_party};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

fn armed(point: &str) -> Vec<(String, String)> {
    vec![("FAILPOINTS".to_string(), format!("{point}=return"))]
}

fn calm() -> Vec<(String, String)> {
    vec![("RUST_LOG".to_string(), "info".to_string())]
}

/// Submits and returns the answer, or `None` when the process died before answering.
async fn try_submit(c: &Coordinator, body: &Value) -> Option<Value> {
    let response = c
        .node
        .http()
        .post(format!("{}/v1/transactions", c.url()))
        .json(body)
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .ok()?;
    response.json().await.ok()
}

fn wait_crash(c: &mut Coordinator, point: &str) {
    let status = tokio::task::block_in_place(|| c.node.wait_exit(WAIT))
        .unwrap_or_else(|| panic!("{point} did not crash the coordinator"));
    assert!(!status.success(), "{point}: exited cleanly: {status}");
}

fn restart_calm(c: &mut Coordinator) {
    c.node.set_env(calm());
    c.restart();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_coordinator_crash_point_recovers_to_the_right_outcome() {
    let binary = tokio::task::spawn_blocking(failpoints_binary)
        .await
        .unwrap();
    // (crash point, whether the decision was durable: commit expected after restart)
    let cases = [
        ("coordinator::before_first_record", false),
        ("coordinator::during_prepare_fanout", false),
        ("coordinator::before_decision_durable", false),
        ("coordinator::after_decision_durable", true),
        ("coordinator::after_some_phase_two", true),
        ("coordinator::before_end_record", true),
    ];
    for (point, committed) in cases {
        let dir = tempfile::tempdir().unwrap();
        let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
        let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
        let mut c = Coordinator::spawn_with(
            binary.clone(),
            armed(point),
            dir.path(),
            "coord",
            &[&a, &b],
            &[],
        );
        tokio::task::block_in_place(|| c.node.wait_ready(WAIT)).unwrap();
        let txid = "order-crash";
        let answer = try_submit(&c, &two_party(txid, &a, &b)).await;
        wait_crash(&mut c, point);
        restart_calm(&mut c);

        if committed {
            let decision = c.decision_for(&a.prepare_of(txid)).await;
            assert_eq!(decision["decision"], "commit", "{point}: {decision}");
            for p in [&a, &b] {
                p.wait_for("commit", txid, 1, WAIT).await;
                assert_eq!(p.count("abort", txid), 0, "{point}: {}", p.name);
            }
            c.wait_state(txid, "committed", WAIT).await;
        } else {
            // Every attempt a participant was prepared with is answered abort: its Begin is in
            // the log with no decision, so the restart aborted it.
            let prepared: Vec<Value> = [&a, &b]
                .into_iter()
                .filter(|p| p.count("prepare", txid) > 0)
                .map(|p| p.prepare_of(txid))
                .collect();
            for prepare in &prepared {
                let decision = c.settled_decision_for(prepare, WAIT).await;
                assert_eq!(decision["decision"], "abort", "{point}: {decision}");
            }
            if point == "coordinator::before_first_record" {
                // Nothing was logged or sent, so no participant has an attempt to ask about
                // and the restarted coordinator has no record of the id. A query that names no
                // attempt is answered `unknown`: the coordinator never invents an outcome
                // (before attempts had ids, it presumed abort for any id it had not seen).
                assert!(prepared.is_empty(), "{point}: prepared {prepared:?}");
                let (status, body) = c.get(&format!("/v1/transactions/{txid}")).await;
                assert_eq!(status, 404, "{point}: {body}");
                let (_, bare) = c
                    .get_as(
                        protocol::auth::Kind::Peer,
                        &format!("/v1/transactions/{txid}/decision"),
                    )
                    .await;
                assert_eq!(bare["decision"], "unknown", "{point}: {bare}");
            } else {
                assert!(!prepared.is_empty(), "{point}: no prepare was sent");
            }
            for p in [&a, &b] {
                assert_eq!(p.count("commit", txid), 0, "{point}: {}", p.name);
            }
            if point == "coordinator::before_decision_durable" {
                // Both prepared (the Begin record was written long before): recovery aborts
                // at both without waiting for them to ask.
                a.wait_for("abort", txid, 1, WAIT).await;
                b.wait_for("abort", txid, 1, WAIT).await;
            }
        }
        // Whatever the client heard, the restart agrees with it.
        if let Some(answer) = answer {
            let expected = if committed { "committed" } else { "aborted" };
            assert_eq!(answer["outcome"], expected, "{point}: {answer}");
        }
        assert!(
            c.node.terminate(WAIT).is_some_and(|s| s.success()),
            "{point}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_recovery_is_recovered_by_the_next_start() {
    let binary = tokio::task::spawn_blocking(failpoints_binary)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Down).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Down).await;
    let mut c = Coordinator::spawn_with(binary, Vec::new(), dir.path(), "coord", &[&a, &b], &[]);
    tokio::task::block_in_place(|| c.node.wait_ready(WAIT)).unwrap();
    for txid in ["r-1", "r-2"] {
        let (status, answer) = c.submit("", &two_party(txid, &a, &b)).await;
        assert_eq!(
            (status, answer["outcome"].as_str()),
            (200, Some("committed"))
        );
    }
    c.node.kill();

    a.set_ack(AckMode::Ack);
    b.set_ack(AckMode::Ack);
    c.node.set_env(armed("coordinator::during_recovery"));
    c.node.restart();
    wait_crash(&mut c, "coordinator::during_recovery");

    restart_calm(&mut c);
    for txid in ["r-1", "r-2"] {
        c.wait_state(txid, "committed", WAIT).await;
        for p in [&a, &b] {
            let epochs: Vec<_> = p
                .received()
                .into_iter()
                .filter(|r| r.route == "commit" && r.body["txid"] == txid)
                .map(|r| r.body["epoch"].as_u64().unwrap())
                .collect();
            // Delivered by a recovery (epoch 2 crashed part-way, epoch 3 finished the rest).
            assert!(
                epochs.iter().any(|e| *e >= 2),
                "{txid} at {}: commit epochs {epochs:?}",
                p.name
            );
            assert_eq!(p.count("abort", txid), 0);
        }
    }
    // The crash hit before the first recovery ack was logged, so the third start resent it.
    let resent_by_third_start = [&a, &b]
        .iter()
        .flat_map(|p| p.received())
        .any(|r| r.route == "commit" && r.body["epoch"] == 3);
    assert!(resent_by_third_start, "no commit with epoch 3");
}
