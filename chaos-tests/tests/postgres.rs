//! The PostgreSQL participant against a real PostgreSQL (docs/postgres.md): the protocol over
//! HTTP, bad input, the setup mistakes people make, and a full prepared-transaction table.
//! Crash tests are in `postgres_crash.rs`. The server comes from `TWOPC_POSTGRES_URL` or a
//! throwaway cluster (cluster::postgres); without either these tests fail, never pass.
//! They are ignored by `cargo test --workspace`; `.ci/run` starts PostgreSQL and runs them with
//! `-- --ignored`.

use std::time::Duration;

use chaos_tests::binary::plain_binary;
use chaos_tests::pg_rig::{get, post, prepared_gids, total_balance};
use cluster::pg_cluster::{READY_TIMEOUT, pg_participant, seed_accounts};
use cluster::postgres::{PgServer, psql_url};
use serde_json::{Value, json};

const COORDINATOR_ID: &str = "c-test";
const INCARNATION: &str = "000000000000000a";

fn gtid(position: u64) -> String {
    format!("{COORDINATOR_ID}:{INCARNATION}:{position}")
}

fn prepare_body(position: u64, ops: Value) -> Value {
    json!({"txid": format!("t{position}"), "gtid": gtid(position),
           "coordinator_id": COORDINATOR_ID, "epoch": 2, "incarnation": INCARNATION,
           "position": position, "payload": {"ops": ops}})
}

fn decision_body(position: u64, epoch: u64) -> Value {
    json!({"txid": format!("t{position}"), "gtid": gtid(position),
           "coordinator_id": COORDINATOR_ID, "epoch": epoch, "incarnation": INCARNATION})
}

