//! The PostgreSQL participant's sessions and round trips against a real PostgreSQL
//! (docs/postgres.md, "Sessions and round trips"): phase two has sessions that waiting prepares
//! cannot take, decisions arriving together share round trips (sent one by one, or in a
//! batched phase message), `null` binds for every parameter type, and a gid prepared in
//! another database of the server is not taken for ours.
//!
//! The participant runs in this process as a library, so a test can size its pools and read
//! its counters. The server comes from `TWOPC_POSTGRES_URL` or a throwaway cluster
//! (cluster::postgres); without either these tests fail, never pass. They are ignored by
//! `cargo test --workspace`; `.ci/run` starts PostgreSQL and runs them with `-- --ignored`.

use std::time::Duration;

use cluster::pg_cluster::{TRANSFER_STATEMENTS, seed_accounts};
use cluster::postgres::{PgServer, psql_url};
use participant::postgres::{PgConfig, PgParticipant, PgRequestError, Statements};
use protocol::{DecisionRequest, PrepareRequest, Vote};
use serde_json::{Value, json};

const COORDINATOR_ID: &str = "c-test";
const INCARNATION: &str = "000000000000000a";

fn gtid(position: u64) -> String {
    format!("{COORDINATOR_ID}:{INCARNATION}:{position}")
}

fn prepare(position: u64, ops: Value) -> PrepareRequest {
    serde_json::from_value(
        json!({"txid": format!("t{position}"), "gtid": gtid(position),
        "coordinator_id": COORDINATOR_ID, "epoch": 2, "incarnation": INCARNATION,
        "position": position, "payload": {"ops": ops}}),
    )
    .unwrap()
}

fn decision(position: u64) -> DecisionRequest {
    serde_json::from_value(
        json!({"txid": format!("t{position}"), "gtid": gtid(position),
        "coordinator_id": COORDINATOR_ID, "epoch": 2, "incarnation": INCARNATION}),
    )
    .unwrap()
}

fn debit(account: &str) -> Value {
    json!({"statement": "debit", "params": [account, 10]})
}

fn query(url: &str, sql: &str) -> String {
    psql_url(url, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn balance(url: &str, id: &str) -> i64 {
    query(
        url,
        &format!("SELECT balance FROM accounts WHERE id = '{id}'"),
    )
    .parse()
    .unwrap()
}

fn prepared_here(url: &str) -> String {
    query(
        url,
        "SELECT string_agg(gid, ',') FROM pg_prepared_xacts WHERE database = current_database()",
    )
}

/// The participant's name for `url`'s database: gids are the server's, not a database's, and
/// the tests share one server in CI (`TWOPC_POSTGRES_URL`) and run at once, so each test's
/// participant needs a name (and so gids) of its own.
fn bank_name(url: &str) -> String {
    format!("bank-{}", url.rsplit('/').next().unwrap_or("db"))
}

/// A participant named for `url`'s database over it, serving `statements` (a statements file's
/// JSON).
async fn participant(
    url: &str,
    statements: &str,
    configure: impl FnOnce(&mut PgConfig),
) -> PgParticipant<Statements> {
    let mut config = PgConfig::new(url, bank_name(url));
    configure(&mut config);
    let specs = Statements::parse_file(statements.as_bytes()).unwrap();
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let statements = Statements::check(&client, specs).await.unwrap();
    drop(client);
    connection.abort();
    PgParticipant::start(config, statements).await.unwrap()
}

/// Sessions of `url`'s database waiting for a lock now.
async fn waiting_on_locks(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Every prepare session is held by a prepare waiting on a row that a prepared transaction
/// locks; the `COMMIT PREPARED` that frees the row still finds a session, and both waiting
/// prepares then vote yes. With one pool for both phases the commit waited for a session that
/// only the prepares' lock timeout (20 s here) would free, and they voted no.
#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_commit_finds_a_session_while_every_prepare_session_waits_on_its_locks() {
    let server = PgServer::get();
    let db = server.create_database("starve");
    seed_accounts(&db, 2, 100);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let bank = participant(&db, TRANSFER_STATEMENTS, |config| {
            config.connections = 2;
            config.decision_connections = 1;
            config.lock_wait_max_ms = 20_000;
        })
        .await;
        // 1 holds both rows' locks, prepared (two statements sent together).
        assert_eq!(
            bank.prepare(prepare(1, json!([debit("a0"), debit("a1")])))
                .await
                .unwrap(),
            Vote::Yes
        );
        // 2 and 3 take both prepare sessions and wait for those locks.
        let waiting: Vec<_> = [(2, "a0"), (3, "a1")]
            .into_iter()
            .map(|(position, account)| {
                let bank = bank.clone();
                tokio::spawn(async move {
                    bank.prepare(prepare(position, json!([debit(account)])))
                        .await
                })
            })
            .collect();
        let (watcher, connection) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut polls = 0;
        while waiting_on_locks(&watcher).await < 2 {
            polls += 1;
            assert!(polls < 1_200, "the two prepares never waited on the locks");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The commit that frees the rows: on a phase-two session.
        bank.commit(decision(1)).await.unwrap();
        for prepared in waiting {
            assert_eq!(prepared.await.unwrap().unwrap(), Vote::Yes);
        }
        for position in [2, 3] {
            bank.commit(decision(position)).await.unwrap();
        }
    });
    assert_eq!((balance(&db, "a0"), balance(&db, "a1")), (80, 80));
    assert_eq!(prepared_here(&db), "");
}

fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
}

