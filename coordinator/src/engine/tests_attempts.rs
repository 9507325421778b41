//! Attempts and runs: every submit of a new attempt gets a global id that no other attempt ever
//! had, and a participant in doubt hears presumed abort only where this log provably covers
//! the attempt (its run is in the log, its position within what the log holds of that run);
//! everywhere else it hears `unknown`.

use protocol::{
    CoordinatorId, Decision, DecisionQuery, DecisionStatus, Epoch, GlobalTxId, Incarnation,
    Outcome, VoteKind,
};
use serde_json::json;

use super::test_support::{attempt, id, name, run};
use super::*;
use crate::digest::Digest;
use crate::records::{Attempt, BeginRecord, DecisionRecord, EndRecord, LogRecord, Snapshot};

const RUN1: Incarnation = Incarnation(0x1111);
const RUN2: Incarnation = Incarnation(0x2222);
const RUN3: Incarnation = Incarnation(0x3333);

fn config(retained_max: usize) -> EngineConfig {
    EngineConfig {
        retry_base_ms: 100,
        retry_max_ms: 1000,
        retained_max,
        bounds: crate::engine::Bounds::UNBOUNDED,
    }
}
fn query(attempt: &Attempt) -> DecisionQuery {
    DecisionQuery {
        gtid: attempt.gtid.clone(),
        incarnation: attempt.incarnation,
        epoch: Epoch(1),
        position: attempt.position,
    }
}
fn answer(engine: &Engine, txid: &str, attempt: &Attempt) -> DecisionAnswer {
    engine.decision_for(&id(txid), Some(&query(attempt)))
}
fn ask(engine: &Engine, txid: &str, attempt: &Attempt) -> DecisionStatus {
    answer(engine, txid, attempt).decision
}

fn submit(waiter: WaiterId, wait: WaitFor, txid: &str, digest: u128) -> Event {
    Event::Submit {
        waiter,
        wait,
        txid: id(txid),
        digest: Digest(digest),
        participants: vec![(name("a"), json!({"put": txid})), (name("b"), json!(null))],
        timeout_ms: 500,
        now_ms: 1000,
        archived: None,
        archive_generation: 0,
        client: None,
    }
}

/// The attempts the commands prepare (one per participant, so each appears once per
/// participant).
fn prepared(commands: &[Command]) -> Vec<Attempt> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::SendPrepare { attempt, .. } => Some(attempt.clone()),
            _ => None,
        })
        .collect()
}

/// Runs `txid` to its end with both participants voting `vote`, and returns the attempt its
/// prepares named.
fn run_to_end(engine: &mut Engine, txid: &str, digest: u128, vote: VoteKind) -> Attempt {
    let attempts = prepared(&engine.step(submit(1, WaitFor::Decision, txid, digest)));
    assert_eq!(attempts.len(), 2, "{txid}: a new attempt prepares everyone");
    assert_eq!(attempts[0], attempts[1], "{txid}: one attempt, one id");
    for p in ["a", "b"] {
        engine.step(Event::VoteReceived {
            txid: id(txid),
            participant: name(p),
            vote,
            reason: None,
            now_ms: 1100,
        });
    }
    engine.step(Event::DecisionDurable { txid: id(txid) });
    for p in ["a", "b"] {
        engine.step(Event::Acked {
            txid: id(txid),
            participant: name(p),
            now_ms: 1200,
        });
    }
    attempts[0].clone()
}

fn reach_of(engine: &Engine, incarnation: Incarnation) -> Option<u64> {
    engine
        .runs()
        .find(|span| span.incarnation == incarnation)
        .map(|span| span.reach)
}

