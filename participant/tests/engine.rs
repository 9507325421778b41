//! The pure engine with a toy resource: feed an event, assert the commands.

mod common;

use common::{
    C1, Sender, Tally, add, coord, decision, decision_as, from, gtid, gtid_of, prepare, prepare_as,
    run, tx,
};
use participant::record::{Fence, Record};
use participant::tombstones::{Ended, Tombstone};
use participant::{Command, Engine, EngineConfig, Event, Rejection, Reply};
use protocol::{
    DecisionQuery, DecisionQueryResponse, DecisionStatus, Epoch, ErrorCode, GlobalTxId,
    Incarnation, Vote,
};

/// The tests here predate lock waits and are about other things: a conflicting prepare votes
/// no at once (`lock_wait_max_ms: 0`, the old behaviour). `tests/lock_waits.rs` covers waits.
fn no_wait() -> EngineConfig {
    EngineConfig {
        lock_wait_max_ms: 0,
        ..EngineConfig::default()
    }
}

fn engine() -> Engine<Tally> {
    Engine::new(
        EngineConfig {
            in_doubt_after_ms: 1_000,
            decision_backoff_base_ms: 100,
            decision_backoff_max_ms: 800,
            ..no_wait()
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
            Command::Reply(_) | Command::Deliver { .. } | Command::AskDecision { .. } => None,
        })
        .collect()
}

