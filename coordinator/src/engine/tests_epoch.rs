//! A participant's refusal of a message this run sent (`engine::epoch`): the behind mark, the
//! raise of this run's epoch past the run the participant holds, the bounds on believing it,
//! what a durable raise restarts, and an operator's audited clear of the mark.

use protocol::operator::{AuditAction, AuditEntry};
use protocol::{Decision, DecisionStatus, Epoch, Incarnation, VoteKind};
use serde_json::json;

use super::test_support::{id, name, run};
use super::*;
use crate::digest::Digest;
use crate::records::{EpochRecord, LogRecord};

const RUN: Incarnation = Incarnation(0x1111);

fn config() -> EngineConfig {
    EngineConfig {
        retry_base_ms: 100,
        retry_max_ms: 1000,
        retained_max: 10,
        bounds: crate::engine::Bounds::UNBOUNDED,
    }
}

fn refusal(sent_epoch: u64, highest: Option<u64>) -> Event {
    Event::Fenced(Fenced {
        participant: name("a"),
        evidence: "refused a commit: stale_epoch".into(),
        sent_epoch: Epoch(sent_epoch),
        highest: highest.map(Epoch),
        now_ms: 50,
    })
}

fn raises(commands: &[Command]) -> Vec<Epoch> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::AppendEpoch(record) => Some(record.epoch),
            _ => None,
        })
        .collect()
}

fn marks(commands: &[Command]) -> usize {
    commands
        .iter()
        .filter(|c| matches!(c, Command::AppendForced(LogRecord::Behind(_))))
        .count()
}

/// A transaction decided commit whose delivery to `a` failed and waits for its retry timer.
fn committed_waiting_for_a(engine: &mut Engine) {
    engine.step(Event::Submit {
        waiter: 1,
        wait: WaitFor::Decision,
        txid: id("t"),
        digest: Digest(1),
        participants: vec![(name("a"), json!({})), (name("b"), json!({}))],
        timeout_ms: 500,
        now_ms: 10,
        archived: None,
        archive_generation: 0,
        client: None,
    });
    for p in ["a", "b"] {
        engine.step(Event::VoteReceived {
            txid: id("t"),
            participant: name(p),
            vote: VoteKind::Yes,
            reason: None,
            now_ms: 11,
        });
    }
    engine.step(Event::DecisionDurable { txid: id("t") });
    engine.step(Event::Acked {
        txid: id("t"),
        participant: name("b"),
        now_ms: 12,
    });
    let failed = engine.step(Event::DeliveryFailed {
        txid: id("t"),
        participant: name("a"),
        error: "stale_epoch".into(),
        jitter: 0,
    });
    assert!(
        failed.iter().any(|c| matches!(c, Command::ArmRetry { .. })),
        "{failed:?}"
    );
}

#[test]
fn a_refusal_marks_the_log_behind_and_raises_past_the_highest_epoch_reported() {
    let mut engine = Engine::new(config(), run(RUN, 3));
    let commands = engine.step(refusal(3, Some(7)));
    assert_eq!(marks(&commands), 1, "{commands:?}");
    assert_eq!(raises(&commands), vec![Epoch(8)]);
    assert!(engine.behind().is_some());
    // The raise is this same run (coordinator id and incarnation), only its epoch moves.
    let Some(Command::AppendEpoch(raised)) = commands.last() else {
        panic!("{commands:?}")
    };
    assert_eq!(
        raised,
        &EpochRecord {
            epoch: Epoch(8),
            ..run(RUN, 3)
        }
    );
    // Until durable, messages keep the old epoch, and the same evidence asks for nothing new.
    assert_eq!(engine.identity().map(|i| i.epoch), Some(Epoch(3)));
    assert_eq!(engine.step(refusal(3, Some(7))), vec![]);
    // A participant that does not say its highest epoch: one above what was sent.
    let mut quiet = Engine::new(config(), run(RUN, 3));
    assert_eq!(raises(&quiet.step(refusal(3, None))), vec![Epoch(4)]);
}

#[test]
fn a_refusal_of_a_message_sent_before_the_raise_is_spent() {
    let mut engine = Engine::new(config(), run(RUN, 3));
    let commands = engine.step(refusal(3, Some(5)));
    let [raised] = raises(&commands)[..] else {
        panic!("{commands:?}")
    };
    engine.step(Event::EpochDurable {
        identity: EpochRecord {
            epoch: raised,
            ..run(RUN, 3)
        },
    });
    assert_eq!(engine.identity().map(|i| i.epoch), Some(Epoch(6)));
    // A late refusal of something sent at epoch 3 says nothing about epoch 6.
    assert_eq!(engine.step(refusal(3, Some(5))), vec![]);
    assert_eq!(
        engine.step(refusal(3, Some(6))),
        vec![],
        "6 is this run's own"
    );
    // But one that reports an epoch above 6 is news, however old the message it refused.
    let mut late = engine.clone();
    assert_eq!(raises(&late.step(refusal(3, Some(7)))), vec![Epoch(8)]);
    // A refusal of a message sent at 6 is new evidence (another run passed 6 meanwhile).
    assert_eq!(raises(&engine.step(refusal(6, Some(9)))), vec![Epoch(10)]);
}