#[test]
fn a_reused_id_after_its_outcome_is_forgotten_is_a_new_attempt() {
    // The report: `--retained-max 1`, commit A, B, C, then submit A again with another
    // body. The first A is forgotten; the second A must be an attempt of its own (prepared
    // under a new id), never an answer from the first A's outcome, and participants asking
    // about either attempt must hear that attempt's own outcome.
    // Today an outcome is forgotten when its window passes (staging and index alike).
    let mut engine = Engine::new(config(10), run(RUN1, 1));
    let first_a = run_to_end(&mut engine, "A", 1, VoteKind::Yes);
    run_to_end(&mut engine, "B", 2, VoteKind::Yes);
    run_to_end(&mut engine, "C", 3, VoteKind::Yes);
    engine.step(Event::ExpireRetained {
        now_ms: 1200,
        retention_ms: 0,
    });
    assert!(
        engine.status(&id("A")).is_none(),
        "the window passed: A is forgotten"
    );

    let commands = engine.step(submit(7, WaitFor::Decision, "A", 99));
    assert!(
        !commands.iter().any(|c| matches!(c, Command::Reply { .. })),
        "answered without an attempt: {commands:?}"
    );
    let second = prepared(&commands);
    assert_eq!(second.len(), 2, "{commands:?}");
    let second_a = second[0].clone();
    assert_eq!(second_a, attempt(RUN1, 4));
    assert_ne!(second_a.gtid, first_a.gtid);
    assert!(commands.iter().any(|c| matches!(c,
        Command::AppendLazy(LogRecord::Begin(b)) if b.attempt == second_a && b.digest == Digest(99))));

    // The first A: covered by the span (same run, position 1 <= reach 4) and forgotten, so a
    // presumed abort; every participant acknowledged it, so none is left to ask.
    assert_eq!(ask(&engine, "A", &first_a), DecisionStatus::Abort);
    assert_eq!(ask(&engine, "A", &second_a), DecisionStatus::Pending);

    // The second A commits: its participants hear commit; the first A's id never does.
    for p in ["a", "b"] {
        engine.step(Event::VoteReceived {
            txid: id("A"),
            participant: name(p),
            vote: VoteKind::Yes,
            reason: None,
            now_ms: 2000,
        });
    }
    let durable = engine.step(Event::DecisionDurable { txid: id("A") });
    let answered = durable.iter().find_map(|c| match c {
        Command::Reply {
            waiter: 7,
            reply: Reply::Outcome(r),
        } => Some(r.clone()),
        _ => None,
    });
    let answered = answered.expect("the client hears the second attempt's outcome");
    assert_eq!(
        (answered.outcome, &answered.gtid),
        (Outcome::Committed, &second_a.gtid)
    );
    for command in &durable {
        if let Command::SendDecision { gtid, .. } = command {
            assert_eq!(gtid, &second_a.gtid, "phase two names the second attempt");
        }
    }
    assert_eq!(ask(&engine, "A", &second_a), DecisionStatus::Commit);
    assert_eq!(ask(&engine, "A", &first_a), DecisionStatus::Abort);
}

#[test]
fn a_runs_reach_advances_at_submit() {
    let mut engine = Engine::new(config(10), run(RUN1, 1));
    assert_eq!(reach_of(&engine, RUN1), Some(0));
    // Before any submit, position 1 is past the reach: unknown, not abort.
    assert_eq!(
        ask(&engine, "x", &attempt(RUN1, 1)),
        DecisionStatus::Unknown
    );
    let commands = engine.step(submit(1, WaitFor::Decision, "t", 1));
    assert_eq!(prepared(&commands)[0], attempt(RUN1, 1));
    assert_eq!(reach_of(&engine, RUN1), Some(1));
    engine.step(submit(2, WaitFor::Decision, "u", 1));
    assert_eq!(reach_of(&engine, RUN1), Some(2));
    // A client retry of a live id is no new attempt: the reach stays.
    engine.step(submit(3, WaitFor::Decision, "t", 1));
    assert_eq!(reach_of(&engine, RUN1), Some(2));
    assert_eq!(
        ask(&engine, "u", &attempt(RUN1, 2)),
        DecisionStatus::Pending
    );
    assert_eq!(
        ask(&engine, "v", &attempt(RUN1, 3)),
        DecisionStatus::Unknown
    );
}