fn p(e: &mut Engine<Tally>, txid: &str, epoch: u64, payload: serde_json::Value) -> Vec<Command> {
    e.step(Event::Prepare {
        request: prepare(txid, epoch, payload),
        now_ms: 10,
        waiter: 0,
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

fn p_as(
    e: &mut Engine<Tally>,
    txid: &str,
    gtid: &GlobalTxId,
    sender: &Sender,
    payload: serde_json::Value,
) -> Vec<Command> {
    e.step(Event::Prepare {
        request: prepare_as(txid, gtid, sender, payload),
        now_ms: 10,
        waiter: 0,
    })
}

fn commit_as(
    e: &mut Engine<Tally>,
    txid: &str,
    gtid: &GlobalTxId,
    sender: &Sender,
) -> Vec<Command> {
    e.step(Event::Commit {
        request: decision_as(txid, gtid, sender),
        now_ms: 20,
    })
}

fn abort_as(e: &mut Engine<Tally>, txid: &str, gtid: &GlobalTxId, sender: &Sender) -> Vec<Command> {
    e.step(Event::Abort {
        request: decision_as(txid, gtid, sender),
        now_ms: 20,
    })
}

/// What a coordinator answers a decision query with.
fn answer(
    decision: DecisionStatus,
    coordinator: Option<&str>,
    epoch: Option<u64>,
) -> Option<DecisionQueryResponse> {
    Some(DecisionQueryResponse {
        decision,
        coordinator_id: coordinator.map(coord),
        epoch: epoch.map(Epoch),
        incarnation: epoch.map(run),
        reason: None,
    })
}

/// Every record the commands append, in order.
fn run_log(e: &mut Engine<Tally>, log: &mut Vec<Record>, event: Event) -> Vec<Command> {
    let commands = e.step(event);
    for command in &commands {
        if let Command::Log { record, .. } = command {
            log.push(record.clone());
        }
    }
    commands
}

fn replayed(log: &[Record]) -> Engine<Tally> {
    let mut e = engine();
    for record in log {
        e.replay(record.clone()).unwrap();
    }
    e
}

fn no() -> impl Fn(&Reply) -> bool {
    |r| matches!(r, Reply::Vote(Vote::No { .. }))
}

fn rejected(r: &Reply) -> Option<ErrorCode> {
    match r {
        Reply::Reject(rejection) => Some(rejection.code()),
        Reply::Vote(_)
        | Reply::Ack
        | Reply::Fenced(_)
        | Reply::FenceReset(_)
        | Reply::Intent(_) => None,
    }
}

#[test]
fn yes_vote_comes_after_a_forced_prepared_record() {
    let mut e = engine();
    let commands = p(&mut e, "t1", 1, add("a", 2));
    assert_eq!(commands.len(), 2);
    match &commands[0] {
        Command::Log {
            record:
                Record::Prepared {
                    gtid: logged,
                    txid,
                    payload,
                    ..
                },
            forced: true,
        } => {
            assert_eq!(
                logged,
                &gtid("t1"),
                "keyed by the attempt, not the client id"
            );
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
    // One attempt (one gtid) never carries two payloads from a correct coordinator; a resend
    // from its next run that does (a bug, a corrupted log) must not be promised.
    let mut e = engine();
    assert_eq!(
        reply(&p(&mut e, "t1", 1, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    let other = p(&mut e, "t1", 2, add("a", 5));
    match reply(&other) {
        Reply::Vote(Vote::No { reason }) => assert!(
            reason.contains(gtid("t1").as_str()) && reason.contains("different payload"),
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
    // The coordinator aborts the attempt it saw a no for: that ends the prepared one.
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
    match reply(&p(&mut e, "t3", 4, add("c", 1))) {
        Reply::Reject(rejection) => assert_eq!(
            rejection.highest_epoch(),
            Some(Epoch(5)),
            "the refusal names the epoch to rise above"
        ),
        wrong => panic!("expected stale_epoch, got {wrong:?}"),
    }
    // A newer epoch (the coordinator restarted) is accepted and raises the mark; when the
    // answer has no record of its own, a fence record carries the new epoch.
    let raised = commit(&mut e, "t9", 7);
    assert_eq!(rejected(&reply(&raised)), Some(ErrorCode::NotPrepared));
    assert!(matches!(logs(&raised)[..], [(Record::Fence { epoch, .. }, true)] if epoch.0 == 7));
    assert_eq!(
        e.highest_epoch(&coord(C1)),
        Some(Fence {
            epoch: Epoch(7),
            incarnation: run(7)
        })
    );
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
            assert!(reason.contains(gtid("holder").as_str()), "{reason}");
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
fn the_oldest_prepared_attempt_is_known_until_it_is_decided() {
    let mut e = engine();
    assert_eq!(e.oldest_prepared_at_ms(), None);
    p(&mut e, "t1", 1, add("a", 1)); // prepared at 10 ms
    e.step(Event::Prepare {
        request: prepare("t2", 1, add("b", 1)),
        now_ms: 40,
        waiter: 1,
    });
    assert_eq!(e.oldest_prepared_at_ms(), Some(10));
    commit(&mut e, "t1", 1);
    assert_eq!(e.oldest_prepared_at_ms(), Some(40), "t2 is now the oldest");
    commit(&mut e, "t2", 1);
    assert_eq!(e.oldest_prepared_at_ms(), None);
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
    let g = gtid("t1");
    assert_eq!(
        asks,
        vec![Command::AskDecision {
            txid: tx("t1"),
            query: DecisionQuery {
                gtid: g.clone(),
                incarnation: run(1),
                epoch: Epoch(1),
                position: g.parts().unwrap().2,
            },
        }]
    );
    assert!(
        e.step(Event::Tick { now_ms: 1_020 }).is_empty(),
        "one ask in flight"
    );
    let mut now = 1_020;
    let mut waits = Vec::new();
    for _ in 0..8 {
        let answer = if waits.len() % 2 == 0 {
            answer(DecisionStatus::Pending, Some(C1), Some(1))
        } else {
            None
        };
        assert!(
            e.step(Event::DecisionAnswer {
                gtid: g.clone(),
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
        gtid: g,
        answer: answer(DecisionStatus::Commit, Some(C1), Some(1)),
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
            gtid: gtid("t1"),
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
    run_log(
        &mut e,
        &mut log,
        Event::Prepare {
            request: prepare("t1", 2, add("a", 1)),
            now_ms: 1,
            waiter: 0,
        },
    );
    run_log(
        &mut e,
        &mut log,
        Event::Prepare {
            request: prepare("t2", 2, add("b", 2)),
            now_ms: 2,
            waiter: 0,
        },
    );
    run_log(
        &mut e,
        &mut log,
        Event::Commit {
            request: decision("t1", 2),
            now_ms: 3,
        },
    );
    run_log(
        &mut e,
        &mut log,
        Event::Abort {
            request: decision("t3", 3),
            now_ms: 4,
        },
    );
    run_log(
        &mut e,
        &mut log,
        Event::Prepare {
            request: prepare("t4", 3, add("c", -1)),
            now_ms: 5,
            waiter: 0,
        },
    );

    let mut replayed = replayed(&log);
    let restored = Engine::<Tally>::restore(no_wait(), e.snapshot().unwrap()).unwrap();
    for other in [&mut replayed, &mut { restored }] {
        assert_eq!(other.resource(), e.resource());
        assert_eq!(other.prepared_list(), e.prepared_list());
        assert_eq!(other.locks_len(), 1, "t2 still holds b");
        assert_eq!(other.tombstones_len(), e.tombstones_len());
        assert_eq!(
            other.highest_epoch(&coord(C1)),
            Some(Fence {
                epoch: Epoch(3),
                incarnation: run(3)
            })
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

/// The records of `late`'s attempt: an abort that overtook its prepare (a tombstone), then the
/// prepare voting yes. Built by hand: the engine that wrote such a log is not the point, the
/// replay is: the prepared record is the later fact and stands for a yes vote.
fn aborted_then_prepared() -> (Record, Record) {
    let g = gtid("late");
    let aborted = Record::Aborted {
        gtid: g.clone(),
        coordinator_id: coord(C1),
        epoch: Epoch(1),
        incarnation: run(1),
        at_ms: 20,
    };
    let prepared = Record::Prepared {
        gtid: g.clone(),
        txid: tx("late"),
        coordinator_id: coord(C1),
        epoch: Epoch(1),
        incarnation: run(1),
        position: g.parts().unwrap().2,
        payload: add("a", 4),
        prepared_at_ms: 90_000,
        started_at_ms: None,
        participants: None,
    };
    (aborted, prepared)
}

/// `g` is prepared holding key `key`, and its staged change is what a commit applies.
fn assert_prepared_with_locks(e: &mut Engine<Tally>, g: &GlobalTxId, key: &str, n: i64) {
    assert_eq!(e.prepared_len(), 1);
    assert_eq!(e.prepared_list()[0].gtid, *g);
    assert_eq!(e.locks_len(), 1);
    assert_eq!(
        e.tombstones_len(),
        0,
        "the prepared record supersedes the tombstone"
    );
    assert!(
        e.snapshot().unwrap().tombstones.is_empty(),
        "and no checkpoint keeps it"
    );
    match reply(&p(e, "rival", 9, add(key, 1))) {
        Reply::Vote(Vote::No { reason }) => assert!(reason.contains(g.as_str()), "{reason}"),
        wrong => panic!("{key} must be locked by {g}: {wrong:?}"),
    }
    let txid = e.prepared_list()[0].txid.to_string();
    assert_eq!(reply(&commit_as(e, &txid, g, &from(C1, 9))), Reply::Ack);
    assert_eq!(e.resource().counts[key], n);
    assert_eq!(e.resource().applied, 1);
}

#[test]
fn replay_restores_a_prepared_attempt_logged_after_its_tombstone() {
    let (aborted, prepared) = aborted_then_prepared();
    let mut e = replayed(&[aborted, prepared]);
    assert_prepared_with_locks(&mut e, &gtid("late"), "a", 4);
}

#[test]
fn a_prepared_record_after_a_snapshot_tombstone_restores_the_prepared_attempt() {
    let (aborted, prepared) = aborted_then_prepared();
    let g = gtid("late");
    let mut live = engine();
    live.replay(aborted).unwrap();
    let snapshot = live.snapshot().unwrap();
    assert!(
        snapshot.tombstones.iter().any(|t| t.gtid == g),
        "the checkpoint holds the tombstone"
    );
    let mut e = Engine::<Tally>::restore(no_wait(), snapshot).unwrap();
    assert_eq!(e.tombstones_len(), 1);
    e.replay(prepared).unwrap();
    assert_prepared_with_locks(&mut e, &g, "a", 4);
}

#[test]
fn a_snapshot_holding_an_attempt_both_prepared_and_as_a_tombstone_restores_it_prepared() {
    // A checkpoint written by a build that let both stand: the prepared state is the later
    // fact (a tombstone never outlives the attempt's own end, which removes it from prepared).
    let mut live = engine();
    let g = gtid("late");
    assert_eq!(
        reply(&p(&mut live, "late", 1, add("a", 4))),
        Reply::Vote(Vote::Yes)
    );
    let mut snapshot = live.snapshot().unwrap();
    snapshot.tombstones.insert(
        0,
        Tombstone {
            gtid: g.clone(),
            ended: Ended::Aborted,
            digest: None,
            at_ms: 5,
        },
    );
    let mut e = Engine::<Tally>::restore(no_wait(), snapshot).unwrap();
    assert_prepared_with_locks(&mut e, &g, "a", 4);
}

#[test]
fn a_reused_client_id_is_a_new_attempt_that_prepares_fresh_and_applies() {
    // The coordinator forgot order-1's outcome (its idempotency record expired, or it
    // restarted) and took the client's retry, with another body, as a new attempt.
    let mut e = engine();
    let first = gtid_of(C1, run(1), 1);
    let second = gtid_of(C1, run(2), 1);
    let one = from(C1, 1);
    let two = from(C1, 2);
    assert_eq!(
        reply(&p_as(&mut e, "order-1", &first, &one, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    assert_eq!(
        reply(&commit_as(&mut e, "order-1", &first, &one)),
        Reply::Ack
    );

    let again = p_as(&mut e, "order-1", &second, &two, add("a", 5));
    assert_eq!(reply(&again), Reply::Vote(Vote::Yes));
    match logs(&again)[..] {
        [
            (
                Record::Prepared {
                    gtid,
                    txid,
                    incarnation,
                    position,
                    payload,
                    ..
                },
                true,
            ),
        ] => {
            assert_eq!(gtid, &second);
            assert_eq!(txid, &tx("order-1"));
            assert_eq!((*incarnation, *position), (run(2), 1));
            assert_eq!(payload, &add("a", 5));
        }
        ref other => panic!("a fresh prepare forces its own record, got {other:?}"),
    }
    assert_eq!(
        e.prepared_len(),
        1,
        "never answered from the first's tombstone"
    );
    assert_eq!(
        reply(&commit_as(&mut e, "order-1", &second, &two)),
        Reply::Ack
    );
    assert_eq!(e.resource().counts["a"], 6);
    assert_eq!(e.resource().applied, 2);
}

#[test]
fn a_reused_client_id_does_not_share_the_first_attempts_locks_or_outcome() {
    let mut e = engine();
    let first = gtid_of(C1, run(1), 1);
    let second = gtid_of(C1, run(2), 1);
    let third = gtid_of(C1, run(2), 2);
    let two = from(C1, 2);
    p_as(&mut e, "order-1", &first, &from(C1, 1), add("a", 1));
    // The first is still prepared: the new attempt on its key waits like any other would.
    match reply(&p_as(&mut e, "order-1", &second, &two, add("a", 5))) {
        Reply::Vote(Vote::No { reason }) => assert!(reason.contains(first.as_str()), "{reason}"),
        wrong => panic!("a is locked by the first attempt: {wrong:?}"),
    }
    // On another key it is independent, and aborting it leaves the first prepared.
    assert_eq!(
        reply(&p_as(&mut e, "order-1", &third, &two, add("b", 5))),
        Reply::Vote(Vote::Yes)
    );
    assert_eq!(e.prepared_len(), 2);
    assert_eq!(
        reply(&abort_as(&mut e, "order-1", &third, &two)),
        Reply::Ack
    );
    assert_eq!(e.prepared_list()[0].gtid, first);
    assert_eq!(
        reply(&commit_as(&mut e, "order-1", &first, &two)),
        Reply::Ack
    );
    assert_eq!(e.resource().counts.get("a"), Some(&1));
    assert_eq!(e.resource().counts.get("b"), None);
}

#[test]
fn a_prepare_reusing_a_committed_gtid_must_carry_the_committed_payload() {
    let mut live = engine();
    let mut log = Vec::new();
    let g = gtid("t1");
    run_log(
        &mut live,
        &mut log,
        Event::Prepare {
            request: prepare("t1", 1, add("a", 1)),
            now_ms: 10,
            waiter: 0,
        },
    );
    run_log(
        &mut live,
        &mut log,
        Event::Commit {
            request: decision("t1", 1),
            now_ms: 20,
        },
    );
    let restored = Engine::<Tally>::restore(no_wait(), live.snapshot().unwrap()).unwrap();
    // The digest lives in the tombstone: the same answers after replay and after a checkpoint.
    for mut e in [live, replayed(&log), restored] {
        let other = p(&mut e, "t1", 1, add("a", 2));
        match reply(&other) {
            Reply::Vote(Vote::No { reason }) => assert!(
                reason.contains(g.as_str()) && reason.contains("different payload"),
                "{reason}"
            ),
            wrong => panic!("the committed attempt had another payload: {wrong:?}"),
        }
        assert!(logs(&other).is_empty(), "{other:?}");
        let same = p(&mut e, "t1", 1, add("a", 1));
        assert_eq!(reply(&same), Reply::Vote(Vote::Yes));
        assert!(
            matches!(logs(&same)[..], [(Record::Fence { .. }, true)]),
            "a barrier, never a second prepared record: {same:?}"
        );
        assert_eq!(e.prepared_len(), 0);
        assert_eq!(reply(&commit(&mut e, "t1", 1)), Reply::Ack);
        assert_eq!(e.resource().counts["a"], 1);
        assert_eq!(e.resource().applied, 1, "applied once");
    }
}

fn incarnation_conflict(commands: &[Command]) -> (u64, u64) {
    assert_eq!(commands.len(), 1, "nothing logged: {commands:?}");
    match reply(commands) {
        Reply::Reject(
            rejection @ Rejection::IncarnationConflict {
                claimed_by, got, ..
            },
        ) => {
            assert_eq!(rejection.code(), ErrorCode::IncarnationConflict);
            assert_eq!(rejection.code().status(), 409);
            // The claimed epoch is the highest held: the error body names it.
            assert_eq!(Some(rejection_epoch(&rejection)), rejection.highest_epoch());
            (claimed_by.0, got.0)
        }
        wrong => panic!("expected incarnation_conflict, got {wrong:?}"),
    }
}

fn rejection_epoch(rejection: &Rejection) -> Epoch {
    match rejection {
        Rejection::IncarnationConflict { epoch, .. } => *epoch,
        wrong => panic!("not an incarnation conflict: {wrong:?}"),
    }
}

#[test]
fn the_same_epoch_from_another_run_is_an_incarnation_conflict_and_changes_nothing() {
    let mut e = engine();
    let g = gtid("t1");
    assert_eq!(
        reply(&p(&mut e, "t1", 3, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    // A coordinator started from a restored copy of its log claims epoch 3 again.
    let restored = from(C1, 3).in_run(0xdead);
    let conflicts = [
        p_as(&mut e, "t2", &gtid("t2"), &restored, add("b", 1)),
        commit_as(&mut e, "t1", &g, &restored),
        abort_as(&mut e, "t1", &g, &restored),
        abort_as(&mut e, "t3", &gtid("t3"), &restored),
    ];
    for commands in &conflicts {
        assert_eq!(incarnation_conflict(commands), (3, 0xdead));
    }
    assert_eq!(e.prepared_len(), 1);
    assert_eq!(e.tombstones_len(), 0, "the abort left no tombstone");
    assert_eq!((e.resource().applied, e.resource().released), (0, 0));
    let held = Fence {
        epoch: Epoch(3),
        incarnation: run(3),
    };
    assert_eq!(e.highest_epoch(&coord(C1)), Some(held));
    // A lower epoch is still stale, whatever its run.
    assert_eq!(
        rejected(&reply(&commit(&mut e, "t1", 2))),
        Some(ErrorCode::StaleEpoch)
    );
    // The genuine run keeps working; a later epoch raises the fence as before.
    assert_eq!(
        reply(&p(&mut e, "t4", 3, add("c", 1))),
        Reply::Vote(Vote::Yes)
    );
    let next = from(C1, 4).in_run(0xdead);
    assert_eq!(reply(&commit_as(&mut e, "t1", &g, &next)), Reply::Ack);
    assert_eq!(
        e.highest_epoch(&coord(C1)),
        Some(Fence {
            epoch: Epoch(4),
            incarnation: Incarnation(0xdead)
        })
    );
    assert_eq!(
        incarnation_conflict(&commit(&mut e, "t4", 4)),
        (0xdead, 4),
        "now run 4 (the one numbered like its epoch) is the impostor"
    );
}

#[test]
fn a_fence_survives_replay_and_checkpoints_with_its_incarnation() {
    let mut live = engine();
    let mut log = Vec::new();
    run_log(
        &mut live,
        &mut log,
        Event::Prepare {
            request: prepare("t1", 3, add("a", 1)),
            now_ms: 10,
            waiter: 0,
        },
    );
    // Raised by a message that leaves no record but the fence itself.
    let ghost = run_log(
        &mut live,
        &mut log,
        Event::Commit {
            request: decision_as("ghost", &gtid("ghost"), &from(C1, 6).in_run(0x66)),
            now_ms: 20,
        },
    );
    assert_eq!(rejected(&reply(&ghost)), Some(ErrorCode::NotPrepared));
    let restored = Engine::<Tally>::restore(no_wait(), live.snapshot().unwrap()).unwrap();
    for mut e in [replayed(&log), restored] {
        assert_eq!(
            e.highest_epoch(&coord(C1)),
            Some(Fence {
                epoch: Epoch(6),
                incarnation: Incarnation(0x66)
            })
        );
        assert_eq!(incarnation_conflict(&commit(&mut e, "t1", 6)), (0x66, 6));
        assert_eq!(
            rejected(&reply(&commit(&mut e, "t1", 5))),
            Some(ErrorCode::StaleEpoch)
        );
        let genuine = from(C1, 6).in_run(0x66);
        assert_eq!(
            reply(&commit_as(&mut e, "t1", &gtid("t1"), &genuine)),
            Reply::Ack
        );
        assert_eq!(e.resource().applied, 1);
    }
}

/// An engine with `t1` prepared at epoch 2 and its first decision query in flight.
fn in_doubt() -> (Engine<Tally>, GlobalTxId) {
    let mut e = engine();
    p(&mut e, "t1", 2, add("a", 1));
    assert_eq!(e.step(Event::Tick { now_ms: 1_010 }).len(), 1);
    (e, gtid("t1"))
}

fn feed(
    e: &mut Engine<Tally>,
    g: &GlobalTxId,
    answer: Option<DecisionQueryResponse>,
) -> Vec<Command> {
    e.step(Event::DecisionAnswer {
        gtid: g.clone(),
        answer,
        now_ms: 1_020,
        entropy: 0,
    })
}

fn last_answer(e: &Engine<Tally>) -> String {
    e.prepared_list()[0].last_answer.clone().unwrap_or_default()
}

#[test]
fn an_unknown_answer_keeps_the_attempt_prepared_and_is_shown() {
    let (mut e, g) = in_doubt();
    assert_eq!(e.prepared_list()[0].last_answer, None, "not asked yet");
    let mut unknown = answer(DecisionStatus::Unknown, Some(C1), Some(2));
    if let Some(a) = unknown.as_mut() {
        a.reason = Some("run 0000000000000002 is not in this log".into());
    }
    assert!(feed(&mut e, &g, unknown).is_empty());
    assert_eq!(e.prepared_len(), 1);
    assert_eq!(e.locks_len(), 1);
    assert_eq!((e.resource().applied, e.resource().released), (0, 0));
    let shown = last_answer(&e);
    assert!(
        shown.contains("unknown") && shown.contains("not in this log"),
        "{shown}"
    );
    // Asked again after the backoff, like after `pending`.
    assert!(e.step(Event::Tick { now_ms: 1_119 }).is_empty());
    assert_eq!(e.step(Event::Tick { now_ms: 1_120 }).len(), 1);
}

#[test]
fn answers_from_a_stale_epoch_or_another_coordinator_are_ignored() {
    let (mut e, g) = in_doubt();
    // The coordinator has since restarted at epoch 5 and said so.
    assert_eq!(
        rejected(&reply(&commit(&mut e, "ghost", 5))),
        Some(ErrorCode::NotPrepared)
    );
    for (ignored, who) in [
        (
            answer(DecisionStatus::Abort, Some(C1), Some(4)),
            "epoch 4 < 5",
        ),
        (
            answer(DecisionStatus::Abort, Some("c2"), Some(9)),
            "another coordinator",
        ),
        (
            answer(DecisionStatus::Commit, Some("c2"), Some(5)),
            "another coordinator",
        ),
    ] {
        assert!(feed(&mut e, &g, ignored).is_empty(), "{who}");
        assert_eq!(e.prepared_len(), 1, "{who}");
        assert_eq!(e.locks_len(), 1, "{who}");
        assert_eq!(
            (e.resource().applied, e.resource().released),
            (0, 0),
            "{who}"
        );
        assert!(
            last_answer(&e).contains("ignored"),
            "{who}: {}",
            last_answer(&e)
        );
    }
    let obeyed = feed(
        &mut e,
        &g,
        answer(DecisionStatus::Commit, Some(C1), Some(5)),
    );
    match logs(&obeyed)[..] {
        [
            (
                Record::Committed {
                    gtid,
                    epoch,
                    incarnation,
                    ..
                },
                true,
            ),
        ] => {
            assert_eq!(gtid, &g);
            assert_eq!(
                (*epoch, *incarnation),
                (Epoch(5), run(5)),
                "the fence it holds"
            );
        }
        ref other => panic!("the right coordinator's commit is obeyed: {other:?}"),
    }
    assert_eq!(e.prepared_len(), 0);
    assert_eq!(e.resource().counts["a"], 1);
}

#[test]
fn a_gtid_naming_another_coordinator_is_rejected_and_leaves_no_trace() {
    let mut e = engine();
    let c1 = from(C1, 1);
    let foreign = [
        gtid_of("c2", run(1), 7),
        // Starts with "c1" but names coordinator "c10".
        gtid_of("c10", run(1), 7),
        GlobalTxId::new("c1-7").unwrap(),
        GlobalTxId::new("c1:not-a-run:7").unwrap(),
    ];
    for g in &foreign {
        for commands in [
            p_as(&mut e, "t1", g, &c1, add("a", 1)),
            commit_as(&mut e, "t1", g, &c1),
            abort_as(&mut e, "t1", g, &c1),
        ] {
            assert_eq!(commands.len(), 1, "nothing logged for {g}: {commands:?}");
            match reply(&commands) {
                Reply::Reject(rejection @ Rejection::ForeignAttempt { .. }) => {
                    assert_eq!(rejection.code(), ErrorCode::InvalidId);
                    assert_eq!(rejection.code().status(), 422);
                }
                wrong => panic!("{g} is not c1's: {wrong:?}"),
            }
        }
    }
    assert_eq!(e.prepared_len(), 0);
    assert_eq!(e.locks_len(), 0);
    assert_eq!(e.tombstones_len(), 0);
    assert_eq!(
        e.highest_epoch(&coord(C1)),
        None,
        "no epoch raised by a refused message"
    );
    // c1's own id for the same request is fine.
    assert_eq!(
        reply(&p_as(
            &mut e,
            "t1",
            &gtid_of(C1, run(1), 7),
            &c1,
            add("a", 1)
        )),
        Reply::Vote(Vote::Yes)
    );
}

#[test]
fn an_attempt_whose_tombstone_expired_is_never_prepared_again() {
    // Tombstones expire after 50 ms here. An expired one leaves a mark for its run: a late
    // duplicate prepare that voted yes afresh could be committed a second time.
    let mut e = Engine::new(
        EngineConfig {
            tombstone_retention_ms: 50,
            ..EngineConfig::default()
        },
        Tally::default(),
    );
    let one = from(C1, 1);
    let (old, newer, other_run) = (
        gtid_of(C1, run(1), 5),
        gtid_of(C1, run(1), 6),
        gtid_of(C1, run(2), 1),
    );
    assert_eq!(
        reply(&p_as(&mut e, "t1", &old, &one, add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    assert_eq!(reply(&commit_as(&mut e, "t1", &old, &one)), Reply::Ack);
    let late = |e: &mut Engine<Tally>, g: &GlobalTxId, now_ms| {
        e.step(Event::Prepare {
            request: prepare_as("t1", g, &one, add("a", 1)),
            now_ms,
            waiter: 0,
        })
    };
    let again = late(&mut e, &old, 10_000);
    assert!(no()(&reply(&again)), "{again:?}");
    assert!(logs(&again).is_empty(), "{again:?}");
    assert_eq!(e.tombstones_len(), 0, "the tombstone itself is gone");
    assert_eq!(e.prepared_len(), 0);
    // Its coordinator's resent commit is acked from the mark, and applies nothing.
    assert_eq!(reply(&commit_as(&mut e, "t1", &old, &one)), Reply::Ack);
    assert_eq!(e.resource().applied, 1);
    // An abort below the mark needs no tombstone of its own: its late prepare votes no anyway.
    let below = gtid_of(C1, run(1), 3);
    let aborted = abort_as(&mut e, "t0", &below, &one);
    assert_eq!(reply(&aborted), Reply::Ack);
    assert!(
        matches!(logs(&aborted)[..], [(Record::Fence { .. }, true)]),
        "{aborted:?}"
    );
    assert_eq!(e.tombstones_len(), 0);
    assert!(no()(&reply(&late(&mut e, &below, 10_000))));
    // The mark survives a checkpoint.
    let mut e = Engine::<Tally>::restore(no_wait(), e.snapshot().unwrap()).unwrap();
    assert!(no()(&reply(&late(&mut e, &old, 10_000))));
    // Later positions of that run, and other runs, are judged afresh.
    assert_eq!(reply(&late(&mut e, &newer, 10_000)), Reply::Vote(Vote::Yes));
    assert_eq!(reply(&commit_as(&mut e, "t1", &newer, &one)), Reply::Ack);
    assert_eq!(
        reply(&p_as(&mut e, "t1", &other_run, &from(C1, 2), add("a", 1))),
        Reply::Vote(Vote::Yes)
    );
    assert_eq!(e.resource().applied, 2);
}

#[test]
fn an_attempt_is_told_as_prepared_committed_aborted_refused_forgotten_or_unknown() {
    use protocol::operator::AttemptState;
    let mut e = Engine::new(
        EngineConfig {
            tombstone_retention_ms: 50,
            ..no_wait()
        },
        Tally::default(),
    );
    let state = |e: &Engine<Tally>, txid: &str| e.attempt_status(&gtid(txid)).state;
    assert_eq!(state(&e, "never"), AttemptState::Unknown);
    p(&mut e, "held", 1, add("a", 1));
    let held = e.attempt_status(&gtid("held"));
    assert_eq!(held.state, AttemptState::Prepared);
    assert_eq!(held.txid, Some(tx("held")));
    assert_eq!(held.prepared_at_ms, Some(10));
    p(&mut e, "done", 1, add("b", 1));
    commit(&mut e, "done", 1);
    assert_eq!(state(&e, "done"), AttemptState::Committed);
    p(&mut e, "undone", 1, add("c", 1));
    abort(&mut e, "undone", 1);
    assert_eq!(state(&e, "undone"), AttemptState::Aborted);
    p(&mut e, "no", 1, add("d", -1));
    assert_eq!(state(&e, "no"), AttemptState::Refused);
    // Retention drops the tombstones: the participant cannot say how they ended any more.
    e.step(Event::Tick { now_ms: 10_000 });
    assert_eq!(state(&e, "done"), AttemptState::Forgotten);
    assert_eq!(state(&e, "undone"), AttemptState::Forgotten);
    assert_eq!(
        state(&e, "held"),
        AttemptState::Prepared,
        "prepared is never dropped"
    );
}

#[test]
fn a_forged_epoch_far_above_the_highest_is_refused_and_fences_nobody_out() {
    // Issue 17: one message with epoch = u64::MAX used to raise the mark for ever, and every
    // later message of the real coordinator was stale.
    let mut e = Engine::new(
        EngineConfig {
            epoch_jump_max: Some(1_000),
            ..no_wait()
        },
        Tally::default(),
    );
    p(&mut e, "t1", 5, add("a", 1));
    for forged in [
        p(&mut e, "t2", u64::MAX, add("b", 1)),
        commit(&mut e, "t1", u64::MAX),
        abort(&mut e, "t1", 1_006),
    ] {
        assert_eq!(rejected(&reply(&forged)), Some(ErrorCode::EpochTooHigh));
        assert!(logs(&forged).is_empty(), "a refused jump logs nothing");
    }
    assert_eq!(e.highest_epoch(&coord(C1)).map(|f| f.epoch), Some(Epoch(5)));
    assert_eq!(e.prepared_len(), 1, "t1 is still prepared, t2 never was");
    // The real coordinator, restarted a thousand times, is still let in.
    assert_eq!(reply(&commit(&mut e, "t1", 1_005)), Reply::Ack);
    // With peers authenticating there is no bound: only the coordinator reaches the engine.
    let mut trusting = Engine::new(
        EngineConfig {
            epoch_jump_max: None,
            ..no_wait()
        },
        Tally::default(),
    );
    assert!(matches!(
        reply(&p(&mut trusting, "t1", u64::MAX - 1, add("a", 1))),
        Reply::Vote(_)
    ));
}

#[test]
fn the_participants_a_prepare_named_are_vouched_for_across_replay_and_snapshots() {
    use protocol::ParticipantName;
    let names = |list: &[&str]| -> Option<Vec<ParticipantName>> {
        Some(
            list.iter()
                .map(|n| ParticipantName::new(*n).unwrap())
                .collect(),
        )
    };
    let named = |txid: &str, list: &[&str]| protocol::PrepareRequest {
        participants: names(list),
        ..prepare(txid, 1, add("a", 1))
    };
    let step = |e: &mut Engine<Tally>, log: &mut Vec<Record>, request| {
        let event = Event::Prepare {
            request,
            now_ms: 10,
            waiter: 0,
        };
        reply(&run_log(e, log, event))
    };
    let mut e = engine();
    let mut log = Vec::new();
    let list = ["inventory", "payments"];
    assert_eq!(
        step(&mut e, &mut log, named("t1", &list)),
        Reply::Vote(Vote::Yes)
    );
    let vouched = |e: &Engine<Tally>| e.attempt_status(&gtid("t1"));
    assert_eq!(vouched(&e).participants, names(&list));
    assert_eq!(vouched(&e).txid, Some(tx("t1")));
    // A retry with the same list is the same yes; one naming another list is not that attempt.
    assert_eq!(
        step(&mut e, &mut log, named("t1", &list)),
        Reply::Vote(Vote::Yes)
    );
    let other = step(&mut e, &mut log, named("t1", &["inventory"]));
    assert!(no()(&other), "{other:?}");
    assert_eq!(
        vouched(&e).participants,
        names(&list),
        "the prepared one stays"
    );
    // Nor one under another client id with the same gtid.
    let renamed = protocol::PrepareRequest {
        txid: tx("someone-else"),
        ..named("t1", &list)
    };
    assert!(no()(&step(&mut e, &mut log, renamed)));
    // The list is in the forced record, so a restart and a checkpoint keep vouching for it.
    assert_eq!(vouched(&replayed(&log)).participants, names(&list));
    let restored = Engine::<Tally>::restore(no_wait(), e.snapshot().unwrap()).unwrap();
    assert_eq!(vouched(&restored).participants, names(&list));
    // A prepare that named no list (an older coordinator) vouches for none.
    p(&mut e, "t2", 1, add("b", 1));
    assert_eq!(e.attempt_status(&gtid("t2")).participants, None);
}
