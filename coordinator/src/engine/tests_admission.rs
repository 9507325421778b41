//! Admission control: per-participant bounds on live transactions and pending acknowledgements,
//! the waiters bound, and load accounting that mirrors the table through every step, replay and
//! recovery.

use protocol::{Decision, VoteKind};
use serde_json::json;

use super::test_support::{id, name, run};
use super::*;
use crate::digest::Digest;
use crate::engine::Load;
use crate::records::LogRecord;

const RUN: Incarnation = Incarnation(0xa1);

fn config(live: u64, pending: u64, waiters: usize) -> EngineConfig {
    EngineConfig {
        retry_base_ms: 100,
        retry_max_ms: 1000,
        retained_max: 1000,
        bounds: Bounds {
            live_per_participant: live,
            pending_acks_per_participant: pending,
            waiters_per_transaction: waiters,
        },
    }
}

fn submit(waiter: WaiterId, tx: &str, parts: &[&str]) -> Event {
    Event::Submit {
        waiter,
        wait: WaitFor::Decision,
        txid: id(tx),
        digest: Digest(7),
        participants: parts.iter().map(|p| (name(p), json!({}))).collect(),
        timeout_ms: 500,
        now_ms: 1000,
        archived: None,
        archive_generation: 0,
        client: None,
    }
}

fn vote(tx: &str, p: &str, vote: VoteKind) -> Event {
    Event::VoteReceived {
        txid: id(tx),
        participant: name(p),
        vote,
        reason: None,
        now_ms: 1100,
    }
}

fn overloaded(commands: &[Command]) -> Option<&ParticipantName> {
    commands.iter().find_map(|c| match c {
        Command::Reply {
            reply: Reply::Overloaded { participant, .. },
            ..
        } => Some(participant),
        _ => None,
    })
}

fn began(commands: &[Command]) -> bool {
    commands
        .iter()
        .any(|c| matches!(c, Command::AppendLazy(LogRecord::Begin(_))))
}

#[test]
fn past_the_live_bound_new_work_on_that_participant_is_refused_and_others_carry_on() {
    let mut engine = Engine::new(config(2, 100, 16), run(RUN, 1));
    assert!(began(&engine.step(submit(1, "t1", &["slow", "fast"]))));
    assert!(began(&engine.step(submit(2, "t2", &["slow"]))));
    assert_eq!(engine.load(&name("slow")).live, 2);
    let refused = engine.step(submit(3, "t3", &["fast", "slow"]));
    assert_eq!(overloaded(&refused), Some(&name("slow")), "{refused:?}");
    assert!(!began(&refused), "nothing is begun for a refused request");
    // A transaction that does not name the busy participant is not held up.
    assert!(began(&engine.step(submit(4, "t4", &["fast"]))));
    // Once a transaction on it is decided, there is room again.
    engine.step(vote("t2", "slow", VoteKind::No));
    engine.step(Event::DecisionDurable { txid: id("t2") });
    assert_eq!(engine.load(&name("slow")).live, 1);
    assert!(began(&engine.step(submit(5, "t5", &["slow"]))));
}

#[test]
fn past_the_pending_acks_bound_new_work_is_refused_until_acks_come() {
    let mut engine = Engine::new(config(100, 1, 16), run(RUN, 1));
    engine.step(submit(1, "t1", &["down"]));
    engine.step(vote("t1", "down", VoteKind::Yes));
    engine.step(Event::DecisionDurable { txid: id("t1") });
    assert_eq!(
        engine.load(&name("down")),
        Load {
            live: 0,
            pending_acks: 1
        }
    );
    let refused = engine.step(submit(2, "t2", &["down"]));
    assert_eq!(overloaded(&refused), Some(&name("down")));
    engine.step(Event::Acked {
        txid: id("t1"),
        participant: name("down"),
        now_ms: 1300,
    });
    assert_eq!(engine.load(&name("down")), Load::default());
    assert!(began(&engine.step(submit(3, "t2", &["down"]))));
}

