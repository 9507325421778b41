//! The PostgreSQL participant's outbox under concurrency and time, against a real PostgreSQL
//! (docs/postgres.md, "The outbox"): seq follows commit order under concurrent writers of one
//! aggregate; settled intents go after the retention, open ones never. `postgres_outbox.rs` has
//! the write and the routes over HTTP; the crash after the local commit is
//! `crash_matrix::pg_participant_after_outbox_write_committed`.
//!
//! These drive the backend as a library. Ignored by `cargo test --workspace` (they need
//! PostgreSQL); `.ci/run` runs them with `-- --ignored`.

use std::time::Duration;

use chaos_tests::pg_outbox::{CHECKOUT_STATEMENTS, CHECKOUTS_SQL, intent, pg_library};
use cluster::postgres::{PgServer, psql_url};
use participant::outbox::StateFilter;
use participant::postgres::{Action, PgConfig, PgParticipant, Statements};
use protocol::outbox::{IntentState, PgWriteRequest};
use serde_json::{Value, json};

/// The backend as a library over a fresh database with the checkouts.
async fn library(
    name: &str,
    configure: impl FnOnce(&mut PgConfig),
) -> (PgParticipant<Statements>, String, PgServer) {
    pg_library(name, CHECKOUT_STATEMENTS, CHECKOUTS_SQL, configure).await
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
