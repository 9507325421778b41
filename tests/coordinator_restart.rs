//! The real `twopc coordinator` across process deaths: decisions survive SIGKILL and are
//! resent, client retries are idempotent across a restart, the data directory is locked, and
//! a corrupted log is refused.

mod coordinator_support;
mod wal_support;

use std::time::Duration;

use coordinator_support::{AckMode, Coordinator, TestParticipant, VoteMode, two_party};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_unacknowledged_decisions_then_every_participant_gets_them() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Down).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Down).await;
    let mut c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);

    let (_, one) = c.submit("", &two_party("order-a", &a, &b)).await;
    assert_eq!(one["outcome"], "committed");
    let (_, two) = c.submit("", &two_party("order-c", &a, &b)).await;
    assert_eq!(two["outcome"], "committed");
    a.wait_for("commit", "order-a", 1, WAIT).await;

    c.node.kill();
    let first_epoch = a.received()[0].body["epoch"].clone();
    a.set_ack(AckMode::Ack);
    b.set_ack(AckMode::Ack);
    c.restart();

    for txid in ["order-a", "order-c"] {
        c.wait_state(txid, "committed", WAIT).await;
        for p in [&a, &b] {
            let after_restart: Vec<_> = p
                .received()
                .into_iter()
                .filter(|r| {
                    r.route == "commit" && r.body["txid"] == txid && r.body["epoch"] != first_epoch
                })
                .collect();
            assert!(
                !after_restart.is_empty(),
                "{} got no commit for {txid} after restart",
                p.name
            );
            assert_eq!(after_restart[0].body["epoch"], 2, "the new run's epoch");
            // The resend names the attempt the first run began, sent by the new run.
            let prepare = p.prepare_of(txid);
            assert_eq!(after_restart[0].body["gtid"], prepare["gtid"]);
            assert_ne!(
                after_restart[0].body["incarnation"], prepare["incarnation"],
                "every start is a new incarnation"
            );
            assert_eq!(p.count("abort", txid), 0);
        }
    }
    // Recovery never re-prepares.
    assert_eq!(a.count("prepare", "order-a"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_retry_after_a_restart_gets_the_recorded_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::No, AckMode::Ack).await;
    let mut c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let request = two_party("order-idem", &a, &b);
    let (status, first) = c.submit("?wait=acked", &request).await;
    assert_eq!((status, first["outcome"].as_str()), (200, Some("aborted")));

    c.node.kill();
    c.restart();

    let (status, again) = c.submit("", &request).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["outcome"], first["outcome"]);
    assert_eq!(again["reason"], first["reason"]);
    assert_eq!(again["participants"], first["participants"]);
    assert_eq!(
        a.count("prepare", "order-idem"),
        1,
        "a retry never prepares again"
    );
    assert_eq!(b.count("prepare", "order-idem"), 1);

    let mut different = request.clone();
    different["participants"][0]["payload"] = json!({"ops": []});
    let (status, conflict) = c.submit("", &different).await;
    assert_eq!(
        (status, conflict["error"].as_str()),
        (409, Some("id_conflict")),
        "{conflict}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_coordinator_on_the_same_directory_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let _first = Coordinator::start(dir.path(), "first", &[&a], &[]);
    let mut second = Coordinator::spawn(dir.path(), "second", &[&a], &[]);
    let status = tokio::task::block_in_place(|| second.node.wait_exit(Duration::from_secs(20)))
        .expect("the second coordinator kept running");
    assert_eq!(status.code(), Some(3), "{}", second.node.log());
    let log = second.node.log();
    assert!(log.contains("locked"), "{log}");
    assert!(
        log.contains("coordinator-data"),
        "the message names the directory: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_log_is_refused_with_exit_4_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let mut c = Coordinator::start(dir.path(), "coord", &[&a], &[]);
    for i in 0..3 {
        let request =
            json!({"id": format!("t-{i}"), "participants": [{"name": "inventory", "payload": {}}]});
        let (status, _) = c.submit("?wait=acked", &request).await;
        assert_eq!(status, 200);
    }
    assert!(
        c.node
            .terminate(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );

    // Flip one byte inside the first record of the first segment; valid records follow it,
    // so this is corruption, not a torn tail.
    let segment = c.data_dir.join("wal").join("00000000000000000001.wal");
    let mut bytes = std::fs::read(&segment).unwrap();
    assert!(bytes.len() > 200, "segment too short: {}", bytes.len());
    bytes[24] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();

    c.node.restart();
    let status = tokio::task::block_in_place(|| c.node.wait_exit(Duration::from_secs(20)))
        .expect("the coordinator started on a corrupt log");
    let log = c.node.log();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(
        log.contains("00000000000000000001.wal"),
        "names the file: {log}"
    );
    assert!(log.contains("offset"), "names the offset: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_preparing_then_recovery_aborts_at_every_participant() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Slow(60_000), AckMode::Ack).await;
    let mut c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let mut request = two_party("order-limbo", &a, &b);
    request["timeout_ms"] = json!(120_000);
    let url = format!("{}/v1/transactions", c.url());
    let http = c.node.http();
    let client = tokio::spawn(async move {
        http.post(url)
            .json(&request)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    a.wait_for("prepare", "order-limbo", 1, WAIT).await;
    b.wait_for("prepare", "order-limbo", 1, WAIT).await;
    let body = c.decision_for(&a.prepare_of("order-limbo")).await;
    assert_eq!(body["decision"], "pending", "{body}");

    c.node.kill();
    // The client never heard an outcome (its connection died with the process).
    assert!(client.await.unwrap().is_err());
    c.restart();

    a.wait_for("abort", "order-limbo", 1, WAIT).await;
    b.wait_for("abort", "order-limbo", 1, WAIT).await;
    let status = c.wait_state("order-limbo", "aborted", WAIT).await;
    assert!(
        status["reason"].as_str().unwrap().contains("restarted"),
        "{status}"
    );
    assert_eq!(a.count("commit", "order-limbo"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_survive_checkpoints_and_restarts_within_retention() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let mut c = Coordinator::start(
        dir.path(),
        "coord",
        &[&a],
        &["--checkpoint-interval-ms", "50"],
    );
    let request = |i: usize| json!({"id": format!("cp-{i}"), "participants": [{"name": "inventory", "payload": {"n": i}}]});
    for i in 0..20 {
        let (status, body) = c.submit("?wait=acked", &request(i)).await;
        assert_eq!((status, body["outcome"].as_str()), (200, Some("committed")));
    }
    // Wait (bounded) for a checkpoint covering them.
    let deadline = std::time::Instant::now() + WAIT;
    while !c.node.log().contains("checkpoint") {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint: {}",
            c.node.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.node.kill();
    c.restart();
    for i in [0, 19] {
        let (status, body) = c.submit("", &request(i)).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("committed")),
            "{body}"
        );
        // Asked about the attempt the first run began (as a participant in doubt would).
        let decision = c.decision_for(&a.prepare_of(&format!("cp-{i}"))).await;
        assert_eq!(decision["decision"], "commit", "{decision}");
    }
    assert_eq!(
        a.count("prepare", "cp-0"),
        1,
        "the retry was answered from the snapshot"
    );
}

/// `--wal-fill-ahead-bytes`: by default a killed coordinator's segment runs on in zeros filled
/// ahead of its appends; with 0 it ends at its last record. Either way the decision is there
/// after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_logs_fill_ahead_is_the_flags_and_a_killed_log_reopens_either_way() {
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
    for (extra, zeros_after) in [
        (&[][..], true),
        (&["--wal-fill-ahead-bytes", "0"][..], false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Coordinator::start(dir.path(), "coord", &[&a, &b], extra);
        let txid = format!("fill-{zeros_after}");
        let (_, answer) = c.submit("", &two_party(&txid, &a, &b)).await;
        assert_eq!(answer["outcome"], "committed");
        c.node.kill();
        let (file, records) = wal_support::last_segment_sizes(&c.data_dir);
        assert!(records > 0);
        if zeros_after {
            assert!(
                file > records,
                "{extra:?}: {file} bytes on disk, {records} of records"
            );
        } else {
            assert_eq!(file, records, "{extra:?}: plain appends leave no zeros");
        }
        c.restart();
        c.wait_state(&txid, "committed", WAIT).await;
    }
}