#[test]
fn aborts_that_met_an_outage_leave_no_pending_work() {
    let mut engine = Engine::new(config(100, 3, 16), run(RUN, 1));
    for i in 0..50 {
        let tx = format!("t{i}");
        engine.step(submit(i, &tx, &["up", "down"]));
        engine.step(vote(&tx, "up", VoteKind::Yes));
        engine.step(vote(&tx, "down", VoteKind::Error));
        engine.step(Event::DecisionDurable { txid: id(&tx) });
        engine.step(Event::Acked {
            txid: id(&tx),
            participant: name("up"),
            now_ms: 1200,
        });
    }
    assert_eq!(engine.load(&name("down")), Load::default());
    assert_eq!(engine.gauges().pending_acks, 0);
    assert!(began(&engine.step(submit(99, "next", &["down"]))));
}

#[test]
fn waiters_per_transaction_are_bounded() {
    let mut engine = Engine::new(config(100, 100, 2), run(RUN, 1));
    engine.step(submit(1, "t", &["a"]));
    assert_eq!(
        engine.step(submit(2, "t", &["a"])),
        vec![],
        "the second waits"
    );
    let third = engine.step(submit(3, "t", &["a"]));
    assert!(
        matches!(
            third.as_slice(),
            [Command::Reply {
                waiter: 3,
                reply: Reply::Overloaded { .. }
            }]
        ),
        "{third:?}"
    );
    engine.step(vote("t", "a", VoteKind::Yes));
    let answered = engine.step(Event::DecisionDurable { txid: id("t") });
    let waiters: Vec<WaiterId> = answered
        .iter()
        .filter_map(|c| match c {
            Command::Reply {
                waiter,
                reply: Reply::Outcome(_),
            } => Some(*waiter),
            _ => None,
        })
        .collect();
    assert_eq!(waiters, vec![1, 2]);
}

#[test]
fn loads_are_rebuilt_by_replay_and_recovery() {
    let mut engine = Engine::new(config(100, 100, 16), run(RUN, 1));
    engine.step(submit(1, "committed", &["a", "b"]));
    engine.step(vote("committed", "a", VoteKind::Yes));
    engine.step(vote("committed", "b", VoteKind::Yes));
    engine.step(Event::DecisionDurable {
        txid: id("committed"),
    });
    engine.step(submit(2, "open", &["a"]));
    let before: Vec<(ParticipantName, Load)> =
        engine.loads().map(|(n, l)| (n.clone(), *l)).collect();
    assert_eq!(
        before,
        vec![
            (
                name("a"),
                Load {
                    live: 1,
                    pending_acks: 1
                }
            ),
            (
                name("b"),
                Load {
                    live: 0,
                    pending_acks: 1
                }
            ),
        ]
    );
    let snapshot = engine.snapshot(run(RUN, 1));
    let mut replayed = Engine::replay(config(100, 100, 16), Some(snapshot), []).engine;
    let after: Vec<(ParticipantName, Load)> =
        replayed.loads().map(|(n, l)| (n.clone(), *l)).collect();
    assert_eq!(after, before, "replay counts the same load");
    // Recovery aborts "open" (a phase-one attempt it cannot finish): once that abort is
    // durable nothing is owed for it, and only the commit's acknowledgements stay pending.
    replayed.step(Event::RecoveryDone {
        now_ms: 5000,
        identity: run(Incarnation(0xb2), 2),
    });
    replayed.step(Event::DecisionDurable { txid: id("open") });
    assert_eq!(
        replayed.load(&name("a")),
        Load {
            live: 0,
            pending_acks: 1
        }
    );
    assert_eq!(
        replayed.status(&id("open")).and_then(|s| s.outcome),
        Some(crate::engine::tx::outcome_of(Decision::Abort))
    );
}
