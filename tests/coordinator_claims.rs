//! A request is a claim, not evidence (issue 24), against a real `twopc coordinator` process:
//! a resolve naming a live attempt's gtid under another id, or a gtid this run never gave out,
//! is refused and the committed attempt is never answered `abort`; a decision query naming a
//! made-up run is answered `unknown` and stops nothing, also after a restart.

mod coordinator_support;

use std::time::Duration;

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

fn resolve(decision: &str, gtid: &str) -> Value {
    json!({"decision": decision, "gtid": gtid, "operator": "ana", "reason": "test"})
}

/// The decision a participant asking about `gtid` under `txid` hears (as a peer).
async fn decision(c: &Coordinator, txid: &str, gtid: &str) -> String {
    let (_, incarnation, position) = gtid_parts(gtid);
    let (status, body) = c
        .get_as(
            protocol::auth::Kind::Peer,
            &format!(
                "/v1/transactions/{txid}/decision?gtid={gtid}&incarnation={incarnation}&epoch=1\
                 &position={position}"
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["decision"].as_str().unwrap_or_default().to_string()
}

fn gtid_parts(gtid: &str) -> (String, String, u64) {
    let mut parts = gtid.rsplitn(3, ':');
    let position = parts.next().unwrap().parse().unwrap();
    let incarnation = parts.next().unwrap().to_string();
    (parts.next().unwrap().to_string(), incarnation, position)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolve_under_another_id_or_of_a_gtid_not_given_out_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    // The setup: commits to one participant do not arrive, so order-1 stays live.
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Down).await;
    let c = Coordinator::start(
        dir.path(),
        "coord",
        &[&a, &b],
        &["--retry-base-ms", "100", "--retry-max-ms", "200"],
    );
    let (status, body) = c.submit("", &two_party("order-1", &a, &b)).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("committed")));
    let gtid = body["gtid"].as_str().unwrap().to_string();
    c.wait_state("order-1", "committing", WAIT).await;

    let (status, refused) = post(
        &c,
        "/v1/transactions/ghost/resolve",
        resolve("abort", &gtid),
    )
    .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("attempt_id_mismatch")),
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("order-1"),
        "the refusal names the attempt's own id: {refused}"
    );
    let (coordinator, incarnation, position) = gtid_parts(&gtid);
    let future = format!("{coordinator}:{incarnation}:{}", position + 5);
    let (status, refused) = post(
        &c,
        "/v1/transactions/ghost/resolve",
        resolve("abort", &future),
    )
    .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("attempt_not_issued")),
        "{refused}"
    );
    let (status, refused) = post(
        &c,
        "/v1/transactions/ghost/resolve",
        resolve("abort", "other-coordinator:00000000000000aa:1"),
    )
    .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("foreign_attempt")),
        "{refused}"
    );
    let (_, audit) = c.get("/v1/audit").await;
    assert_eq!(
        audit["audit"],
        json!([]),
        "refusals change nothing: {audit}"
    );

    // A participant in doubt hears commit, under the attempt's id, and nothing under another.
    assert_eq!(decision(&c, "order-1", &gtid).await, "commit");
    assert_eq!(decision(&c, "ghost", &gtid).await, "unknown");
    b.set_ack(AckMode::Ack);
    c.wait_state("order-1", "committed", WAIT).await;
    assert_eq!(decision(&c, "order-1", &gtid).await, "commit");
    assert_eq!(decision(&c, "ghost", &gtid).await, "unknown");
    let (status, refused) = post(
        &c,
        "/v1/transactions/ghost/resolve",
        resolve("abort", &gtid),
    )
    .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("attempt_id_mismatch")),
        "after the end too (the outcome index knows the attempt): {refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_about_a_made_up_run_is_unknown_and_stops_nothing_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
    let mut c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let (status, body) = c.submit("", &two_party("before", &a, &b)).await;
    assert_eq!(status, 200, "{body}");
    let (coordinator, _, _) = gtid_parts(body["gtid"].as_str().unwrap());
    // The query, with any peer's token.
    let (status, answer) = c
        .get_as(
            protocol::auth::Kind::Peer,
            &format!(
                "/v1/transactions/x/decision?gtid={coordinator}:ffffffffffffffff:1\
                 &incarnation=ffffffffffffffff&epoch=1&position=1"
            ),
        )
        .await;
    assert_eq!(
        (status, answer["decision"].as_str()),
        (200, Some("unknown")),
        "{answer}"
    );
    let (status, body) = c.submit("", &two_party("after-the-query", &a, &b)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("committed")),
        "{body}"
    );
    let (status, ready) = c.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    c.restart();
    let (status, body) = c.submit("", &two_party("after-the-restart", &a, &b)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("committed")),
        "{body}"
    );
}