#[test]
fn an_incarnation_this_log_does_not_hold_is_unknown_and_counted_never_believed() {
    let mut engine = Engine::new(config(10), run(RUN1, 1));
    run_to_end(&mut engine, "t", 1, VoteKind::Yes);
    // A query naming a run this log never saw: a restored log, or a peer making it up. A
    // query is a claim: it is answered unknown and flagged for the count, and nothing else
    // changes (the answer is computed from `&self`; the mark comes only from a refusal).
    let lost = Incarnation(0xdead);
    let lost_attempt = attempt(lost, 1);
    let got = answer(&engine, "t", &lost_attempt);
    assert_eq!(got.decision, DecisionStatus::Unknown);
    assert!(got.unknown_run, "{got:?}");
    assert_eq!(got.source, AnswerSource::Unknown);
    assert!(got.reason.is_some_and(|r| r.contains(&lost.to_string())));
    assert_eq!(engine.behind(), None, "a query never marks the log behind");
    // Even at position 1, which this run did reach: the run, not the position, is unknown.
    assert_eq!(reach_of(&engine, RUN1), Some(1));
    // The same made-up run under every epoch and position a hostile peer might try.
    for (epoch, position) in [(0, 0), (1, 1), (u64::MAX, u64::MAX), (7, 3)] {
        let mut query = query(&attempt(Incarnation(u64::MAX), position.max(1)));
        query.epoch = Epoch(epoch);
        query.position = position;
        let got = engine.decision_for(&id("x"), Some(&query));
        assert_eq!(got.decision, DecisionStatus::Unknown, "{epoch}/{position}");
        assert_eq!(engine.behind(), None);
    }
    // New work is still taken.
    let commands = engine.step(submit(9, WaitFor::Decision, "after", 9));
    assert_eq!(prepared(&commands).len(), 2, "{commands:?}");
}

#[test]
fn an_earlier_run_is_held_whole_so_a_lost_begin_is_presumed_aborted() {
    // Run 1 began x (1) and y (2), both decided and ended, then z (3), whose lazy Begin was
    // lost in a crash (its participants may be prepared). Run 2 starts on that log.
    let ended = |txid: &str, position: u64, decision: Decision| {
        let attempt = attempt(RUN1, position);
        [
            LogRecord::Begin(BeginRecord {
                txid: id(txid),
                attempt: attempt.clone(),
                digest: Digest(1),
                participants: vec![name("a")],
                created_at_ms: 10,
                client: None,
            }),
            LogRecord::Decision(DecisionRecord {
                txid: id(txid),
                attempt,
                digest: Digest(1),
                decision,
                reason: None,
                votes: vec![(name("a"), VoteKind::Yes)],
                created_at_ms: 10,
                decided_at_ms: 11,
                client: None,
            }),
            LogRecord::End(EndRecord {
                txid: id(txid),
                ended_at_ms: 12,
            }),
        ]
    };
    let mut records = vec![LogRecord::Epoch(run(RUN1, 1))];
    records.extend(ended("x", 1, Decision::Commit));
    records.extend(ended("y", 2, Decision::Abort));
    let mut engine = Engine::replay(config(10), None, records).engine;
    let (archives, rest) = super::test_support::split_archives(engine.step(Event::RecoveryDone {
        now_ms: 50,
        identity: run(RUN2, 2),
    }));
    assert_eq!(rest, vec![]);
    assert_eq!(
        archives.len(),
        2,
        "x and y, replayed, go to the index again"
    );
    assert_eq!(reach_of(&engine, RUN1), Some(2));
    assert_eq!(reach_of(&engine, RUN2), Some(0));

    // The lost Begin: past what the log holds of run 1. Run 1 ended before run 2 started on
    // this log, so all it made durable is here: no Begin means no decision either (it would
    // follow the Begin). Presumed abort, as recovery presumes for begun, undecided attempts.
    let got = answer(&engine, "z", &attempt(RUN1, 3));
    assert_eq!(got.decision, DecisionStatus::Abort, "{got:?}");
    assert!(
        got.reason
            .as_deref()
            .is_some_and(|r| r.contains("ended before this one")),
        "{got:?}"
    );
    assert!(!got.unknown_run, "run 1 is in this log: {got:?}");
    assert_eq!(got.source, AnswerSource::Presumed);
    // This run has given out nothing yet: its position 1 cannot be answered.
    let got = answer(&engine, "z", &attempt(RUN2, 1));
    assert_eq!(got.decision, DecisionStatus::Unknown, "{got:?}");
    // Retained outcomes answer as they are.
    assert_eq!(ask(&engine, "x", &attempt(RUN1, 1)), DecisionStatus::Commit);
    assert_eq!(ask(&engine, "y", &attempt(RUN1, 2)), DecisionStatus::Abort);
    // Once forgotten, positions within the earlier run's reach are presumed aborted.
    engine.step(Event::ExpireRetained {
        now_ms: 10_000,
        retention_ms: 1,
    });
    assert_eq!(ask(&engine, "y", &attempt(RUN1, 2)), DecisionStatus::Abort);
    assert_eq!(ask(&engine, "w", &attempt(RUN1, 1)), DecisionStatus::Abort);
    assert_eq!(ask(&engine, "z", &attempt(RUN1, 3)), DecisionStatus::Abort);
    // This run's own numbering starts again at 1, under its own incarnation: the attempt it
    // gives that position is live (pending), and run 1's position 3 stays aborted.
    let commands = engine.step(submit(1, WaitFor::Decision, "z", 5));
    assert_eq!(prepared(&commands)[0], attempt(RUN2, 1));
    assert_eq!(
        ask(&engine, "z", &attempt(RUN2, 1)),
        DecisionStatus::Pending
    );
    assert_eq!(ask(&engine, "z", &attempt(RUN1, 3)), DecisionStatus::Abort);
}

