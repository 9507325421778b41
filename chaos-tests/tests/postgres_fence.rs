//! Fenced local writes at the PostgreSQL participant against a real PostgreSQL (docs/postgres.md,
//! "Fences"; docs/leases.md): a write carrying a lease token below its resource's highest is
//! refused 409 `stale_token` with that highest, runs no statement and records no intent, and
//! stays refused under its op id; equal tokens write; a paused worker whose version still
//! matches is refused once the next holder wrote; concurrent writers with random tokens leave
//! effects in non-decreasing token order, exactly the answered ones; with a fence key only the
//! lease service's proof writes; an operator's reset is compare-and-set and audited.
//!
//! HTTP tests start the real `twopc` binary (the failpoints build), with tokens on; the
//! concurrency test drives the backend as a library. Ignored by `cargo test --workspace` (they
//! need PostgreSQL); `.ci/run` runs them with `-- --ignored`.

use chaos_tests::pg_outbox::{As, PgNode, intent, outbox_rows, pg_library, query, start_pg_node};
use participant::postgres::WriteError;
use protocol::fence_proof::FenceKeys;
use protocol::outbox::PgWriteRequest;
use serde_json::{Value, json};

/// `advance` moves a checkout from the version the worker read (its guard); `append` adds a
/// token to a journal, so the order in which writes committed is visible.
const STATEMENTS: &str = r#"{
  "advance": {"sql": "UPDATE checkouts SET state = $2, version = version + 1 WHERE id = $1 AND version = $3 RETURNING version", "guards_intent": {"rows": 1}},
  "append": {"sql": "UPDATE journal SET tokens = array_append(tokens, $2) WHERE id = $1"}
}"#;

const SEED_SQL: &str = "CREATE TABLE checkouts (id text PRIMARY KEY, state text NOT NULL, \
    version bigint NOT NULL); \
    INSERT INTO checkouts VALUES ('c-1', 'stock_reserved', 1), ('c-2', 'stock_reserved', 1); \
    CREATE TABLE journal (id text PRIMARY KEY, tokens bigint[] NOT NULL DEFAULT '{}'); \
    INSERT INTO journal VALUES ('j', '{}')";

const KEY: &str = "0123456789abcdef0123456789abcdef";

fn start(name: &str, files: impl FnOnce(&std::path::Path) -> Vec<String>) -> PgNode {
    start_pg_node(name, STATEMENTS, SEED_SQL, Vec::new(), files)
}

fn state(db: &str, id: &str) -> String {
    query(
        db,
        &format!("SELECT state || ':' || version FROM checkouts WHERE id = '{id}'"),
    )
}

/// A fenced `advance` of `checkout` from `version` to `to`, with one intent named `event`.
fn advance(op_id: &str, token: u64, checkout: &str, version: i64, to: &str, event: &str) -> Value {
    json!({"op_id": op_id, "statement": "advance", "params": [checkout, to, version],
           "fence": {"resource": format!("checkout:{checkout}"), "token": token},
           "next": [intent(event, &format!("checkout:{checkout}"))]})
}

