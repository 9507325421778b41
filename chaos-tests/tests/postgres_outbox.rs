//! The PostgreSQL participant's outbox against a real PostgreSQL (docs/postgres.md, "The
//! outbox"): the seed's guarded checkout transition records its state and its next intent in
//! one local transaction or neither; op ids and event ids are idempotency keys; the listing is
//! in write order with ages; relays' reports are claims (order, idempotent repeats); operators'
//! actions are audited in the row; settled intents go after the retention, open ones never;
//! seq follows commit order under concurrent writers; and a participant killed after the local
//! commit, before its answer, answers the retried op id the same, with one intent.
//!
//! HTTP tests start the real `twopc` binary (the failpoints build, for the crash test), with
//! tokens on; the retention and order tests drive the backend as a library. Ignored by
//! `cargo test --workspace` (they need PostgreSQL); `.ci/run` runs them with `-- --ignored`.

use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use chaos_tests::pg_rig::{failpoint, metric};
use cluster::node::Node;
use cluster::pg_cluster::{READY_TIMEOUT, pg_participant_with};
use cluster::postgres::{PgServer, psql_url};
use participant::outbox::StateFilter;
use participant::postgres::{Action, PgConfig, PgParticipant, Statements};
use protocol::auth::Token;
use protocol::outbox::{IntentState, PgWriteRequest};
use serde_json::{Value, json};

/// The seed's checkout transition, guarded: the outbox row is written only when one row came
/// back. `touch` moves a checkout without a state check (for the ordering test).
const CHECKOUT_STATEMENTS: &str = r#"{
  "authorize": {"sql": "UPDATE checkouts SET state = $2, version = version + 1 WHERE id = $1 AND state = 'stock_reserved' AND version = $3 RETURNING version", "guards_intent": {"rows": 1}},
  "touch": {"sql": "UPDATE checkouts SET version = version + 1 WHERE id = $1 RETURNING version", "guards_intent": {"rows": 1}}
}"#;

fn seed_checkouts(url: &str) {
    psql_url(
        url,
        "CREATE TABLE checkouts (id text PRIMARY KEY, state text NOT NULL, \
         version bigint NOT NULL); \
         INSERT INTO checkouts VALUES ('c-1', 'stock_reserved', 3), ('c-2', 'stock_reserved', 1)",
    )
    .unwrap_or_else(|e| panic!("cannot seed checkouts at {url}: {e}"));
}

fn query(url: &str, sql: &str) -> String {
    psql_url(url, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn checkout(url: &str, id: &str) -> String {
    query(
        url,
        &format!("SELECT state || ':' || version FROM checkouts WHERE id = '{id}'"),
    )
}

fn outbox_rows(url: &str) -> String {
    query(
        url,
        "SELECT coalesce(string_agg(event_id || '#' || seq, ',' ORDER BY position), '') \
         FROM twopc.pg_outbox",
    )
}

fn intent(event_id: &str, aggregate: &str) -> Value {
    json!({"event_id": event_id, "aggregate": aggregate, "target": "payments",
           "type": "payment.authorize.v1", "body": {"amount": 5, "event": event_id}})
}

fn authorize(op_id: &str, checkout: &str, version: i64, next: Vec<Value>) -> Value {
    json!({"op_id": op_id, "statement": "authorize",
           "params": [checkout, "payment_pending", version], "next": next})
}

/// A participant over a fresh database with the checkouts, as a real process.
struct Outbox {
    node: Node,
    db: String,
    _dir: tempfile::TempDir,
    _server: PgServer,
}

fn start(name: &str, env: Vec<(String, String)>) -> Outbox {
    let server = PgServer::get();
    let db = server.create_database(name);
    seed_checkouts(&db);
    let dir = tempfile::tempdir().unwrap();
    let statements = dir.path().join("checkout-statements.json");
    std::fs::write(&statements, CHECKOUT_STATEMENTS).unwrap();
    let mut node = pg_participant_with(
        &failpoints_binary(),
        dir.path(),
        name,
        &db,
        &statements,
        None,
        env,
    );
    node.wait_ready(READY_TIMEOUT).unwrap();
    Outbox {
        node,
        db,
        _dir: dir,
        _server: server,
    }
}

/// Who calls: the kinds of token the routes take.
#[derive(Clone, Copy)]
enum As {
    Client,
    Relay,
    Operator,
}

impl Outbox {
    fn token(&self, who: As) -> Option<&Token> {
        self.node.tokens().map(|t| match who {
            As::Client => &t.client,
            As::Relay => &t.peer,
            As::Operator => &t.operator,
        })
    }

    fn call(&self, who: As, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.node.url());
        let token = self.token(who);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let client = cluster::auth::http_client_as(token)
                    .timeout(Duration::from_secs(30))
                    .build()
                    .unwrap();
                let request = match method {
                    "get" => client.get(&url),
                    _ => client.post(&url).json(&body.unwrap_or(Value::Null)),
                };
                match request.send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        (status, response.json().await.unwrap_or(Value::Null))
                    }
                    Err(_) => (0, Value::Null),
                }
            })
    }

    fn write(&self, body: Value) -> (u16, Value) {
        self.call(As::Client, "post", "/v1/pg/write", Some(body))
    }

    fn report(&self, event_id: &str, what: &str, body: Value) -> (u16, Value) {
        self.call(
            As::Relay,
            "post",
            &format!("/v1/outbox/{event_id}/{what}"),
            Some(body),
        )
    }

    fn operator(&self, event_id: &str, what: &str, body: Value) -> (u16, Value) {
        self.call(
            As::Operator,
            "post",
            &format!("/v1/outbox/{event_id}/{what}"),
            Some(body),
        )
    }

    fn list(&self, query: &str) -> Value {
        let (status, list) = self.call(As::Operator, "get", &format!("/v1/outbox{query}"), None);
        assert_eq!(status, 200, "{list}");
        list
    }
}

