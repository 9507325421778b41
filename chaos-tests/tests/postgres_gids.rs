//! The PostgreSQL participant's two gid forms (docs/postgres.md, "The gid"): a txid too long to
//! fit in the gid is carried by an intent row instead, and what an earlier version left (gids
//! without the txid, prepared, with their intent rows, and outcome rows under those gids) still
//! decides the answers after an upgrade. Ignored by `cargo test --workspace`; `.ci/run` starts
//! PostgreSQL and runs them with `-- --ignored`.

use std::time::Duration;

use chaos_tests::binary::plain_binary;
use chaos_tests::pg_rig::{get, post, prepared_gids};
use cluster::pg_cluster::{READY_TIMEOUT, pg_participant, seed_accounts};
use cluster::postgres::{PgServer, psql_url};
use serde_json::{Value, json};

const COORDINATOR_ID: &str = "c-old";
const INCARNATION: &str = "00000000000000a1";

fn gtid(coordinator: &str, position: u64) -> String {
    format!("{coordinator}:{INCARNATION}:{position}")
}

/// The gid without the txid: every gid before the txid went into it, and the outcome row's key.
fn short_gid(coordinator: &str, position: u64) -> String {
    format!("twopc:bank:{}", gtid(coordinator, position))
}

/// A prepare (with a payload) or a decision (without) of attempt `position` of `txid`.
fn body(coordinator: &str, position: u64, txid: &str, payload: Option<Value>) -> Value {
    let mut body = json!({"txid": txid, "gtid": gtid(coordinator, position),
           "coordinator_id": coordinator, "epoch": 2, "incarnation": INCARNATION});
    if let Some(payload) = payload {
        body["position"] = json!(position);
        body["payload"] = payload;
    }
    body
}

fn sql(db: &str, query: &str) -> String {
    psql_url(db, query).unwrap_or_else(|e| panic!("{query}: {e}"))
}

fn debit() -> Value {
    json!({"ops": [{"statement": "debit", "params": ["a0", 10]}]})
}