fn error(answer: &(u16, Value)) -> (u16, Option<&str>) {
    (answer.0, answer.1["error"].as_str())
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_lower_token_is_refused_stale_and_writes_nothing_even_after_a_reset() {
    let o = start("fence_stale", |_| Vec::new());
    let seven = o.write(advance("op-7", 7, "c-1", 1, "payment_pending", "e7"));
    assert_eq!(seven.0, 200, "{}", seven.1);
    assert_eq!(state(&o.db, "c-1"), "payment_pending:2");

    // Token 5 after 7, with the version it expects: refused, no statement effect, no intent.
    let five = advance("op-5", 5, "c-1", 2, "cancelled", "e5");
    let stale = o.write(five.clone());
    assert_eq!(error(&stale), (409, Some("stale_token")), "{}", stale.1);
    assert_eq!(
        (stale.1["resource"].as_str(), stale.1["highest"].as_u64()),
        (Some("checkout:c-1"), Some(7)),
        "{}",
        stale.1
    );
    assert_eq!(state(&o.db, "c-1"), "payment_pending:2");
    assert_eq!(outbox_rows(&o.db), "e7#1");

    // The same token again: the current holder writing on.
    let again = o.write(advance("op-7b", 7, "c-1", 2, "payment_authorized", "e7b"));
    assert_eq!(again.0, 200, "{}", again.1);
    assert_eq!(state(&o.db, "c-1"), "payment_authorized:3");
    assert_eq!(outbox_rows(&o.db), "e7#1,e7b#2");

    let (status, fence) = o.call(As::Operator, "get", "/v1/fences/checkout:c-1", None);
    assert_eq!(
        (status, fence["highest"].as_u64()),
        (200, Some(7)),
        "{fence}"
    );
    assert!(fence["written_at_ms"].as_u64().is_some(), "{fence}");
    assert_eq!(
        o.call(As::Operator, "get", "/v1/fences/checkout:c-9", None)
            .0,
        404
    );

    // An operator lowers the highest token: compare-and-set on what they read, audited.
    let reset = |from: u64, to: u64| {
        o.call(
            As::Operator,
            "post",
            "/v1/fences/checkout:c-1/reset",
            Some(json!({"from": from, "to": to, "operator": "ann", "reason": "lease store lost"})),
        )
    };
    assert_eq!(error(&reset(6, 4)), (409, Some("fence_changed")));
    assert_eq!(error(&reset(7, 7)), (422, Some("invalid_reset")));
    assert_eq!(
        o.call(
            As::Client,
            "post",
            "/v1/fences/checkout:c-1/reset",
            Some(json!({"from": 7, "to": 4, "operator": "x", "reason": "y"}))
        )
        .0,
        403,
        "a client may not reset"
    );
    let done = reset(7, 4);
    assert_eq!(done.0, 200, "{}", done.1);
    assert_eq!(
        (done.1["from"].as_u64(), done.1["to"].as_u64()),
        (Some(7), Some(4))
    );
    let (_, fence) = o.call(As::Operator, "get", "/v1/fences/checkout:c-1", None);
    assert_eq!(fence["highest"].as_u64(), Some(4), "{fence}");
    assert_eq!(fence["resets"][0]["reason"], "lease store lost", "{fence}");
    assert!(fence["resets"][0]["at_ms"].as_u64().is_some(), "{fence}");

    // The refused op id stays refused (a late copy of it must never apply); a new op id with
    // token 5 now writes.
    let repeat = o.write(five);
    assert_eq!(error(&repeat), (409, Some("stale_token")), "{}", repeat.1);
    assert_eq!(
        repeat.1["highest"].as_u64(),
        Some(7),
        "the first refusal, unchanged"
    );
    assert_eq!(state(&o.db, "c-1"), "payment_authorized:3");
    let fresh = o.write(advance("op-5b", 5, "c-1", 3, "confirmed", "e5b"));
    assert_eq!(fresh.0, 200, "{}", fresh.1);
    assert_eq!(outbox_rows(&o.db), "e7#1,e7b#2,e5b#3");

    // Without a key, a jump far above every token accepted here is refused; nothing written,
    // and the op id stays free.
    let jump = advance("op-j", 2_000_000_000, "c-2", 1, "x", "ej");
    assert_eq!(error(&o.write(jump)), (409, Some("token_too_high")));
    assert_eq!(state(&o.db, "c-2"), "stock_reserved:1");
    assert_eq!(
        query(
            &o.db,
            "SELECT count(*) FROM twopc.pg_ops WHERE op_id = 'op-j'"
        ),
        "0"
    );
    assert_eq!(
        query(
            &o.db,
            "SELECT string_agg(resource || '=' || highest, ',' ORDER BY resource) \
             FROM twopc.pg_fences"
        ),
        "checkout:c-1=5"
    );
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn a_paused_worker_whose_version_still_matches_cannot_move_the_workflow() {
    let o = start("fence_paused", |_| Vec::new());
    // Worker A holds the lease with token 1 and moves the checkout.
    let a1 = o.write(advance("a-1", 1, "c-2", 1, "payment_pending", "a1"));
    assert_eq!(a1.0, 200, "{}", a1.1);
    // A pauses past its TTL. B is granted token 2 and writes under the same resource, leaving
    // the checkout row itself untouched: its version is still the one A read.
    let b1 = o.write(
        json!({"op_id": "b-1", "statement": "append", "params": ["j", 2],
        "fence": {"resource": "checkout:c-2", "token": 2}}),
    );
    assert_eq!(b1.0, 200, "{}", b1.1);
    // A resumes: its guard would hold, its token does not.
    let late = o.write(advance("a-2", 1, "c-2", 2, "payment_authorized", "a2"));
    assert_eq!(error(&late), (409, Some("stale_token")), "{}", late.1);
    assert_eq!(late.1["highest"].as_u64(), Some(2));
    assert_eq!(state(&o.db, "c-2"), "payment_pending:2", "state unchanged");
    assert_eq!(
        outbox_rows(&o.db),
        "a1#1",
        "no intent from the paused worker"
    );
    // B moves it on.
    let b2 = o.write(advance("b-2", 2, "c-2", 2, "payment_declined", "b2"));
    assert_eq!(b2.0, 200, "{}", b2.1);
    assert_eq!(state(&o.db, "c-2"), "payment_declined:3");
    assert_eq!(outbox_rows(&o.db), "a1#1,b2#2");
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn with_a_fence_key_only_the_lease_services_proof_writes() {
    let o = start("fence_proof", |dir| {
        let path = dir.join("fence.key");
        std::fs::write(&path, format!("{KEY}\n")).unwrap();
        vec!["--fence-key-file".into(), path.display().to_string()]
    });
    let keys = FenceKeys::parse("test", KEY).unwrap();
    let forger = FenceKeys::parse("forger", "ffffffffffffffffffffffffffffffff").unwrap();
    let claim = |token: u64, proof: Option<String>| {
        let mut fence = json!({"resource": "checkout:c-1", "token": token, "holder": "w-1"});
        if let Some(proof) = proof {
            fence["proof"] = json!(proof);
        }
        json!({"op_id": "op-1", "statement": "advance",
               "params": ["c-1", "payment_pending", 1], "fence": fence,
               "next": [intent("e1", "checkout:c-1")]})
    };
    for (what, body) in [
        ("no proof", claim(3, None)),
        (
            "a forged proof",
            claim(3, Some(forger.sign("checkout:c-1", 3, "w-1"))),
        ),
        (
            "a proof for another token",
            claim(4, Some(keys.sign("checkout:c-1", 3, "w-1"))),
        ),
    ] {
        let refused = o.write(body);
        assert_eq!(
            error(&refused),
            (409, Some("invalid_fence_proof")),
            "{what}: {}",
            refused.1
        );
        assert_eq!(state(&o.db, "c-1"), "stock_reserved:1", "{what}");
        assert_eq!(outbox_rows(&o.db), "", "{what}");
        assert_eq!(
            query(&o.db, "SELECT count(*) FROM twopc.pg_fences"),
            "0",
            "{what}"
        );
    }
    // The op id was never taken: the granted token writes under it, however high.
    let token = u64::MAX - 1;
    let granted = o.write(claim(token, Some(keys.sign("checkout:c-1", token, "w-1"))));
    assert_eq!(granted.0, 200, "{}", granted.1);
    assert_eq!(state(&o.db, "c-1"), "payment_pending:2");
    assert_eq!(outbox_rows(&o.db), "e1#1");
    let (_, fence) = o.call(As::Relay, "get", "/v1/fences/checkout:c-1", None);
    assert_eq!(fence["highest"].as_u64(), Some(token), "{fence}");
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn concurrent_writers_never_leave_a_lower_tokens_effect_after_a_higher_ones() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    println!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let tokens: Vec<u64> = (0..20).map(|_| rng.u64(1..=12)).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (p, db, _server) = pg_library("fence_race", STATEMENTS, SEED_SQL, |_| {}).await;
        let writers: Vec<_> = tokens
            .iter()
            .enumerate()
            .map(|(n, &token)| {
                let p = p.clone();
                let request: PgWriteRequest = serde_json::from_value(json!({
                    "op_id": format!("op-{n}"), "statement": "append", "params": ["j", token],
                    "fence": {"resource": "journal:j", "token": token}}))
                .unwrap();
                tokio::spawn(async move { (token, p.write(request).await) })
            })
            .collect();
        let mut accepted = Vec::new();
        let mut refused = 0;
        for writer in writers {
            match writer.await.unwrap() {
                (token, Ok(_)) => accepted.push(token),
                (token, Err(WriteError::Stale(stale))) => {
                    assert!(stale.highest > token, "seed {seed}: {stale}");
                    refused += 1;
                }
                (token, Err(other)) => panic!("seed {seed}: token {token}: {other}"),
            }
        }
        let applied: Vec<u64> = query(
            &db,
            "SELECT array_to_string(tokens, ',') FROM journal WHERE id = 'j'",
        )
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
        assert!(
            applied.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: a lower token's effect after a higher one's: {applied:?}"
        );
        let mut sorted = accepted.clone();
        sorted.sort_unstable();
        assert_eq!(
            applied, sorted,
            "seed {seed}: the effects are exactly the answered writes (tokens {tokens:?})"
        );
        let max = tokens.iter().max().copied().unwrap_or(0);
        assert!(
            accepted.contains(&max),
            "seed {seed}: the highest token always writes"
        );
        assert_eq!(
            query(
                &db,
                "SELECT highest FROM twopc.pg_fences WHERE resource = 'journal:j'"
            ),
            max.to_string()
        );
        assert_eq!(
            query(
                &db,
                "SELECT count(*) FROM twopc.pg_ops WHERE answer LIKE '{\"stale\"%'"
            ),
            refused.to_string(),
            "seed {seed}: every refusal is kept with its op id"
        );
    });
}
