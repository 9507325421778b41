//! The PostgreSQL participant's outbox over HTTP against a real PostgreSQL (docs/postgres.md,
//! "The outbox"): the seed's guarded checkout transition records its state and its next intent
//! in one local transaction or neither; op ids and event ids are idempotency keys; the listing
//! is in write order with ages; relays' reports are claims (order, idempotent repeats);
//! operators' actions are audited in the row. `postgres_outbox_recovery.rs` has the crash,
//! concurrency and retention tests; `postgres_fence.rs` the fences.
//!
//! The tests start the real `twopc` binary (the failpoints build), with tokens on. Ignored by
//! `cargo test --workspace` (they need PostgreSQL); `.ci/run` runs them with `-- --ignored`.

use chaos_tests::pg_outbox::{
    As, CHECKOUT_STATEMENTS, CHECKOUTS_SQL, PgNode, authorize, checkout, ids, intent, outbox_rows,
    query, start_pg_node,
};
use chaos_tests::pg_rig::metric;
use serde_json::{Value, json};

fn start(name: &str) -> PgNode {
    start_pg_node(name, CHECKOUT_STATEMENTS, CHECKOUTS_SQL, Vec::new(), |_| {
        Vec::new()
    })
}

/// An entry without its `age_ms` (which moves between two reads).
fn without_age(entry: &Value) -> Value {
    let mut entry = entry.clone();
    if let Some(object) = entry.as_object_mut() {
        object.remove("age_ms");
    }
    entry
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_guarded_write_records_its_state_and_intent_together_or_neither() {
    let o = start("outbox_write");
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
        "fence": {"resource": "checkout c-2", "token": 1}}),
    );
    assert_eq!(
        (status, fenced["error"].as_str()),
        (422, Some("invalid_id")),
        "a fence resource must be an id: {fenced}"
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
    let o = start("outbox_reports");
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