/// An entry without its `age_ms` (which moves between two reads).
fn without_age(entry: &Value) -> Value {
    let mut entry = entry.clone();
    if let Some(object) = entry.as_object_mut() {
        object.remove("age_ms");
    }
    entry
}

fn ids(list: &Value) -> Vec<String> {
    list["intents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{}#{}", e["event_id"].as_str().unwrap(), e["seq"]))
        .collect()
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_guarded_write_records_its_state_and_intent_together_or_neither() {
    let o = start("outbox_write", Vec::new());
    let first = authorize("op-1", "c-1", 3, vec![intent("evt-1", "checkout:c-1")]);
    let (status, answer) = o.write(first.clone());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"op_id": "op-1", "rows": 1, "returned": [{"version": 4}],
               "intents": [{"event_id": "evt-1", "aggregate": "checkout:c-1", "seq": 1}]})
    );
    assert_eq!(checkout(&o.db, "c-1"), "payment_pending:4");
    assert_eq!(outbox_rows(&o.db), "evt-1#1");

    // The same op id again: the first answer, nothing run again.
    assert_eq!(o.write(first), (200, answer.clone()));
    assert_eq!(checkout(&o.db, "c-1"), "payment_pending:4");

    // A stale worker's transition (version 3 is gone): no write, no intent.
    let (status, stale) = o.write(authorize(
        "op-2",
        "c-1",
        3,
        vec![intent("evt-2", "checkout:c-1")],
    ));
    assert_eq!(
        (status, stale["error"].as_str()),
        (409, Some("condition_failed")),
        "{stale}"
    );
    assert!(
        stale["message"]
            .as_str()
            .unwrap()
            .contains("affected 0 rows, expected 1")
    );
    assert_eq!(outbox_rows(&o.db), "evt-1#1");
    assert_eq!(checkout(&o.db, "c-1"), "payment_pending:4");

    // An event id another write recorded: the whole write rolls back (c-2 keeps version 1).
    let (status, reused) = o.write(authorize(
        "op-3",
        "c-2",
        1,
        vec![intent("evt-1", "checkout:c-2")],
    ));
    assert_eq!(
        (status, reused["error"].as_str()),
        (409, Some("id_conflict")),
        "{reused}"
    );
    assert!(reused["message"].as_str().unwrap().contains("evt-1"));
    assert_eq!(checkout(&o.db, "c-2"), "stock_reserved:1");
    assert_eq!(outbox_rows(&o.db), "evt-1#1");

    // The op id of another request; requests the participant cannot run.
    let (status, other) = o.write(authorize("op-1", "c-2", 1, Vec::new()));
    assert_eq!(
        (status, other["error"].as_str()),
        (409, Some("op_id_conflict")),
        "{other}"
    );
    let (status, unknown) = o.write(json!({"op_id": "op-4", "statement": "drop", "params": []}));
    assert_eq!(
        (status, unknown["error"].as_str()),
        (422, Some("invalid_payload"))
    );
    let (status, typed) = o.write(json!({"op_id": "op-5", "statement": "authorize",
        "params": ["c-2", 1, 1]}));
    assert_eq!(
        (status, typed["error"].as_str()),
        (422, Some("invalid_payload")),
        "{typed}"
    );
    let (status, fenced) = o.write(
        json!({"op_id": "op-6", "statement": "touch", "params": ["c-2"],
        "fence": {"resource": "checkout:c-2", "token": 1}}),
    );
    assert_eq!(
        status, 400,
        "the PostgreSQL backend takes no fence claim: {fenced}"
    );
    let (status, url) = o.write(authorize(
        "op-7",
        "c-2",
        1,
        vec![json!({"event_id": "e", "aggregate": "a", "target": "http://x/", "type": "t"})],
    ));
    assert_eq!(
        (status, url["error"].as_str()),
        (422, Some("invalid_id")),
        "{url}"
    );
    assert_eq!(checkout(&o.db, "c-2"), "stock_reserved:1");

    // A write without intents is a plain guarded write.
    let (status, plain) = o.write(authorize("op-8", "c-2", 1, Vec::new()));
    assert_eq!(
        (status, plain["intents"].clone()),
        (200, json!([])),
        "{plain}"
    );
    assert_eq!(
        metric(&o.node, "twopc_participant_outbox_intents_written_total"),
        1.0
    );
    assert_eq!(metric(&o.node, "twopc_participant_outbox_pending"), 1.0);
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn the_outbox_lists_in_order_and_takes_reports_as_claims() {
    let o = start("outbox_reports", Vec::new());
    let (status, a) = o.write(authorize(
        "op-a",
        "c-1",
        3,
        vec![intent("a1", "checkout:c-1"), intent("a2", "checkout:c-1")],
    ));
    assert_eq!(status, 200, "{a}");
    let (status, b) = o.write(authorize(
        "op-b",
        "c-2",
        1,
        vec![intent("b1", "checkout:c-2")],
    ));
    assert_eq!(status, 200, "{b}");

    let open = o.list("?state=open");
    assert_eq!(ids(&open), ["a1#1", "a2#2", "b1#1"]);
    assert_eq!(
        (open["pending"].clone(), open["failed"].clone()),
        (json!(3), json!(0))
    );
    assert!(open["oldest_pending_age_ms"].as_u64().is_some(), "{open}");
    assert!(open["intents"][0]["age_ms"].as_u64().is_some(), "{open}");
    assert_eq!(
        open["intents"][0]["body"],
        json!({"amount": 5, "event": "a1"})
    );
    assert_eq!(open["intents"][0]["op_id"], "op-a");
    assert_eq!(ids(&o.list("?aggregate=checkout:c-2")), ["b1#1"]);
    assert_eq!(o.list("?limit=1")["truncated"], true);
    let (status, bad) = o.call(As::Operator, "get", "/v1/outbox?state=stuck", None);
    assert_eq!(
        (status, bad["error"].as_str()),
        (400, Some("invalid_query"))
    );

    // a2 delivered while a1 is open: refused, a claim out of order.
    let (status, early) = o.report("a2", "delivered", json!({"answer": {"ok": true}}));
    assert_eq!(
        (status, early["error"].as_str()),
        (409, Some("intent_out_of_order")),
        "{early}"
    );
    // Attempts: unknown outcome keeps it pending; a permanent refusal fails it.
    let (status, tried) = o.report("a1", "attempt", json!({"error": "timeout"}));
    assert_eq!(status, 200, "{tried}");
    assert_eq!(
        (tried["state"].as_str(), tried["attempts"].as_u64()),
        (Some("pending"), Some(1))
    );
    assert_eq!(tried["last_error"], "timeout");
    let (status, failed) = o.report(
        "a1",
        "attempt",
        json!({"error": "422 no such card", "permanent": true}),
    );
    assert_eq!(
        (status, failed["state"].as_str()),
        (200, Some("failed")),
        "{failed}"
    );
    let listed = o.list("?state=open");
    assert_eq!(
        (listed["pending"].clone(), listed["failed"].clone()),
        (json!(2), json!(1))
    );
    assert_eq!(metric(&o.node, "twopc_participant_outbox_failed"), 1.0);
    assert_eq!(
        o.report("a2", "delivered", json!({})).0,
        409,
        "a failed head blocks"
    );

    // Operators: a relay may not retry; an operator must say who and why.
    assert_eq!(
        o.call(
            As::Relay,
            "post",
            "/v1/outbox/a1/retry",
            Some(json!({"operator": "ann", "reason": "card fixed"}))
        )
        .0,
        403
    );
    let (status, blank) = o.operator("a1", "retry", json!({"operator": "", "reason": ""}));
    assert_eq!(
        (status, blank["error"].as_str()),
        (422, Some("invalid_operator"))
    );
    let (status, retried) = o.operator(
        "a1",
        "retry",
        json!({"operator": "ann", "reason": "card fixed"}),
    );
    assert_eq!(
        (status, retried["state"].as_str()),
        (200, Some("pending")),
        "{retried}"
    );
    assert_eq!(retried["marks"][0]["action"], "retry");
    assert_eq!(retried["marks"][0]["reason"], "card fixed");
    assert!(retried["marks"][0]["at_ms"].as_u64().is_some(), "{retried}");
    let (status, not_failed) = o.operator("a2", "retry", json!({"operator": "ann", "reason": "r"}));
    assert_eq!(
        (status, not_failed["error"].as_str()),
        (409, Some("not_pending")),
        "retry takes failed intents only: {not_failed}"
    );

    // Delivered in order; a repeat answers the entry as it stands.
    let (status, done) = o.report("a1", "delivered", json!({"answer": {"payment": "p-1"}}));
    assert_eq!(
        (status, done["state"].as_str()),
        (200, Some("delivered")),
        "{done}"
    );
    assert_eq!(done["answer"], json!({"payment": "p-1"}));
    assert!(done["delivered_at_ms"].as_u64().is_some());
    let (status, again) = o.report("a1", "delivered", json!({"answer": {"payment": "other"}}));
    assert_eq!(
        (status, without_age(&again)),
        (200, without_age(&done)),
        "a repeat changes nothing"
    );
    let (_, late) = o.report("a1", "attempt", json!({"error": "late timeout"}));
    assert_eq!(late["attempts"], done["attempts"], "{late}");
    assert_eq!(o.report("a2", "delivered", json!({})).0, 200);

    // Marked by hand: abandoned stays abandoned.
    let (status, abandoned) = o.operator(
        "b1",
        "mark",
        json!({"operator": "bob", "reason": "refunded by hand", "state": "abandoned"}),
    );
    assert_eq!(
        (status, abandoned["state"].as_str()),
        (200, Some("abandoned")),
        "{abandoned}"
    );
    assert_eq!(abandoned["marks"][0]["action"], "abandoned");
    let mark_delivered = json!({"operator": "bob", "reason": "r", "state": "delivered"});
    let (status, refused) = o.operator("b1", "mark", mark_delivered);
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("not_pending")),
        "{refused}"
    );
    let retry = json!({"operator": "bob", "reason": "r"});
    assert_eq!(o.operator("b1", "retry", retry).0, 409);
    let (status, pending) = o.operator(
        "a2",
        "mark",
        json!({"operator": "b", "reason": "r", "state": "pending"}),
    );
    assert_eq!(
        (status, pending["error"].as_str()),
        (422, Some("invalid_payload"))
    );

    let (status, missing) = o.report("nope", "delivered", json!({}));
    assert_eq!(
        (status, missing["error"].as_str()),
        (404, Some("not_found"))
    );
    let (status, one) = o.call(As::Operator, "get", "/v1/outbox/b1", None);
    assert_eq!((status, one["state"].as_str()), (200, Some("abandoned")));
    let empty = o.list("?state=open");
    assert_eq!(ids(&empty), Vec::<String>::new());
    assert_eq!(
        (
            empty["pending"].clone(),
            empty["oldest_pending_age_ms"].clone()
        ),
        (json!(0), Value::Null)
    );
    assert_eq!(
        ids(&o.list("")),
        ["a1#1", "a2#2", "b1#1"],
        "settled intents stay listed"
    );
    assert_eq!(
        metric(&o.node, "twopc_participant_outbox_delivered_total"),
        2.0
    );
    // The marks are in the row, for whoever reads the database.
    assert!(
        query(
            &o.db,
            "SELECT marks::text FROM twopc.pg_outbox WHERE event_id = 'b1'"
        )
        .contains("refunded by hand")
    );
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn killed_after_the_local_commit_a_retried_op_id_answers_the_same_with_one_intent() {
    let mut o = start(
        "outbox_crash",
        failpoint("participant::pg_after_outbox_write_committed"),
    );
    let request = authorize("op-1", "c-1", 3, vec![intent("evt-1", "checkout:c-1")]);
    let (status, _) = o.write(request.clone());
    assert_eq!(status, 0, "the participant answered instead of crashing");
    assert!(
        o.node.wait_exit(Duration::from_secs(60)).is_some(),
        "{}",
        o.node.log()
    );
    // Committed before the crash: the state and its intent, together.
    assert_eq!(checkout(&o.db, "c-1"), "payment_pending:4");
    assert_eq!(outbox_rows(&o.db), "evt-1#1");
    o.node.set_env(Vec::new());
    o.node.restart();
    o.node.wait_ready(READY_TIMEOUT).unwrap();
    let (status, answer) = o.write(request);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"op_id": "op-1", "rows": 1, "returned": [{"version": 4}],
               "intents": [{"event_id": "evt-1", "aggregate": "checkout:c-1", "seq": 1}]})
    );
    assert_eq!(checkout(&o.db, "c-1"), "payment_pending:4");
    assert_eq!(outbox_rows(&o.db), "evt-1#1", "one intent, not two");
    assert_eq!(ids(&o.list("?state=open")), ["evt-1#1"]);
}

