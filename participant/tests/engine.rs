//! The pure engine with a toy resource: feed an event, assert the commands.

mod common;

use common::{Tally, add, decision, prepare, tx};
use participant::record::Record;
use participant::{Command, Engine, EngineConfig, Event, Reply};
use protocol::{DecisionStatus, ErrorCode, Vote};

fn engine() -> Engine<Tally> {
    Engine::new(
        EngineConfig {
            in_doubt_after_ms: 1_000,
            decision_backoff_base_ms: 100,
            decision_backoff_max_ms: 800,
            ..EngineConfig::default()
        },
        Tally::default(),
    )
}

fn reply(commands: &[Command]) -> Reply {
    match commands.last() {
        Some(Command::Reply(reply)) => reply.clone(),
        other => panic!("last command is not a reply: {other:?}"),
    }
}

fn logs(commands: &[Command]) -> Vec<(&Record, bool)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Log { record, forced } => Some((record, *forced)),
            Command::Reply(_) | Command::AskDecision { .. } => None,
        })
        .collect()
}

fn p(e: &mut Engine<Tally>, txid: &str, epoch: u64, payload: serde_json::Value) -> Vec<Command> {
    e.step(Event::Prepare {
        request: prepare(txid, epoch, payload),
        now_ms: 10,
    })
}

fn commit(e: &mut Engine<Tally>, txid: &str, epoch: u64) -> Vec<Command> {
    e.step(Event::Commit {
        request: decision(txid, epoch),
        now_ms: 20,
    })
}

fn abort(e: &mut Engine<Tally>, txid: &str, epoch: u64) -> Vec<Command> {
    e.step(Event::Abort {
        request: decision(txid, epoch),
        now_ms: 20,
    })
}

fn no() -> impl Fn(&Reply) -> bool {
    |r| matches!(r, Reply::Vote(Vote::No { .. }))
}

fn rejected(r: &Reply) -> Option<ErrorCode> {
    match r {
        Reply::Reject(rejection) => Some(rejection.code()),
        Reply::Vote(_) | Reply::Ack => None,
    }
}

#[test]
fn yes_vote_comes_after_a_forced_prepared_record() {
    let mut e = engine();
    let commands = p(&mut e, "t1", 1, add("a", 2));
    assert_eq!(commands.len(), 2);
    match &commands[0] {
        Command::Log {
            record: Record::Prepared { txid, payload, .. },
            forced: true,
        } => {
            assert_eq!(txid, &tx("t1"));
            assert_eq!(payload, &add("a", 2));
        }
        other => panic!("expected a forced prepared record first, got {other:?}"),
    }
    assert_eq!(reply(&commands), Reply::Vote(Vote::Yes));
    assert_eq!(e.prepared_len(), 1);
    assert_eq!(
        e.resource().counts.get("a"),
        None,
        "prepared is not applied"
    );
}

