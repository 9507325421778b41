//! Staging: an ended outcome stays in the engine until the outcome index holds it durably
//! (`Command::Archive` out, `Event::Archived` back), and a submit that misses the engine is
//! answered from what the runtime found in the index.

use protocol::{Decision, Incarnation, Outcome, VoteKind};
use serde_json::json;

use super::test_support::{id, name, run, split_archives};
use super::*;
use crate::digest::Digest;
use crate::records::Retained;

const RUN1: Incarnation = Incarnation(0x5151);

fn engine(retained_max: usize) -> Engine {
    Engine::new(
        EngineConfig {
            retry_base_ms: 100,
            retry_max_ms: 1000,
            retained_max,
            bounds: crate::engine::Bounds::UNBOUNDED,
        },
        run(RUN1, 1),
    )
}

fn submit(engine: &Engine, waiter: WaiterId, txid: &str, digest: u128) -> Event {
    submit_with(engine, waiter, txid, digest, None)
}

fn submit_with(
    engine: &Engine,
    waiter: WaiterId,
    txid: &str,
    digest: u128,
    archived: Option<Retained>,
) -> Event {
    Event::Submit {
        waiter,
        wait: WaitFor::Decision,
        txid: id(txid),
        digest: Digest(digest),
        participants: vec![(name("a"), json!({"put": txid}))],
        timeout_ms: 500,
        now_ms: 1000,
        archived,
        archive_generation: engine.archive_generation(),
        client: None,
    }
}

/// Runs `txid` to its end (one participant, yes) and returns what it staged for the index.
fn run_to_end(engine: &mut Engine, txid: &str, digest: u128) -> Retained {
    let started = engine.step(submit(engine, 1, txid, digest));
    assert!(
        started
            .iter()
            .any(|c| matches!(c, Command::SendPrepare { .. })),
        "{txid}: a new attempt: {started:?}"
    );
    engine.step(Event::VoteReceived {
        txid: id(txid),
        participant: name("a"),
        vote: VoteKind::Yes,
        reason: None,
        now_ms: 1100,
    });
    engine.step(Event::DecisionDurable { txid: id(txid) });
    let (mut archives, _) = split_archives(engine.step(Event::Acked {
        txid: id(txid),
        participant: name("a"),
        now_ms: 1200,
    }));
    assert_eq!(archives.len(), 1, "{txid}: the end stages one outcome");
    archives.remove(0)
}

fn archived(retained: &Retained) -> Event {
    Event::Archived {
        archived: vec![(
            retained.decision.txid.clone(),
            retained.decision.attempt.gtid.clone(),
        )],
    }
}

#[test]
fn an_outcome_stays_staged_until_archived_then_the_index_answers_retries() {
    let mut engine = engine(10);
    let k = run_to_end(&mut engine, "K", 7);
    assert_eq!(k.ended_at_ms, 1200);
    assert_eq!(k.decision.decision, Decision::Commit);
    assert!(engine.status(&id("K")).is_some(), "staged: still answered");
    assert_eq!(engine.gauges().retained, 1);
    let snapshot = engine.snapshot(run(RUN1, 1));
    assert_eq!(
        snapshot.retained,
        vec![k.clone()],
        "the checkpoint keeps it"
    );

    engine.step(archived(&k));
    assert!(engine.status(&id("K")).is_none(), "archived: left staging");
    assert_eq!(engine.gauges().retained, 0);
    assert!(
        engine.snapshot(run(RUN1, 1)).retained.is_empty(),
        "the checkpoint no longer carries what the index holds"
    );

    // The runtime found K in the index: the recorded outcome, with no new attempt.
    let same = engine.step(submit_with(&engine, 2, "K", 7, Some(k.clone())));
    match same.as_slice() {
        [
            Command::Reply {
                waiter: 2,
                reply: Reply::Outcome(response),
            },
        ] => {
            assert_eq!(response.outcome, Outcome::Committed);
            assert_eq!(response.gtid, k.decision.attempt.gtid);
        }
        other => panic!("expected the recorded outcome, got {other:?}"),
    }
    let other = engine.step(submit_with(&engine, 3, "K", 8, Some(k)));
    assert_eq!(
        other,
        vec![Command::Reply {
            waiter: 3,
            reply: Reply::Conflict { txid: id("K") },
        }]
    );
}

#[test]
fn an_archive_of_an_older_attempt_leaves_the_newer_outcome_staged() {
    let mut engine = engine(10);
    let first = run_to_end(&mut engine, "K", 7);
    // K's window passed in staging (expiry), and K is used again before the first archive
    // of K is acknowledged.
    engine.step(Event::ExpireRetained {
        now_ms: 5000,
        retention_ms: 10,
    });
    let second = run_to_end(&mut engine, "K", 8);
    assert_ne!(first.decision.attempt.gtid, second.decision.attempt.gtid);
    engine.step(archived(&first));
    let status = engine
        .status(&id("K"))
        .expect("the newer outcome stays staged");
    assert_eq!(status.gtid, second.decision.attempt.gtid);
    engine.step(archived(&second));
    assert!(engine.status(&id("K")).is_none());
}

#[test]
fn a_submit_whose_index_lookup_predates_an_archive_looks_again() {
    let mut engine = engine(10);
    let k = run_to_end(&mut engine, "K", 7);
    // The runtime read the generation and missed K in the index (not written yet) ...
    let stale = submit(&engine, 2, "K", 7);
    // ... then the archiver wrote K and K left staging, before the submit was stepped.
    engine.step(archived(&k));
    assert_eq!(
        engine.step(stale),
        vec![Command::Reply {
            waiter: 2,
            reply: Reply::LookAgain,
        }],
        "never a second attempt for an id whose outcome may be in the index"
    );
}

#[test]
fn beyond_retained_max_staged_new_work_waits_and_retries_are_still_answered() {
    let mut engine = engine(2);
    let a = run_to_end(&mut engine, "A", 1);
    run_to_end(&mut engine, "B", 2);
    let refused = engine.step(submit(&engine, 5, "C", 3));
    assert_eq!(
        refused,
        vec![Command::Reply {
            waiter: 5,
            reply: Reply::Busy { staged: 2 },
        }],
        "nothing staged is dropped; new attempts wait"
    );
    // A retry of a staged id is answered from staging.
    let retry = engine.step(submit(&engine, 6, "A", 1));
    assert!(
        matches!(
            retry.as_slice(),
            [Command::Reply {
                reply: Reply::Outcome(_),
                ..
            }]
        ),
        "{retry:?}"
    );
    engine.step(archived(&a));
    let started = engine.step(submit(&engine, 7, "C", 3));
    assert!(
        started
            .iter()
            .any(|c| matches!(c, Command::SendPrepare { .. })),
        "room again once the archiver caught up: {started:?}"
    );
}

#[test]
fn recovery_archives_everything_staged_again() {
    let mut engine = engine(10);
    let k = run_to_end(&mut engine, "K", 7);
    let snapshot = engine.snapshot(run(RUN1, 1));
    let mut replayed = Engine::replay(engine.config, Some(snapshot), Vec::new()).engine;
    let (archives, _) = split_archives(replayed.step(Event::RecoveryDone {
        now_ms: 3000,
        identity: run(Incarnation(0x5252), 2),
    }));
    assert_eq!(archives, vec![k]);
}