#[test]
fn coverage_survives_checkpoints() {
    // Run 1 began two attempts and ended them; run 2 began one. A checkpoint then replaces the
    // whole log: the runs and their reaches must be in it, or the restored coordinator could
    // not presume abort inside the spans (or would presume it outside them).
    let mut engine = Engine::new(config(10), run(RUN1, 1));
    run_to_end(&mut engine, "x", 1, VoteKind::Yes);
    run_to_end(&mut engine, "y", 1, VoteKind::No);
    let mut engine = Engine::replay(config(10), Some(engine.snapshot(run(RUN1, 1))), []).engine;
    engine.step(Event::RecoveryDone {
        now_ms: 2000,
        identity: run(RUN2, 2),
    });
    engine.step(submit(1, WaitFor::Decision, "z", 1));
    engine.step(Event::ExpireRetained {
        now_ms: 100_000,
        retention_ms: 1,
    });

    let bytes = engine.snapshot(run(RUN2, 2)).encode();
    let snapshot = Snapshot::decode(&bytes).unwrap();
    assert_eq!(snapshot, engine.snapshot(run(RUN2, 2)));
    assert_eq!(
        snapshot.runs,
        vec![
            RunSpan {
                incarnation: RUN1,
                epoch: Epoch(1),
                reach: 2
            },
            RunSpan {
                incarnation: RUN2,
                epoch: Epoch(2),
                reach: 1
            },
        ]
    );
    // Replayed alone, as after a restart whose log holds only this checkpoint.
    let replayed = Engine::replay(config(10), Some(snapshot), []);
    assert_eq!(replayed.identity, Some(run(RUN2, 2)));
    let mut restored = replayed.engine;
    restored.step(Event::RecoveryDone {
        now_ms: 3000,
        identity: run(RUN3, 3),
    });
    let expected = [
        (RUN1, 1, DecisionStatus::Abort),
        (RUN1, 2, DecisionStatus::Abort),
        // Earlier runs are held whole, whatever position is asked about.
        (RUN1, 3, DecisionStatus::Abort),
        (RUN2, 2, DecisionStatus::Abort),
        // This run (3) has given out nothing yet.
        (RUN3, 1, DecisionStatus::Unknown),
    ];
    for (incarnation, position, status) in expected {
        let got = answer(&restored, "q", &attempt(incarnation, position));
        assert_eq!(got.decision, status, "{incarnation}:{position}: {got:?}");
        assert!(!got.unknown_run, "{incarnation}:{position}");
    }
    // z (run 2, position 1) was live at the checkpoint: recovery is aborting it, so it is
    // pending until that abort is durable, then abort.
    assert_eq!(
        ask(&restored, "z", &attempt(RUN2, 1)),
        DecisionStatus::Pending
    );
    restored.step(Event::DecisionDurable { txid: id("z") });
    assert_eq!(
        ask(&restored, "z", &attempt(RUN2, 1)),
        DecisionStatus::Abort
    );
}