/// The backend as a library over a fresh database, with `configure` applied.
async fn library(
    name: &str,
    configure: impl FnOnce(&mut PgConfig),
) -> (PgParticipant<Statements>, String, PgServer) {
    let server = PgServer::get();
    let db = server.create_database(name);
    seed_checkouts(&db);
    let mut config = PgConfig::new(&db, name);
    configure(&mut config);
    let specs = Statements::parse_file(CHECKOUT_STATEMENTS.as_bytes()).unwrap();
    let (client, connection) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let statements = Statements::check(&client, specs).await.unwrap();
    drop(client);
    connection.abort();
    (
        PgParticipant::start(config, statements).await.unwrap(),
        db,
        server,
    )
}

fn touch(op_id: &str, checkout: &str, next: Vec<Value>) -> PgWriteRequest {
    serde_json::from_value(
        json!({"op_id": op_id, "statement": "touch", "params": [checkout],
        "next": next}),
    )
    .unwrap()
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn concurrent_writers_of_one_aggregate_get_seqs_in_commit_order() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (p, _db, _server) = library("outbox_order", |_| {}).await;
        let writers: Vec<_> = (0..16)
            .map(|n| {
                let p = p.clone();
                tokio::spawn(async move {
                    p.write(touch(
                        &format!("op-{n}"),
                        "c-1",
                        vec![intent(&format!("e{n}"), "checkout:c-1")],
                    ))
                    .await
                })
            })
            .collect();
        let mut pairs = Vec::new();
        for writer in writers {
            let answer = writer.await.unwrap().unwrap();
            // The row's new version is its commit order (the row lock serialises the updates).
            pairs.push((
                answer.returned[0]["version"].as_i64().unwrap(),
                answer.intents[0].seq,
            ));
        }
        pairs.sort();
        let seqs: Vec<u64> = pairs.iter().map(|(_, seq)| *seq).collect();
        assert_eq!(seqs, (1..=16).collect::<Vec<u64>>(), "{pairs:?}");
        let listed = p
            .outbox(StateFilter::Open, Some("checkout:c-1"), 100)
            .await
            .unwrap();
        let listed: Vec<u64> = listed.intents.iter().map(|e| e.seq).collect();
        assert_eq!(
            listed,
            (1..=16).collect::<Vec<u64>>(),
            "the listing is in write order"
        );
    });
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn settled_intents_go_after_the_retention_and_open_ones_never() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (p, db, _server) =
            library("outbox_retention", |config| config.outbox_retention_ms = 1).await;
        for (n, checkout) in ["c-1", "c-1", "c-2", "c-2"].iter().enumerate() {
            p.write(touch(
                &format!("op-{n}"),
                checkout,
                vec![intent(&format!("e{n}"), &format!("checkout:{checkout}"))],
            ))
            .await
            .unwrap();
        }
        p.outbox_act("e0", Action::Delivered { answer: json!(1) })
            .await
            .unwrap();
        p.outbox_act(
            "e2",
            Action::Mark {
                operator: "ann".into(),
                reason: "by hand".into(),
                state: IntentState::Abandoned,
            },
        )
        .await
        .unwrap();
        p.outbox_act(
            "e3",
            Action::Attempt {
                error: "no".into(),
                permanent: true,
            },
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(p.prune_outbox().await.unwrap(), 2);
        let left = p.outbox(StateFilter::All, None, 100).await.unwrap();
        let left: Vec<(&str, IntentState)> = left
            .intents
            .iter()
            .map(|e| (e.event_id.as_str(), e.state))
            .collect();
        assert_eq!(
            left,
            [("e1", IntentState::Pending), ("e3", IntentState::Failed)]
        );
        // The seq counter survives the pruning: the next intent of c-1 is 3, not a reused 1.
        let next = p
            .write(touch("op-9", "c-1", vec![intent("e9", "checkout:c-1")]))
            .await
            .unwrap();
        assert_eq!(next.intents[0].seq, 3);
        assert_eq!(
            psql_url(&db, "SELECT count(*) FROM twopc.pg_ops").unwrap(),
            "1",
            "op ids older than the retention go too"
        );
    });
}