fn balance(url: &str, id: &str) -> i64 {
    psql_url(
        url,
        &format!("SELECT balance FROM accounts WHERE id = '{id}'"),
    )
    .unwrap()
    .parse()
    .unwrap()
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn the_protocol_maps_onto_prepare_transaction() {
    let server = PgServer::get();
    let db = server.create_database("proto");
    seed_accounts(&db, 2, 100);
    let dir = tempfile::tempdir().unwrap();
    let mut node = pg_participant(&plain_binary(), dir.path(), "bank", &db, None, Vec::new());
    node.wait_ready(READY_TIMEOUT).unwrap();
    let url = node.url();

    // Prepare: yes, and the transaction is prepared in PostgreSQL with the documented gid,
    // holding its row lock; nothing is visible before the commit.
    let debit = json!([{"statement": "debit", "params": ["a0", 10]}]);
    let (status, vote) = post(
        node.tokens(),
        &format!("{url}/2pc/prepare"),
        &prepare_body(1, debit.clone()),
    );
    assert_eq!((status, &vote), (200, &json!({"vote": "yes"})));
    assert_eq!(prepared_gids(&db), [format!("twopc:bank:{}+t1", gtid(1))]);
    assert_eq!(
        psql_url(&db, "SELECT count(*) FROM twopc.pg_intents").unwrap(),
        "0",
        "the gid carries the txid: no intent row"
    );
    assert_eq!(balance(&db, "a0"), 100);
    let locked = psql_url(
        &db,
        "SELECT 1 FROM accounts WHERE id = 'a0' FOR UPDATE NOWAIT",
    );
    assert!(locked.is_err_and(|e| e.contains("could not obtain lock")));
    // A repeated prepare of the same attempt is the same yes, not a second transaction.
    let (_, again) = post(
        node.tokens(),
        &format!("{url}/2pc/prepare"),
        &prepare_body(1, debit.clone()),
    );
    assert_eq!(again, json!({"vote": "yes"}));
    // /v1/prepared lists it with its age and what a decision query needs.
    let (_, listed) = get(node.tokens(), &format!("{url}/v1/prepared"));
    let entry = &listed["prepared"][0];
    assert_eq!(entry["gid"], format!("twopc:bank:{}+t1", gtid(1)));
    assert_eq!(entry["txid"], "t1");
    assert_eq!(entry["epoch"], 2);
    assert!(entry["age_ms"].is_u64());
    let (_, metrics) = get_text(&format!("{url}/metrics"));
    assert!(metrics.contains("twopc_pg_prepared 1"), "{metrics}");

    // Commit: applied once; a resend is acked without applying again.
    for _ in 0..2 {
        let (status, ack) = post(
            node.tokens(),
            &format!("{url}/2pc/commit"),
            &decision_body(1, 2),
        );
        assert_eq!((status, ack), (200, json!({"ack": true})));
    }
    assert_eq!(balance(&db, "a0"), 90);
    assert!(prepared_gids(&db).is_empty());

    // A commit for an attempt never prepared is 409, never an ack.
    let (status, body) = post(
        node.tokens(),
        &format!("{url}/2pc/commit"),
        &decision_body(2, 2),
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "not_prepared");

    // An abort before the prepare leaves a tombstone: the late prepare votes no.
    let (status, _) = post(
        node.tokens(),
        &format!("{url}/2pc/abort"),
        &decision_body(3, 2),
    );
    assert_eq!(status, 200);
    let (_, late) = post(
        node.tokens(),
        &format!("{url}/2pc/prepare"),
        &prepare_body(3, debit.clone()),
    );
    assert_eq!(late["vote"], "no", "{late}");
    assert!(
        late["reason"].as_str().unwrap().contains("aborted"),
        "{late}"
    );

    // Prepare then abort: rolled back, twice acked; the rollback leaves a tombstone too, so a
    // prepare of it arriving late (a retry the abort overtook) votes no and prepares nothing.
    let (_, vote) = post(
        node.tokens(),
        &format!("{url}/2pc/prepare"),
        &prepare_body(4, debit.clone()),
    );
    assert_eq!(vote["vote"], "yes");
    for round in 0..2 {
        let (status, _) = post(
            node.tokens(),
            &format!("{url}/2pc/abort"),
            &decision_body(4, 2),
        );
        assert_eq!(status, 200);
        let (_, late) = post(
            node.tokens(),
            &format!("{url}/2pc/prepare"),
            &prepare_body(4, debit.clone()),
        );
        assert_eq!(late["vote"], "no", "round {round}: {late}");
        assert!(prepared_gids(&db).is_empty(), "round {round}");
    }
    assert_eq!(
        psql_url(
            &db,
            "SELECT count(*) FROM twopc.pg_intents WHERE gid LIKE '%:4'"
        )
        .unwrap(),
        "0"
    );
    assert_eq!(balance(&db, "a0"), 90);

    // Votes no with the database's reason: a row count other than expect_rows, a constraint.
    let (_, no) = post(
        node.tokens(),
        &format!("{url}/2pc/prepare"),
        &prepare_body(5, json!([{"statement": "debit", "params": ["a0", 1000]}])),
    );
    assert_eq!(no["vote"], "no");
    assert!(
        no["reason"]
            .as_str()
            .unwrap()
            .contains("affected 0 rows, expected 1"),
        "{no}"
    );
    let (_, no) = post(
        node.tokens(),
        &format!("{url}/2pc/prepare"),
        &prepare_body(
            6,
            json!([{"statement": "set_balance", "params": ["a1", -5]}]),
        ),
    );
    assert_eq!(no["vote"], "no");
    assert!(
        no["reason"]
            .as_str()
            .unwrap()
            .contains("violates check constraint"),
        "{no}"
    );
    // A deferred constraint is checked by PREPARE TRANSACTION itself: no, with its message.
    psql_url(
        &db,
        "ALTER TABLE accounts ADD CONSTRAINT balance_once UNIQUE (balance) \
         DEFERRABLE INITIALLY DEFERRED",
    )
    .unwrap();
    let (_, no) = post(
        node.tokens(),
        &format!("{url}/2pc/prepare"),
        &prepare_body(
            7,
            json!([{"statement": "set_balance", "params": ["a1", 90]}]),
        ),
    );
    assert_eq!(no["vote"], "no");
    let reason = no["reason"].as_str().unwrap();
    assert!(reason.contains("duplicate key"), "{no}");
    assert!(
        !reason.contains("aborted"),
        "the service's own constraint: {no}"
    );
    psql_url(&db, "ALTER TABLE accounts DROP CONSTRAINT balance_once").unwrap();
    assert!(prepared_gids(&db).is_empty());

    // A stale epoch is fenced.
    let (status, body) = post(
        node.tokens(),
        &format!("{url}/2pc/commit"),
        &decision_body(1, 1),
    );
    assert_eq!((status, body["error"].as_str()), (409, Some("stale_epoch")));
    assert_eq!(total_balance(&db), 190);
    node.terminate(Duration::from_secs(10));
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn bad_input_is_refused_before_any_sql() {
    let server = PgServer::get();
    let db = server.create_database("badinput");
    seed_accounts(&db, 1, 100);
    let dir = tempfile::tempdir().unwrap();
    let mut node = pg_participant(&plain_binary(), dir.path(), "bank", &db, None, Vec::new());
    node.wait_ready(READY_TIMEOUT).unwrap();
    let url = format!("{}/2pc/prepare", node.url());
    let cases = [
        (
            json!([{"statement": "drop_all", "params": []}]),
            "unknown statement \"drop_all\"",
        ),
        (
            json!([{"statement": "debit", "params": ["a0"]}]),
            "takes 2 parameters, got 1",
        ),
        (
            json!([{"statement": "debit", "params": ["a0", "ten"]}]),
            "parameter $2 must be a int8",
        ),
        (
            json!([{"statement": "debit", "params": [7, 1]}]),
            "parameter $1 must be a text",
        ),
        (json!([{"sql": "DROP TABLE accounts"}]), "malformed"),
    ];
    for (position, (ops, expected)) in (10..).zip(cases) {
        let (status, body) = post(node.tokens(), &url, &prepare_body(position, ops.clone()));
        assert_eq!(status, 422, "{ops}: {body}");
        assert_eq!(body["error"], "invalid_payload");
        assert!(
            body["message"].as_str().unwrap().contains(expected)
                || (expected == "malformed"
                    && body["message"].as_str().unwrap().contains("unknown field")),
            "{ops}: {body}"
        );
    }
    // A gtid that would make a gid over PostgreSQL's limit is refused at the door.
    let mut long = prepare_body(20, json!([{"statement": "debit", "params": ["a0", 1]}]));
    long["gtid"] = json!(format!("{}:{INCARNATION}:1", "c".repeat(190)));
    let (status, body) = post(node.tokens(), &url, &long);
    assert!((400..500).contains(&status), "{status} {body}");
    assert!(
        body["message"].as_str().unwrap().contains("limit"),
        "{body}"
    );
    assert!(prepared_gids(&db).is_empty());
    assert_eq!(total_balance(&db), 100);
    node.terminate(Duration::from_secs(10));
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn setup_mistakes_stop_the_start_with_the_reason() {
    let binary = plain_binary();
    let dir = tempfile::tempdir().unwrap();
    // max_prepared_transactions = 0: refuse, name the setting and the restart it needs.
    let disabled = PgServer::throwaway(&[("max_prepared_transactions", "0")])
        .unwrap_or_else(|e| panic!("{}\n({e})", cluster::postgres::INSTALL_HINT));
    let db = disabled.create_database("disabled");
    seed_accounts(&db, 1, 1);
    let mut node = pg_participant(&binary, dir.path(), "off", &db, None, Vec::new());
    let status = node
        .wait_exit(READY_TIMEOUT)
        .expect("should refuse to start");
    assert_eq!(status.code(), Some(2));
    let log = node.log();
    assert!(log.contains("max_prepared_transactions is 0"), "{log}");
    assert!(log.contains("restart PostgreSQL"), "{log}");

    let server = PgServer::get();
    // Wrong credentials (an unknown role) and an unreachable server.
    let bad_role = server
        .url("postgres")
        .replace("postgres://postgres", "postgres://no_such_role");
    let mut node = pg_participant(&binary, dir.path(), "role", &bad_role, None, Vec::new());
    assert_eq!(
        node.wait_exit(READY_TIMEOUT).and_then(|s| s.code()),
        Some(2)
    );
    let log = node.log();
    assert!(
        log.contains("cannot connect to PostgreSQL") && log.contains("no_such_role"),
        "{log}"
    );
    let nowhere = "postgres://postgres@127.0.0.1:1/postgres";
    let mut node = pg_participant(&binary, dir.path(), "nowhere", nowhere, None, Vec::new());
    assert_eq!(
        node.wait_exit(READY_TIMEOUT).and_then(|s| s.code()),
        Some(2)
    );
    assert!(
        node.log()
            .contains("cannot connect to PostgreSQL at postgres://postgres@127.0.0.1:1")
    );

    // A statement whose table is missing.
    let empty = server.create_database("notable");
    let mut node = pg_participant(&binary, dir.path(), "notable", &empty, None, Vec::new());
    assert_eq!(
        node.wait_exit(READY_TIMEOUT).and_then(|s| s.code()),
        Some(2)
    );
    let log = node.log();
    assert!(
        log.contains("relation \"accounts\" does not exist"),
        "{log}"
    );
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_full_prepared_transaction_table_votes_no_with_the_reason() {
    let server = PgServer::throwaway(&[("max_prepared_transactions", "2")])
        .unwrap_or_else(|e| panic!("{}\n({e})", cluster::postgres::INSTALL_HINT));
    let db = server.create_database("full");
    seed_accounts(&db, 3, 100);
    let dir = tempfile::tempdir().unwrap();
    let mut node = pg_participant(&plain_binary(), dir.path(), "bank", &db, None, Vec::new());
    node.wait_ready(READY_TIMEOUT).unwrap();
    let url = format!("{}/2pc/prepare", node.url());
    for (position, account) in [(1, "a0"), (2, "a1")] {
        let ops = json!([{"statement": "debit", "params": [account, 1]}]);
        assert_eq!(
            post(node.tokens(), &url, &prepare_body(position, ops)).1["vote"],
            "yes"
        );
    }
    let ops = json!([{"statement": "debit", "params": ["a2", 1]}]);
    let (_, vote) = post(node.tokens(), &url, &prepare_body(3, ops));
    assert_eq!(vote["vote"], "no", "{vote}");
    let reason = vote["reason"].as_str().unwrap();
    assert!(reason.starts_with("prepared_transactions_full"), "{reason}");
    assert!(reason.contains("max_prepared_transactions"), "{reason}");
    assert_eq!(prepared_gids(&db).len(), 2);
    // The third never held anything: its row is free.
    assert!(
        psql_url(
            &db,
            "SELECT 1 FROM accounts WHERE id = 'a2' FOR UPDATE NOWAIT"
        )
        .is_ok()
    );
    node.terminate(Duration::from_secs(10));
}

fn get_text(url: &str) -> (u16, String) {
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let path = &url[url.find(&format!("{addr}")).unwrap() + format!("{addr}").len()..];
    cluster::node::http_get(addr, path).unwrap_or((0, String::new()))
}

/// A repeated prepare of a gid prepared here is yes at once, in the same run and after a
/// restart: the participant looks at `pg_prepared_xacts` only for gids it may hold prepared
/// (seeded from there at start), and a blind first-prepare insert meeting the prepared
/// transaction's uncommitted rows would wait for its decision and answer 503 instead.
#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_repeated_prepare_of_a_prepared_gid_is_yes_in_the_same_run_and_after_a_restart() {
    let server = PgServer::get();
    let db = server.create_database("repeat");
    seed_accounts(&db, 1, 100);
    let dir = tempfile::tempdir().unwrap();
    let mut node = pg_participant(&plain_binary(), dir.path(), "bank", &db, None, Vec::new());
    node.wait_ready(READY_TIMEOUT).unwrap();
    let debit = json!([{"statement": "debit", "params": ["a0", 10]}]);
    let prepare = |node: &cluster::node::Node| {
        post(
            node.tokens(),
            &format!("{}/2pc/prepare", node.url()),
            &prepare_body(1, debit.clone()),
        )
    };
    let yes = (200, json!({"vote": "yes"}));
    assert_eq!(prepare(&node), yes);
    assert_eq!(prepare(&node), yes, "repeated in the same run");
    node.restart();
    node.wait_ready(READY_TIMEOUT).unwrap();
    assert_eq!(prepare(&node), yes, "repeated after a restart");
    assert_eq!(prepared_gids(&db), [format!("twopc:bank:{}+t1", gtid(1))]);
    assert_eq!(balance(&db, "a0"), 100);

    let (status, ack) = post(
        node.tokens(),
        &format!("{}/2pc/commit", node.url()),
        &decision_body(1, 2),
    );
    assert_eq!((status, ack), (200, json!({"ack": true})));
    // Committed: a late repeat is yes again, applies nothing and leaves no intent row.
    assert_eq!(prepare(&node), yes, "repeated after the commit");
    assert_eq!(balance(&db, "a0"), 90);
    assert!(prepared_gids(&db).is_empty());
    assert_eq!(
        psql_url(&db, "SELECT count(*) FROM twopc.pg_intents").unwrap(),
        "0"
    );
    node.terminate(Duration::from_secs(10));
}

/// A prepare cancelled half-way (its HTTP request dropped while its UPDATE waits for a row
/// lock) must not leave its open transaction on a pooled session: the next prepare on that
/// session would run inside it and prepare the cancelled work under its own gid.
#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_cancelled_prepare_leaves_no_open_transaction_behind() {
    use participant::postgres::{PgConfig, PgParticipant, Statements};
    use protocol::PrepareRequest;
    let server = PgServer::get();
    let db = server.create_database("cancel");
    seed_accounts(&db, 2, 100);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut config = PgConfig::new(db.clone(), "bank");
        config.connections = 1;
        let specs =
            Statements::parse_file(cluster::pg_cluster::TRANSFER_STATEMENTS.as_bytes()).unwrap();
        let (client, connection) = tokio_postgres_connect(&db).await;
        let handle = tokio::spawn(connection);
        let statements = Statements::check(&client, specs).await.unwrap();
        drop(client);
        handle.abort();
        let participant = PgParticipant::start(config, statements).await.unwrap();
        let request = |position: u64, account: &str| -> PrepareRequest {
            serde_json::from_value(prepare_body(
                position,
                json!([{"statement": "debit", "params": [account, 10]}]),
            ))
            .unwrap()
        };
        // 1 holds a0's row lock, prepared.
        assert_eq!(
            participant.prepare(request(1, "a0")).await.unwrap(),
            protocol::Vote::Yes
        );
        // 2 waits for that lock and is cancelled while it waits.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            participant.prepare(request(2, "a0")),
        )
        .await;
        assert!(
            cancelled.is_err(),
            "the second prepare should still be waiting: {cancelled:?}"
        );
        // 3, on the pool's only session slot, prepares alone and commits alone.
        assert_eq!(
            participant.prepare(request(3, "a1")).await.unwrap(),
            protocol::Vote::Yes
        );
        let decision = |position: u64| -> protocol::DecisionRequest {
            serde_json::from_value(decision_body(position, 2)).unwrap()
        };
        participant.commit(decision(3)).await.unwrap();
        participant.abort(decision(1)).await.unwrap();
    });
    assert_eq!(
        balance(&db, "a0"),
        100,
        "the cancelled debit of a0 was applied"
    );
    assert_eq!(balance(&db, "a1"), 90);
    assert!(prepared_gids(&db).is_empty());
}

async fn tokio_postgres_connect(
    url: &str,
) -> (
    tokio_postgres::Client,
    tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
) {
    tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap()
}