#[test]
fn an_unbelievable_epoch_or_endless_raising_is_refused_and_the_mark_stays() {
    let mut engine = Engine::new(config(), run(RUN, 3));
    let far = engine.step(refusal(3, Some(3 + EPOCH_RAISE_MAX)));
    assert_eq!(marks(&far), 1);
    assert_eq!(
        raises(&far),
        vec![],
        "a peer's made-up epoch is not believed"
    );
    assert!(
        engine
            .raise_refused_why(Some(Epoch(3 + EPOCH_RAISE_MAX)))
            .is_some()
    );
    // u64::MAX has no next epoch: no raise, no panic.
    assert_eq!(raises(&engine.step(refusal(3, Some(u64::MAX)))), vec![]);

    // Two live runs on copies of one data directory would pass each other for ever.
    let mut engine = Engine::new(config(), run(RUN, 1));
    let mut epoch = 1;
    for _ in 0..EPOCH_RAISES_MAX {
        let commands = engine.step(refusal(epoch, Some(epoch)));
        let [raised] = raises(&commands)[..] else {
            panic!("{commands:?}")
        };
        engine.step(Event::EpochDurable {
            identity: EpochRecord {
                epoch: raised,
                ..run(RUN, 1)
            },
        });
        epoch = raised.0;
    }
    assert_eq!(raises(&engine.step(refusal(epoch, Some(epoch)))), vec![]);
    assert!(engine.raise_refused_why(Some(Epoch(epoch))).is_some());
    assert!(engine.behind().is_some());
}

#[test]
fn a_durable_raise_sends_every_waiting_delivery_again_at_once() {
    let mut engine = Engine::new(config(), run(RUN, 2));
    committed_waiting_for_a(&mut engine);
    let commands = engine.step(refusal(2, Some(2)));
    let [raised] = raises(&commands)[..] else {
        panic!("{commands:?}")
    };
    let again = engine.step(Event::EpochDurable {
        identity: EpochRecord {
            epoch: raised,
            ..run(RUN, 2)
        },
    });
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(
        matches!(
            &again[0],
            Command::SendDecision { txid, participant, decision: Decision::Commit, .. }
                if *txid == id("t") && *participant == name("a")
        ),
        "only the delivery still waiting, and only to the one that did not acknowledge: \
         {again:?}"
    );
    // The run's span carries the raised epoch, so a checkpoint and the next start see it.
    assert!(
        engine
            .runs()
            .any(|span| span.incarnation == RUN && span.epoch == raised)
    );
}

#[test]
fn the_next_start_begins_above_a_raised_epoch() {
    let mut engine = Engine::new(config(), run(RUN, 2));
    let commands = engine.step(refusal(2, Some(4)));
    let mut log = vec![LogRecord::Epoch(run(RUN, 2))];
    for command in commands {
        match command {
            Command::AppendForced(record) => log.push(record),
            Command::AppendEpoch(record) => log.push(LogRecord::Epoch(record)),
            other => panic!("{other:?}"),
        }
    }
    let replayed = Engine::replay(config(), None, log);
    assert_eq!(replayed.identity.map(|i| i.epoch), Some(Epoch(5)));
    assert!(replayed.engine.behind().is_some(), "the mark is logged too");
}

#[test]
fn an_operators_clear_lifts_the_mark_and_replays_so() {
    let mut engine = Engine::new(config(), run(RUN, 2));
    let commands = engine.step(refusal(2, Some(2)));
    let mark = commands
        .iter()
        .find_map(|c| match c {
            Command::AppendForced(record) => Some(record.clone()),
            _ => None,
        })
        .unwrap();
    let clear = AuditEntry {
        seq: engine.next_audit_seq(),
        at_ms: 60,
        operator: "alice".into(),
        reason: "the evidence was from a test rig".into(),
        action: AuditAction::ClearBehind {
            cleared: engine.behind().unwrap().evidence.clone(),
        },
    };
    engine.apply_audit(clear.clone());
    assert_eq!(engine.behind(), None);
    let replayed = Engine::replay(
        config(),
        None,
        [
            LogRecord::Epoch(run(RUN, 2)),
            mark.clone(),
            LogRecord::Audit(clear),
        ],
    );
    assert_eq!(
        replayed.engine.behind(),
        None,
        "a clear replays after its mark"
    );
    let replayed = Engine::replay(config(), None, [LogRecord::Epoch(run(RUN, 2)), mark]);
    assert!(replayed.engine.behind().is_some());
}

#[test]
fn the_probe_attempt_takes_no_position_and_is_heard_as_aborted() {
    let mut engine = Engine::new(config(), run(RUN, 2));
    let probe = engine.probe_attempt().unwrap();
    assert_eq!((probe.incarnation, probe.position), (RUN, 0));
    // The next transaction's attempt comes after it: nothing is ever begun under the probe.
    let commands = engine.step(Event::Submit {
        waiter: 1,
        wait: WaitFor::Decision,
        txid: id("t"),
        digest: Digest(1),
        participants: vec![(name("a"), json!({}))],
        timeout_ms: 500,
        now_ms: 10,
        archived: None,
        archive_generation: 0,
        client: None,
    });
    let given = commands
        .iter()
        .find_map(|c| match c {
            Command::SendPrepare { attempt, .. } => Some(attempt.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        given.position, 1,
        "the numbering is the transactions' alone"
    );
    let refusal = engine.claim_refusal(&id("twopc-epoch-probe"), &probe.gtid, None);
    assert_eq!(
        refusal.map(|r| r.code),
        Some(protocol::ErrorCode::AttemptNotIssued),
        "nothing is in doubt under a probe"
    );
    // A participant asking about the probe hears abort, the decision it was sent.
    let ask = protocol::DecisionQuery {
        gtid: probe.gtid.clone(),
        incarnation: probe.incarnation,
        epoch: Epoch(2),
        position: probe.position,
    };
    assert_eq!(
        engine
            .decision_for(&id("twopc-epoch-probe"), Some(&ask))
            .decision,
        DecisionStatus::Abort
    );
}