#[test]
fn a_query_that_names_no_attempt_of_this_coordinator_is_unknown() {
    let mut engine = Engine::new(config(10), run(RUN1, 1));
    run_to_end(&mut engine, "t", 1, VoteKind::Yes);
    run_to_end(&mut engine, "u", 1, VoteKind::Yes);
    engine.step(Event::ExpireRetained {
        now_ms: 100_000,
        retention_ms: 1,
    });
    assert_eq!(reach_of(&engine, RUN1), Some(2));
    let covered = attempt(RUN1, 1);
    assert_eq!(ask(&engine, "t", &covered), DecisionStatus::Abort);

    let no_query = engine.decision_for(&id("t"), None);
    assert_eq!(no_query.decision, DecisionStatus::Unknown);
    assert!(!no_query.unknown_run);
    let mismatched = [
        (
            "another coordinator's id",
            GlobalTxId::compose(&CoordinatorId::new("c-9").unwrap(), RUN1, 1),
        ),
        (
            "a gtid of another position than the query names",
            attempt(RUN1, 2).gtid,
        ),
        ("an opaque gtid", GlobalTxId::new("order-1").unwrap()),
    ];
    for (what, gtid) in mismatched {
        let query = DecisionQuery {
            gtid,
            ..query(&covered)
        };
        let got = engine.decision_for(&id("t"), Some(&query));
        assert_eq!(got.decision, DecisionStatus::Unknown, "{what}: {got:?}");
        assert!(!got.unknown_run, "{what}");
        assert!(got.reason.is_some(), "{what}");
    }
}

#[test]
#[should_panic(expected = "incarnations must never repeat")]
fn recovery_refuses_an_incarnation_the_log_already_holds() {
    let replayed = Engine::replay(config(10), None, [LogRecord::Epoch(run(RUN1, 1))]);
    let mut engine = replayed.engine;
    engine.step(Event::RecoveryDone {
        now_ms: 1,
        identity: run(RUN1, 2),
    });
}

#[test]
fn the_proof_that_the_log_is_behind_is_logged_once_and_survives_replay_and_checkpoints() {
    let mut engine = Engine::new(config(10), run(RUN1, 1));
    assert_eq!(engine.behind(), None);
    let refusal = |evidence: &str, at_ms: u64| {
        Event::Fenced(Fenced {
            participant: name("inventory"),
            evidence: evidence.to_string(),
            sent_epoch: Epoch(1),
            highest: None,
            now_ms: at_ms,
        })
    };
    let first = crate::records::BehindRecord {
        evidence: "inventory: refused a prepare: incarnation_conflict".to_string(),
        at_ms: 5,
    };
    let commands = engine.step(refusal("refused a prepare: incarnation_conflict", 5));
    assert_eq!(
        commands.first(),
        Some(&Command::AppendForced(LogRecord::Behind(first.clone())))
    );
    // Once known, later proofs log no second mark and do not replace the first.
    let later = engine.step(refusal("later", 6));
    assert!(
        !later
            .iter()
            .any(|c| matches!(c, Command::AppendForced(LogRecord::Behind(_)))),
        "{later:?}"
    );
    assert_eq!(engine.behind(), Some(&first));

    // From the log...
    let replayed = Engine::replay(
        config(10),
        None,
        [
            LogRecord::Epoch(run(RUN1, 1)),
            LogRecord::Behind(first.clone()),
        ],
    );
    assert_eq!(replayed.engine.behind(), Some(&first));
    // ...and from a checkpoint, which a later start replays alone.
    let snapshot = Snapshot::decode(&engine.snapshot(run(RUN1, 1)).encode()).unwrap();
    assert_eq!(snapshot, engine.snapshot(run(RUN1, 1)));
    assert_eq!(snapshot.behind.as_ref(), Some(&first));
    let mut restored = Engine::replay(config(10), Some(snapshot), []).engine;
    restored.step(Event::RecoveryDone {
        now_ms: 7,
        identity: run(RUN2, 2),
    });
    assert_eq!(restored.behind(), Some(&first));
    // A log that never learned it says nothing of it in its checkpoint.
    let clean = Engine::new(config(10), run(RUN1, 1));
    let bytes = clean.snapshot(run(RUN1, 1)).encode();
    assert!(!String::from_utf8_lossy(&bytes).contains("behind"));
    assert_eq!(Snapshot::decode(&bytes).unwrap().behind, None);
}