/// A commit and its resend both acked; the debit applied once and nothing left prepared.
fn committed_once(tokens: Option<&cluster::auth::TokenSet>, url: &str, db: &str, commit: &Value) {
    for round in 0..2 {
        let (status, ack) = post(tokens, &format!("{url}/2pc/commit"), commit);
        assert_eq!(
            (status, &ack),
            (200, &json!({"ack": true})),
            "{round}: {ack}"
        );
    }
    assert!(prepared_gids(db).is_empty());
    assert_eq!(
        sql(db, "SELECT balance FROM accounts WHERE id = 'a0'"),
        "90"
    );
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_txid_too_long_for_the_gid_goes_in_an_intent_row() {
    let server = PgServer::get();
    let db = server.create_database("longtxid");
    seed_accounts(&db, 1, 100);
    let dir = tempfile::tempdir().unwrap();
    let mut node = pg_participant(&plain_binary(), dir.path(), "bank", &db, None, Vec::new());
    node.wait_ready(READY_TIMEOUT).unwrap();
    let (url, tokens) = (node.url(), node.tokens());
    // The longest ids: together they do not fit in PostgreSQL's 199 bytes.
    let txid = "t".repeat(protocol::limits::TXID_LEN_MAX);
    let c = "c".repeat(protocol::limits::NAME_LEN_MAX);
    let c = c.as_str();

    let (status, vote) = post(
        tokens,
        &format!("{url}/2pc/prepare"),
        &body(c, 1, &txid, Some(debit())),
    );
    assert_eq!((status, &vote), (200, &json!({"vote": "yes"})), "{vote}");
    assert_eq!(prepared_gids(&db), [short_gid(c, 1)]);
    assert_eq!(
        sql(
            &db,
            &format!(
                "SELECT txid FROM twopc.pg_intents WHERE gid = '{}'",
                short_gid(c, 1)
            )
        ),
        txid
    );
    let (_, listed) = get(tokens, &format!("{url}/v1/prepared"));
    assert_eq!(listed["prepared"][0]["txid"], txid.as_str(), "{listed}");

    // Restarted, the same attempt is still named by its intent row, and commits once.
    node.restart();
    node.wait_ready(READY_TIMEOUT).unwrap();
    let (url, tokens) = (node.url(), node.tokens());
    let (_, listed) = get(tokens, &format!("{url}/v1/prepared"));
    assert_eq!(listed["prepared"][0]["txid"], txid.as_str(), "{listed}");
    committed_once(tokens, &url, &db, &body(c, 1, &txid, None));
    assert_eq!(sql(&db, "SELECT count(*) FROM twopc.pg_intents"), "0");
    node.terminate(Duration::from_secs(10));
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn what_an_earlier_version_left_still_decides_the_answers() {
    let server = PgServer::get();
    let db = server.create_database("upgrade");
    seed_accounts(&db, 1, 100);
    let dir = tempfile::tempdir().unwrap();
    let mut node = pg_participant(&plain_binary(), dir.path(), "bank", &db, None, Vec::new());
    node.wait_ready(READY_TIMEOUT).unwrap();
    node.terminate(Duration::from_secs(10));

    // What an earlier version left, written by hand the way it wrote them (gids without the
    // txid): attempt 1 prepared (its outcome row inside the transaction, its intent row beside
    // it), attempt 2 committed, attempt 3 aborted before it was prepared (a tombstone).
    sql(
        &db,
        &format!(
            "INSERT INTO twopc.pg_intents (gid, txid, coordinator_id, epoch, incarnation, \
             position) VALUES ('{}', 't1', '{COORDINATOR_ID}', 2, '{INCARNATION}', 1)",
            short_gid(COORDINATOR_ID, 1)
        ),
    );
    sql(
        &db,
        &format!(
            "BEGIN; UPDATE accounts SET balance = balance - 10 WHERE id = 'a0'; \
             INSERT INTO twopc.pg_outcomes (gid, outcome) VALUES ('{gid}', 'committed'); \
             DELETE FROM twopc.pg_intents WHERE gid = '{gid}'; PREPARE TRANSACTION '{gid}'",
            gid = short_gid(COORDINATOR_ID, 1)
        ),
    );
    sql(
        &db,
        &format!(
            "INSERT INTO twopc.pg_outcomes (gid, outcome) VALUES ('{}', 'committed'), \
             ('{}', 'aborted')",
            short_gid(COORDINATOR_ID, 2),
            short_gid(COORDINATOR_ID, 3)
        ),
    );
    node.restart();
    node.wait_ready(READY_TIMEOUT).unwrap();
    let (url, tokens) = (node.url(), node.tokens());

    // The prepared one is listed in doubt from its intent row, and its repeat is yes.
    let (status, listed) = get(tokens, &format!("{url}/v1/prepared"));
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["prepared"][0]["gid"],
        short_gid(COORDINATOR_ID, 1),
        "{listed}"
    );
    assert_eq!(listed["prepared"][0]["txid"], "t1", "{listed}");
    assert_eq!(listed["unattributed"], json!([]), "{listed}");
    let (status, vote) = post(
        tokens,
        &format!("{url}/2pc/prepare"),
        &body(COORDINATOR_ID, 1, "t1", Some(debit())),
    );
    assert_eq!((status, &vote), (200, &json!({"vote": "yes"})), "{vote}");

    // The tombstone: a late prepare votes no and prepares nothing under either gid.
    let (status, vote) = post(
        tokens,
        &format!("{url}/2pc/prepare"),
        &body(COORDINATOR_ID, 3, "t3", Some(debit())),
    );
    assert_eq!(status, 200, "{vote}");
    assert_eq!(vote["vote"], "no", "{vote}");
    assert_eq!(prepared_gids(&db), [short_gid(COORDINATOR_ID, 1)]);
    let (status, ack) = post(
        tokens,
        &format!("{url}/2pc/abort"),
        &body(COORDINATOR_ID, 3, "t3", None),
    );
    assert_eq!(status, 200, "{ack}");

    // The committed one: a late prepare is yes without running the work again, a commit's
    // resend is acked, an abort is a contradiction.
    let (status, vote) = post(
        tokens,
        &format!("{url}/2pc/prepare"),
        &body(COORDINATOR_ID, 2, "t2", Some(debit())),
    );
    assert_eq!((status, &vote), (200, &json!({"vote": "yes"})), "{vote}");
    assert_eq!(prepared_gids(&db), [short_gid(COORDINATOR_ID, 1)]);
    let (status, ack) = post(
        tokens,
        &format!("{url}/2pc/commit"),
        &body(COORDINATOR_ID, 2, "t2", None),
    );
    assert_eq!((status, &ack), (200, &json!({"ack": true})), "{ack}");
    let (status, refused) = post(
        tokens,
        &format!("{url}/2pc/abort"),
        &body(COORDINATOR_ID, 2, "t2", None),
    );
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"], "id_conflict", "{refused}");

    // The prepared one commits under the gid it was prepared under; its resend is acked from
    // the outcome row it wrote.
    committed_once(tokens, &url, &db, &body(COORDINATOR_ID, 1, "t1", None));
    assert_eq!(
        sql(&db, "SELECT count(*) FROM twopc.pg_outcomes"),
        "3",
        "one outcome row per attempt, under the gid without the txid"
    );
    node.terminate(Duration::from_secs(10));
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_decision_naming_another_txid_is_refused_and_touches_nothing() {
    let server = PgServer::get();
    let db = server.create_database("othertxid");
    seed_accounts(&db, 1, 100);
    let dir = tempfile::tempdir().unwrap();
    let mut node = pg_participant(&plain_binary(), dir.path(), "bank", &db, None, Vec::new());
    node.wait_ready(READY_TIMEOUT).unwrap();
    let (url, tokens) = (node.url(), node.tokens());
    let c = COORDINATOR_ID;
    let (status, vote) = post(
        tokens,
        &format!("{url}/2pc/prepare"),
        &body(c, 1, "t1", Some(debit())),
    );
    assert_eq!((status, &vote), (200, &json!({"vote": "yes"})), "{vote}");

    // The right gtid with another txid: a claim about another transaction. Refused at once
    // (an abort's tombstone would otherwise wait on the prepared transaction's outcome row),
    // and the prepared transaction is left as it is.
    for decision in ["abort", "commit"] {
        let started = std::time::Instant::now();
        let (status, refused) = post(
            tokens,
            &format!("{url}/2pc/{decision}"),
            &body(c, 1, "t-other", None),
        );
        assert_eq!(status, 409, "{decision}: {refused}");
        assert_eq!(refused["error"], "id_conflict", "{decision}: {refused}");
        assert!(
            refused["message"].as_str().unwrap().contains("+t1"),
            "{refused}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{decision} waited"
        );
        assert_eq!(prepared_gids(&db), [format!("{}+t1", short_gid(c, 1))]);
    }
    assert_eq!(sql(&db, "SELECT count(*) FROM twopc.pg_outcomes"), "0");
    committed_once(tokens, &url, &db, &body(c, 1, "t1", None));
    node.terminate(Duration::from_secs(10));
}