/// 40 decisions sent at once to a participant with one phase-two session: they go out several
/// `COMMIT PREPARED` per round trip (the participant's counters say how many), and each is
/// answered and applied once.
#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn decisions_arriving_together_share_round_trips() {
    const N: u64 = 40;
    let server = PgServer::get();
    let db = server.create_database("burst");
    seed_accounts(&db, N as u32, 100);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (round_trips, statements) = runtime.block_on(async {
        let bank = participant(&db, TRANSFER_STATEMENTS, |config| {
            config.connections = 8;
            config.decision_connections = 1;
        })
        .await;
        let prepares: Vec<_> = (0..N)
            .map(|n| {
                let bank = bank.clone();
                tokio::spawn(async move {
                    bank.prepare(prepare(n + 1, json!([debit(&format!("a{n}"))])))
                        .await
                })
            })
            .collect();
        for prepared in prepares {
            assert_eq!(prepared.await.unwrap().unwrap(), Vote::Yes);
        }
        let before = bank.metrics_text().await;
        let commits: Vec<_> = (0..N)
            .map(|n| {
                let bank = bank.clone();
                tokio::spawn(async move { bank.commit(decision(n + 1)).await })
            })
            .collect();
        for committed in commits {
            committed.await.unwrap().unwrap();
        }
        // A resend of one of them is still acked (already committed, by its outcome row).
        bank.commit(decision(1)).await.unwrap();
        let after = bank.metrics_text().await;
        let delta = |name: &str| counter(&after, name) - counter(&before, name);
        (
            delta("twopc_pg_phase_two_round_trips_total"),
            delta("twopc_pg_phase_two_statements_total"),
        )
    });
    eprintln!(
        "{statements} COMMIT PREPARED in {round_trips} round trips ({:.1} per round trip)",
        statements as f64 / round_trips as f64
    );
    assert_eq!(statements, N + 1);
    assert!(
        round_trips < statements,
        "no round trip carried more than one decision: {round_trips} for {statements}"
    );
    let total: i64 = query(&db, "SELECT sum(balance) FROM accounts")
        .parse()
        .unwrap();
    assert_eq!(total, (N as i64) * 100 - (N as i64) * 10);
    assert_eq!(prepared_here(&db), "");
}

/// `null` binds as SQL NULL for a parameter of every type a payload can fill.
#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn null_binds_for_every_parameter_type() {
    let server = PgServer::get();
    let db = server.create_database("nulls");
    query(
        &db,
        "CREATE TABLE typed (id text PRIMARY KEY, b boolean, i2 smallint, i4 integer, \
         i8 bigint, f4 real, f8 double precision, t text, v varchar(10), c char(3), n name)",
    );
    let statements = r#"{"put": {"sql":
        "INSERT INTO typed VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        "expect_rows": 1}}"#;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let bank = participant(&db, statements, |_| {}).await;
        let rows = [
            json!([
                "nulls", null, null, null, null, null, null, null, null, null, null
            ]),
            json!(["values", true, 1, 2, 3, 1.5, 2.5, "t", "v", "c", "n"]),
        ];
        for (n, params) in rows.into_iter().enumerate() {
            let position = n as u64 + 1;
            let vote = bank
                .prepare(prepare(
                    position,
                    json!([{"statement": "put", "params": params}]),
                ))
                .await
                .unwrap();
            assert_eq!(vote, Vote::Yes, "{params}");
            bank.commit(decision(position)).await.unwrap();
        }
    });
    assert_eq!(
        query(
            &db,
            "SELECT id FROM typed WHERE b IS NULL AND i2 IS NULL AND i4 IS NULL AND i8 IS NULL \
             AND f4 IS NULL AND f8 IS NULL AND t IS NULL AND v IS NULL AND c IS NULL \
             AND n IS NULL"
        ),
        "nulls"
    );
    assert_eq!(
        query(
            &db,
            "SELECT id FROM typed WHERE b AND i2 = 1 AND i4 = 2 AND i8 = 3 AND f4 = 1.5 \
             AND f8 = 2.5 AND t = 't' AND v = 'v' AND c = 'c' AND n = 'n'"
        ),
        "values"
    );
}

