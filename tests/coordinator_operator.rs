//! Operator actions against a real `twopc coordinator` process: retry now, resolve from the
//! evidence (and every refusal), the audit trail across a restart.

mod coordinator_support;

use std::time::{Duration, Instant};

use coordinator_support::{AckMode, Coordinator, TestParticipant, VoteMode, two_party};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn post(c: &Coordinator, path: &str, body: Value) -> (u16, Value) {
    let response = c
        .node
        .http()
        .post(format!("{}{path}", c.url()))
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Who the audit names: the operator token's holder when the coordinator checks tokens (the
/// token wins over the body's `operator`), else the body's name.
fn operator_name(c: &Coordinator) -> &'static str {
    cluster::auth::audited_operator(c.node.tokens(), "ana")
}

async fn metric(c: &Coordinator, name: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", c.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Waits until `txid`'s delivery to `participant` has failed once (its `last_error` is set),
/// which is when the coordinator arms its backoff.
async fn wait_for_failed_delivery(c: &Coordinator, txid: &str, participant: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = c.get(&format!("/v1/transactions/{txid}")).await;
        let failed = body["participants"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == participant && !p["last_error"].is_null());
        if status == 200 && failed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{txid}'s delivery to {participant} has not failed after {WAIT:?}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn resolve(decision: &str) -> Value {
    json!({"decision": decision, "operator": "ana", "reason": "test"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_now_delivers_at_once_instead_of_at_the_backoff_cap() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Down).await;
    // Backoff from 30 s: without an operator, the next delivery is far outside this test.
    let c = Coordinator::start(
        dir.path(),
        "coord",
        &[&a, &b],
        &["--retry-base-ms", "30000", "--retry-max-ms", "60000"],
    );
    let (status, body) = c.submit("", &two_party("order-1", &a, &b)).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("committed")));
    b.wait_for("commit", "order-1", 1, WAIT).await;
    c.wait_state("order-1", "committing", WAIT).await;
    // The participant answered, but the coordinator may not have heard yet: a delivery still
    // in flight is not one waiting for its backoff, and "retry now" rightly leaves it alone.
    wait_for_failed_delivery(&c, "order-1", "payments").await;

    // The participant is back; the operator says so.
    b.set_ack(AckMode::Ack);
    let asked = Instant::now();
    let (status, answer) = post(
        &c,
        "/v1/participants/payments/retry",
        json!({"operator": "ana", "reason": "payments is back"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["retried"], 1, "{answer}");
    c.wait_state("order-1", "committed", WAIT).await;
    assert!(
        asked.elapsed() < Duration::from_secs(25),
        "delivered by the retry, not by the 30 s backoff"
    );
    assert_eq!(b.count("commit", "order-1"), 2);
    assert_eq!(
        metric(&c, "twopc_coordinator_operator_retries_total").await,
        1
    );
    assert_eq!(
        metric(&c, "twopc_coordinator_operator_actions_total").await,
        1
    );

    // Nothing pending any more: a retry of the ended transaction is refused, an unknown one
    // and an unknown participant are not found; each is a JSON error naming the problem.
    let (status, body) = post(&c, "/v1/transactions/order-1/retry", json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_pending")),
        "{body}"
    );
    let (status, body) = post(&c, "/v1/transactions/nobody/retry", json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = post(&c, "/v1/participants/mailer/retry", json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = post(
        &c,
        "/v1/participants/payments/retry",
        json!({"operator": "ana", "why": "typo"}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("malformed_json")),
        "{body}"
    );

    let (_, audit) = c.get("/v1/audit").await;
    assert_eq!(audit["audit"][0]["action"], "retry_participant", "{audit}");
    assert_eq!(audit["audit"][0]["participant"], "payments", "{audit}");
    assert_eq!(audit["audit"][0]["reason"], "payments is back", "{audit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_is_refused_for_what_the_coordinator_decides_itself() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
    let c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let (_, body) = c.submit("", &two_party("order-1", &a, &b)).await;
    assert_eq!(body["outcome"], "committed", "{body}");
    c.wait_state("order-1", "committed", WAIT).await;

    let (status, body) = post(&c, "/v1/transactions/order-1/resolve", resolve("abort")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("contradicts_evidence")),
        "{body}"
    );
    assert!(
        body["evidence"]["coordinator"] == "decided commit",
        "the refusal carries the evidence: {body}"
    );
    assert_eq!(body["evidence"]["participants"][0]["state"], "committed");
    let (status, body) = post(&c, "/v1/transactions/order-1/resolve", resolve("commit")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("not_in_doubt")),
        "{body}"
    );

    let (status, body) = post(&c, "/v1/transactions/nobody/resolve", resolve("abort")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = post(
        &c,
        "/v1/transactions/order-1/resolve",
        json!({"decision": "abort", "operator": "", "reason": "x"}),
    )
    .await;
    // An empty name is refused with or without a token: docs/openapi.json states one rule for
    // the body's claim. With a token, a valid claim is then replaced by the holder's name.
    assert_eq!(
        (status, body["error"].as_str()),
        (422, Some("invalid_operator")),
        "{body}"
    );
    let (status, body) = post(
        &c,
        "/v1/transactions/order-1/resolve",
        json!({"decision": "maybe", "operator": "ana", "reason": "x"}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("malformed_json")),
        "{body}"
    );
    let (_, audit) = c.get("/v1/audit").await;
    assert_eq!(
        audit["audit"],
        json!([]),
        "refusals change nothing: {audit}"
    );
}

/// An attempt of a run this log does not hold (what a restored backup leaves): the
/// coordinator answers `unknown`, so only the participants' evidence can settle it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_the_log_lost_is_resolved_from_the_evidence_and_audited_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
    let mut c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    // A gtid of this coordinator's id, under a run its log never held.
    let (_, ready) = c.submit("", &two_party("warm-up", &a, &b)).await;
    let own = ready["gtid"].as_str().unwrap().to_string();
    let coordinator_id = own.split(':').next().unwrap();
    let lost = format!("{coordinator_id}:00000000000000aa:7");
    let query = format!(
        "/v1/transactions/ghost/decision?gtid={lost}&incarnation=00000000000000aa&epoch=1&position=7"
    );

    // inventory aborted it, payments holds it prepared: commit contradicts, abort is allowed.
    a.pretend("ghost", &lost, "aborted");
    b.pretend("ghost", &lost, "prepared");
    let (status, body) = post(&c, "/v1/transactions/ghost/resolve", resolve("commit")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("contradicts_evidence")),
        "{body}"
    );
    assert!(
        body["evidence"]["coordinator"]
            .as_str()
            .unwrap()
            .starts_with("unknown"),
        "{body}"
    );
    // One participant forgot how it ended: it may have committed, so abort is not proven safe.
    a.pretend("ghost", &lost, "forgotten");
    let (status, body) = post(&c, "/v1/transactions/ghost/resolve", resolve("abort")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("insufficient_evidence")),
        "{body}"
    );
    // Both prepared: commit needs the attempt's participants named, since the log lost them.
    a.pretend("ghost", &lost, "prepared");
    let (status, body) = post(&c, "/v1/transactions/ghost/resolve", resolve("commit")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("insufficient_evidence")),
        "{body}"
    );
    // An operator's list alone proves nothing: it may leave out one that never prepared.
    let named = json!({"decision": "commit", "operator": "ana", "reason": "both prepared",
                       "participants": ["inventory", "payments"]});
    let (status, body) = post(&c, "/v1/transactions/ghost/resolve", named.clone()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("insufficient_evidence")),
        "{body}"
    );
    // A participant vouching for another list than the operator's: refused as contradicting.
    a.pretend_vouching(
        "ghost",
        &lost,
        "prepared",
        &["inventory", "payments", "shipping"],
    );
    let (status, body) = post(&c, "/v1/transactions/ghost/resolve", named.clone()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("contradicts_evidence")),
        "{body}"
    );
    // The participants vouch for the list their prepares named: that is evidence.
    a.pretend_vouching("ghost", &lost, "prepared", &["inventory", "payments"]);
    b.pretend_vouching("ghost", &lost, "prepared", &["inventory", "payments"]);
    let (status, body) = post(&c, "/v1/transactions/ghost/resolve", named).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["gtid"].as_str(), body["audit_seq"].as_u64()),
        (Some(lost.as_str()), Some(1))
    );

    // Participants in doubt hear the resolution; a second one is refused; all of it survives
    // a restart.
    let (_, said) = c.get_as(protocol::auth::Kind::Peer, &query).await;
    assert_eq!(said["decision"], "commit", "{said}");
    let (status, body) = post(&c, "/v1/transactions/ghost/resolve", resolve("abort")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("contradicts_evidence")),
        "{body}"
    );
    c.restart();
    let (_, said) = c.get_as(protocol::auth::Kind::Peer, &query).await;
    assert_eq!(said["decision"], "commit", "after a restart: {said}");
    let (_, status) = c.get("/v1/transactions/ghost").await;
    assert_eq!(status["outcome"], "committed", "{status}");
    let (_, audit) = c.get("/v1/audit").await;
    let entry = &audit["audit"][0];
    assert_eq!(
        (
            entry["seq"].as_u64(),
            entry["action"].as_str(),
            entry["operator"].as_str()
        ),
        (Some(1), Some("resolve"), Some(operator_name(&c))),
        "{audit}"
    );
    assert_eq!(
        entry["evidence"]["participants"][1]["state"], "prepared",
        "what was known is in the record: {audit}"
    );
    // A participant that cannot be asked leaves the evidence short.
    b.pretend(
        "ghost-2",
        &format!("{coordinator_id}:00000000000000aa:8"),
        "prepared",
    );
    a.set_ack(AckMode::Down);
    let (status, body) = post(&c, "/v1/transactions/ghost-2/resolve", resolve("abort")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("insufficient_evidence")),
        "{body}"
    );
}