#[test]
fn duplicate_prepare_answers_the_same_vote() {
    let mut e = engine();
    assert_eq!(
        reply(&p(&mut e, "t1", 1, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    let again = p(&mut e, "t1", 1, add("a", 1));
    assert_eq!(reply(&again), Reply::Vote(Vote::Yes));
    // No second prepared record; a barrier so the answer waits for the first one's fsync.
    let l = logs(&again);
    assert_eq!(l.len(), 1);
    assert!(matches!(l[0], (Record::Fence { .. }, true)));
    assert_eq!(e.prepared_len(), 1);

    let first_no = reply(&p(&mut e, "t2", 1, add("b", -1)));
    assert!(no()(&first_no), "{first_no:?}");
    // Same no, even though a duplicate would now be evaluated against other state.
    assert_eq!(reply(&p(&mut e, "t2", 1, add("b", 5))), first_no);

    commit(&mut e, "t1", 1);
    assert_eq!(
        reply(&p(&mut e, "t1", 1, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    assert_eq!(e.resource().applied, 1);
}

#[test]
fn duplicate_prepare_with_another_payload_votes_no_and_keeps_the_prepared_one() {
    // The coordinator lost its record of t1's first attempt (epoch 1) in a crash and took the
    // client's retry, with another body, as a new transaction (epoch 2).
    let mut e = engine();
    assert_eq!(
        reply(&p(&mut e, "t1", 1, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    let other = p(&mut e, "t1", 2, add("a", 5));
    match reply(&other) {
        Reply::Vote(Vote::No { reason }) => assert!(
            reason.contains("t1") && reason.contains("different payload"),
            "{reason}"
        ),
        wrong => panic!("a yes would commit the old payload for the new request: {wrong:?}"),
    }
    // No second prepared record; the first attempt stays prepared with its locks.
    assert!(
        !logs(&other)
            .iter()
            .any(|(r, _)| matches!(r, Record::Prepared { .. })),
        "{other:?}"
    );
    assert_eq!(e.prepared_len(), 1);
    assert_eq!(e.prepared_list()[0].epoch.0, 1);
    // The same body again (a plain retry) is still the same yes.
    assert_eq!(
        reply(&p(&mut e, "t1", 2, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    // The coordinator aborts the retry it saw a no for: that ends the prepared attempt too.
    assert_eq!(reply(&abort(&mut e, "t1", 2)), Reply::Ack);
    assert_eq!(e.prepared_len(), 0);
    assert_eq!(e.locks_len(), 0);
    assert_eq!(e.resource().applied, 0);
}

#[test]
fn commit_twice_applies_once_and_abort_twice_releases_once() {
    let mut e = engine();
    p(&mut e, "t1", 1, add("a", 3));
    let first = commit(&mut e, "t1", 1);
    assert!(matches!(
        logs(&first)[..],
        [(Record::Committed { .. }, true)]
    ));
    assert_eq!(reply(&first), Reply::Ack);
    assert_eq!(reply(&commit(&mut e, "t1", 1)), Reply::Ack);
    assert_eq!(e.resource().counts["a"], 3);
    assert_eq!(e.resource().applied, 1);

    p(&mut e, "t2", 1, add("b", 3));
    let first = abort(&mut e, "t2", 1);
    assert!(matches!(logs(&first)[..], [(Record::Aborted { .. }, true)]));
    assert_eq!(reply(&abort(&mut e, "t2", 1)), Reply::Ack);
    assert_eq!(e.resource().released, 1);
    assert_eq!(e.resource().counts.get("b"), None);
    assert_eq!(e.locks_len(), 0);
}

#[test]
fn abort_before_prepare_makes_the_late_prepare_vote_no() {
    let mut e = engine();
    let tomb = abort(&mut e, "t1", 1);
    assert!(matches!(logs(&tomb)[..], [(Record::Aborted { .. }, true)]));
    assert_eq!(reply(&tomb), Reply::Ack);
    let late = reply(&p(&mut e, "t1", 1, add("a", 1)));
    assert!(no()(&late), "{late:?}");
    assert_eq!(e.prepared_len(), 0);
    assert_eq!(e.locks_len(), 0);
}

#[test]
fn stale_epochs_are_rejected_and_the_highest_is_carried_in_records() {
    let mut e = engine();
    p(&mut e, "t1", 5, add("a", 1));
    assert_eq!(
        rejected(&reply(&p(&mut e, "t2", 4, add("b", 1)))),
        Some(ErrorCode::StaleEpoch)
    );
    assert_eq!(
        rejected(&reply(&commit(&mut e, "t1", 4))),
        Some(ErrorCode::StaleEpoch)
    );
    assert_eq!(
        rejected(&reply(&abort(&mut e, "t1", 4))),
        Some(ErrorCode::StaleEpoch)
    );
    assert_eq!(e.prepared_len(), 1, "a stale message changes nothing");
    // A newer epoch (the coordinator restarted) is accepted and raises the mark; when the
    // answer has no record of its own, a fence record carries the new epoch.
    let raised = commit(&mut e, "t9", 7);
    assert_eq!(rejected(&reply(&raised)), Some(ErrorCode::NotPrepared));
    assert!(matches!(logs(&raised)[..], [(Record::Fence { epoch, .. }, true)] if epoch.0 == 7));
    assert_eq!(e.highest_epoch(&common::coord("c1")).map(|e| e.0), Some(7));
    assert_eq!(reply(&commit(&mut e, "t1", 7)), Reply::Ack);
}

#[test]
fn commit_for_a_never_prepared_txid_is_not_prepared() {
    let mut e = engine();
    assert_eq!(
        rejected(&reply(&commit(&mut e, "ghost", 1))),
        Some(ErrorCode::NotPrepared)
    );
    p(&mut e, "t1", 1, add("a", -1)); // voted no
    assert_eq!(
        rejected(&reply(&commit(&mut e, "t1", 1))),
        Some(ErrorCode::NotPrepared)
    );
    abort(&mut e, "t2", 1); // tombstone
    assert_eq!(
        rejected(&reply(&commit(&mut e, "t2", 1))),
        Some(ErrorCode::NotPrepared)
    );
    assert_eq!(e.resource().applied, 0);
}

#[test]
fn lock_conflict_votes_no_naming_the_key_and_holder() {
    let mut e = engine();
    p(&mut e, "holder", 1, add("a", 1));
    match reply(&p(&mut e, "other", 1, add("a", 1))) {
        Reply::Vote(Vote::No { reason }) => {
            assert!(reason.contains("\"a\""), "{reason}");
            assert!(reason.contains("holder"), "{reason}");
        }
        r => panic!("{r:?}"),
    }
    commit(&mut e, "holder", 1);
    assert_eq!(
        reply(&p(&mut e, "third", 1, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
}

#[test]
fn invalid_and_oversize_payloads_are_errors_not_votes() {
    let mut e = engine();
    assert_eq!(
        rejected(&reply(&p(&mut e, "t1", 1, serde_json::json!({"key": 1})))),
        Some(ErrorCode::InvalidPayload)
    );
    let big = serde_json::json!({"key": "a", "n": 1, "pad": "x".repeat(70 * 1024)});
    assert_eq!(
        rejected(&reply(&p(&mut e, "t2", 1, big))),
        Some(ErrorCode::PayloadTooLarge)
    );
    assert_eq!(e.prepared_len(), 0);
    assert_eq!(e.tombstones_len(), 0);
}

#[test]
fn in_doubt_asks_with_backoff_and_never_decides_alone() {
    let mut e = engine();
    p(&mut e, "t1", 1, add("a", 1)); // prepared at 10 ms
    assert!(
        e.step(Event::Tick { now_ms: 500 }).is_empty(),
        "not yet in doubt"
    );
    let asks = e.step(Event::Tick { now_ms: 1_010 });
    assert_eq!(asks, vec![Command::AskDecision { txid: tx("t1") }]);
    assert!(
        e.step(Event::Tick { now_ms: 1_020 }).is_empty(),
        "one ask in flight"
    );
    let mut now = 1_020;
    let mut waits = Vec::new();
    for _ in 0..8 {
        let answer = if waits.len() % 2 == 0 {
            Some(DecisionStatus::Pending)
        } else {
            None
        };
        assert!(
            e.step(Event::DecisionAnswer {
                txid: tx("t1"),
                answer,
                now_ms: now,
                entropy: 0,
            })
            .is_empty()
        );
        let start = now;
        while e.step(Event::Tick { now_ms: now }).is_empty() {
            now += 10;
        }
        waits.push(now - start);
    }
    assert_eq!(waits, vec![100, 200, 400, 800, 800, 800, 800, 800]);
    assert_eq!(
        e.prepared_len(),
        1,
        "still prepared: it never decides alone"
    );
    assert_eq!(e.locks_len(), 1);
    let resolved = e.step(Event::DecisionAnswer {
        txid: tx("t1"),
        answer: Some(DecisionStatus::Commit),
        now_ms: now,
        entropy: 0,
    });
    assert!(matches!(
        logs(&resolved)[..],
        [(Record::Committed { .. }, true)]
    ));
    assert_eq!(e.resource().counts["a"], 1);
    assert_eq!(e.prepared_len(), 0);
}

#[test]
fn jitter_stays_within_half_the_delay() {
    for entropy in [0, 1, 49, 50, 51, u64::MAX] {
        let mut e = engine();
        p(&mut e, "t1", 1, add("a", 1));
        e.step(Event::Tick { now_ms: 1_010 });
        e.step(Event::DecisionAnswer {
            txid: tx("t1"),
            answer: None,
            now_ms: 2_000,
            entropy,
        });
        assert!(e.step(Event::Tick { now_ms: 2_099 }).is_empty());
        assert_eq!(
            e.step(Event::Tick { now_ms: 2_150 }).len(),
            1,
            "entropy {entropy}"
        );
    }
}

#[test]
fn replaying_the_log_and_restoring_a_snapshot_rebuild_the_same_state() {
    let mut e = engine();
    let mut log = Vec::new();
    let mut run = |e: &mut Engine<Tally>, event| {
        for command in e.step(event) {
            if let Command::Log { record, .. } = command {
                log.push(record);
            }
        }
    };
    run(
        &mut e,
        Event::Prepare {
            request: prepare("t1", 2, add("a", 1)),
            now_ms: 1,
        },
    );
    run(
        &mut e,
        Event::Prepare {
            request: prepare("t2", 2, add("b", 2)),
            now_ms: 2,
        },
    );
    run(
        &mut e,
        Event::Commit {
            request: decision("t1", 2),
            now_ms: 3,
        },
    );
    run(
        &mut e,
        Event::Abort {
            request: decision("t3", 3),
            now_ms: 4,
        },
    );
    run(
        &mut e,
        Event::Prepare {
            request: prepare("t4", 3, add("c", -1)),
            now_ms: 5,
        },
    );

    let mut replayed = engine();
    for record in log {
        replayed.replay(record).unwrap();
    }
    let restored = Engine::<Tally>::restore(EngineConfig::default(), e.snapshot()).unwrap();
    for other in [&mut replayed, &mut { restored }] {
        assert_eq!(other.resource(), e.resource());
        assert_eq!(other.prepared_list(), e.prepared_list());
        assert_eq!(other.locks_len(), 1, "t2 still holds b");
        assert_eq!(other.tombstones_len(), e.tombstones_len());
        assert_eq!(
            other.highest_epoch(&common::coord("c1")).map(|e| e.0),
            Some(3)
        );
        // The rebuilt engine answers duplicates the same way.
        assert!(no()(&reply(&p(other, "t3", 3, add("x", 1)))));
        assert!(
            no()(&reply(&p(other, "t2b", 3, add("b", 1)))),
            "b is locked"
        );
        assert_eq!(reply(&commit(other, "t2", 3)), Reply::Ack);
        assert_eq!(other.resource().counts["b"], 2);
    }
}