/// A gid of ours prepared in another database of the same server (gids are unique per server):
/// the prepare votes no instead of taking it for its own earlier yes, a commit is 409
/// `not_prepared` (never an ack), an abort leaves a tombstone, and the other database's
/// transaction is left alone.
#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_gid_prepared_in_another_database_is_not_ours() {
    let server = PgServer::get();
    let ours = server.create_database("ours");
    let theirs = server.create_database("theirs");
    seed_accounts(&ours, 2, 100);
    let gid = format!("twopc:{}:{}+t1", bank_name(&ours), gtid(1));
    query(
        &theirs,
        &format!(
            "CREATE TABLE t (x int); BEGIN; INSERT INTO t VALUES (1); PREPARE TRANSACTION '{gid}'"
        ),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let bank = participant(&ours, TRANSFER_STATEMENTS, |_| {}).await;
        match bank.prepare(prepare(1, json!([debit("a0")]))).await {
            Ok(Vote::No { reason }) => {
                assert!(reason.contains("already in use"), "{reason}")
            }
            other => panic!("expected a no vote, got {other:?}"),
        }
        assert!(bank.in_doubt().await.unwrap().prepared.is_empty());
        match bank.commit(decision(1)).await {
            Err(PgRequestError::Rejected(rejection)) => {
                assert!(
                    rejection.to_string().contains("never prepared"),
                    "{rejection}"
                )
            }
            other => panic!("expected not_prepared, got {other:?}"),
        }
        bank.abort(decision(1)).await.unwrap();
        // The tombstone: a late prepare of it votes no.
        assert!(matches!(
            bank.prepare(prepare(1, json!([debit("a0")]))).await,
            Ok(Vote::No { .. })
        ));
    });
    assert_eq!(balance(&ours, "a0"), 100);
    assert_eq!(prepared_here(&ours), "");
    assert_eq!(prepared_here(&theirs), gid);
    query(&theirs, &format!("ROLLBACK PREPARED '{gid}'"));
}

/// The batched phase messages over HTTP, as the library serves them for the KV store: the
/// participant offers them, a batch of prepares is answered one line per item, and a batch of
/// decisions goes to PostgreSQL several `COMMIT PREPARED` per round trip.
#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn batched_phase_messages_are_served_and_their_commits_share_round_trips() {
    const N: u64 = 20;
    let server = PgServer::get();
    let db = server.create_database("batches");
    seed_accounts(&db, N as u32, 100);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (round_trips, statements) = runtime.block_on(async {
        let bank = participant(&db, TRANSFER_STATEMENTS, |config| {
            config.decision_connections = 1;
        })
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(axum::serve(listener, participant::finish(bank.router())).into_future());
        let http = reqwest::Client::new();
        let offered: Value = http
            .get(format!("{base}/2pc/capabilities"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(
            offered["batch"]["max_items"].as_u64().unwrap() >= N,
            "{offered}"
        );
        let lines = |text: String| -> Vec<Value> {
            let mut lines: Vec<Value> = text
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                .collect();
            lines.sort_by_key(|line| line["index"].as_u64());
            lines
        };
        let prepares: Vec<PrepareRequest> = (0..N)
            .map(|n| prepare(n + 1, json!([debit(&format!("a{n}"))])))
            .collect();
        let answered = http
            .post(format!("{base}/2pc/batch/prepare"))
            .json(&json!({"prepares": prepares}))
            .send()
            .await
            .unwrap();
        assert_eq!(answered.status(), 200);
        let votes = lines(answered.text().await.unwrap());
        assert_eq!(votes.len(), N as usize);
        for (n, line) in votes.iter().enumerate() {
            assert_eq!(line["index"], n, "{line}");
            assert_eq!(line["gtid"], gtid(n as u64 + 1), "{line}");
            assert_eq!(
                (&line["status"], &line["body"]),
                (&json!(200), &json!({"vote": "yes"}))
            );
        }
        let before = bank.metrics_text().await;
        let decisions: Vec<Value> = (0..N)
            .map(|n| json!({"decision": "commit", "request": decision(n + 1)}))
            .collect();
        let answered = http
            .post(format!("{base}/2pc/batch/decide"))
            .json(&json!({"decisions": decisions}))
            .send()
            .await
            .unwrap();
        assert_eq!(answered.status(), 200);
        let acks = lines(answered.text().await.unwrap());
        assert_eq!(acks.len(), N as usize);
        assert!(
            acks.iter()
                .all(|line| line["status"] == 200 && line["body"] == json!({"ack": true})),
            "{acks:?}"
        );
        let after = bank.metrics_text().await;
        assert_eq!(counter(&after, "twopc_pg_batches_total"), 2);
        assert_eq!(counter(&after, "twopc_pg_batched_items_total"), 2 * N);
        let delta = |name: &str| counter(&after, name) - counter(&before, name);
        (
            delta("twopc_pg_phase_two_round_trips_total"),
            delta("twopc_pg_phase_two_statements_total"),
        )
    });
    eprintln!("a batch of {statements} commits went out in {round_trips} round trips");
    assert_eq!(statements, N);
    assert!(round_trips < statements, "{round_trips} round trips");
    let total: i64 = query(&db, "SELECT sum(balance) FROM accounts")
        .parse()
        .unwrap();
    assert_eq!(total, (N as i64) * 90);
    assert_eq!(prepared_here(&db), "");
}
