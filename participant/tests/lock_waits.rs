//! Lock waits in the pure engine: a prepare that meets keys held by older attempts queues, is
//! granted in age order when they are released, and votes no at its deadline; one that meets a
//! younger holder votes no at once, so no two attempts can wait for each other.

mod common;

use common::{Tally, add, decision, gtid, prepare};
use participant::record::Record;
use participant::{Command, Engine, EngineConfig, Event, Reply};
use protocol::{GlobalTxId, Vote};
use serde_json::{Value, json};

fn config(lock_wait_max_ms: u64, lock_waiters_max: usize) -> EngineConfig {
    EngineConfig {
        lock_wait_max_ms,
        lock_waiters_max,
        ..EngineConfig::default()
    }
}

fn engine() -> Engine<Tally> {
    Engine::new(config(1_000, 16), Tally::default())
}

/// A prepare of `txid`'s attempt that the coordinator started at `started_ms`, arriving at
/// `now_ms`, as request `waiter`.
fn prep(
    e: &mut Engine<Tally>,
    txid: &str,
    started_ms: u64,
    payload: Value,
    now_ms: u64,
    waiter: u64,
) -> Vec<Command> {
    let mut request = prepare(txid, 1, payload);
    request.started_at_ms = Some(started_ms);
    e.step(Event::Prepare {
        request,
        now_ms,
        waiter,
    })
}

fn commit(e: &mut Engine<Tally>, txid: &str, now_ms: u64) -> Vec<Command> {
    e.step(Event::Commit {
        request: decision(txid, 1),
        now_ms,
    })
}

fn abort(e: &mut Engine<Tally>, txid: &str, now_ms: u64) -> Vec<Command> {
    e.step(Event::Abort {
        request: decision(txid, 1),
        now_ms,
    })
}

fn tick(e: &mut Engine<Tally>, now_ms: u64) -> Vec<Command> {
    e.step(Event::Tick { now_ms })
}

/// The reply to the step's own request, if it got one.
fn reply(commands: &[Command]) -> Option<Reply> {
    commands.iter().find_map(|c| match c {
        Command::Reply(r) => Some(r.clone()),
        _ => None,
    })
}

/// The deferred answers in a step, in order: (waiter, reply).
fn delivered(commands: &[Command]) -> Vec<(u64, Reply)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Deliver { waiter, reply } => Some((*waiter, reply.clone())),
            _ => None,
        })
        .collect()
}

fn yes() -> Reply {
    Reply::Vote(Vote::Yes)
}

fn no_reason(reply: &Reply) -> &str {
    match reply {
        Reply::Vote(Vote::No { reason }) => reason,
        other => panic!("not a no vote: {other:?}"),
    }
}

fn prepared(e: &Engine<Tally>) -> Vec<GlobalTxId> {
    e.prepared_list().into_iter().map(|p| p.gtid).collect()
}

#[test]
fn a_prepare_behind_an_older_holder_queues_and_gets_yes_after_the_commit() {
    let mut e = engine();
    assert_eq!(
        reply(&prep(&mut e, "old", 1, add("a", 1), 10, 1)),
        Some(yes())
    );
    let queued = prep(&mut e, "new", 2, add("a", 2), 11, 2);
    assert_eq!(reply(&queued), None, "queued, no answer yet: {queued:?}");
    assert!(delivered(&queued).is_empty());
    assert_eq!(e.waiting_list(), vec![gtid("new")]);
    // The commit that frees `a` grants the waiter in the same step: its Prepared record is
    // forced, and its yes comes after it in the command list.
    let freed = commit(&mut e, "old", 20);
    assert_eq!(reply(&freed), Some(Reply::Ack));
    let record_at = freed
        .iter()
        .position(|c| {
            matches!(c, Command::Log { record: Record::Prepared { gtid: g, started_at_ms: Some(2), .. }, forced: true } if *g == gtid("new"))
        })
        .expect("the granted waiter's Prepared record is logged, forced");
    let deliver_at = freed
        .iter()
        .position(|c| matches!(c, Command::Deliver { waiter: 2, .. }))
        .expect("the waiter is answered");
    assert!(record_at < deliver_at, "{freed:?}");
    assert_eq!(delivered(&freed), vec![(2, yes())]);
    assert_eq!(prepared(&e), vec![gtid("new")]);
    assert_eq!(e.waiting_len(), 0);
    assert_eq!(reply(&commit(&mut e, "new", 30)), Some(Reply::Ack));
    assert_eq!(e.resource().counts["a"], 3);
}

#[test]
fn three_waiters_on_one_key_are_granted_oldest_first_one_at_a_time() {
    let mut e = engine();
    assert_eq!(
        reply(&prep(&mut e, "h", 1, add("k", 1), 10, 1)),
        Some(yes())
    );
    // They arrive out of age order; the queue is in age (start) order.
    assert_eq!(reply(&prep(&mut e, "w3", 4, add("k", 1), 11, 3)), None);
    assert_eq!(reply(&prep(&mut e, "w1", 2, add("k", 1), 12, 4)), None);
    assert_eq!(reply(&prep(&mut e, "w2", 3, add("k", 1), 13, 5)), None);
    assert_eq!(e.waiting_list(), vec![gtid("w1"), gtid("w2"), gtid("w3")]);
    assert_eq!(delivered(&commit(&mut e, "h", 20)), vec![(4, yes())]);
    assert_eq!(delivered(&commit(&mut e, "w1", 21)), vec![(5, yes())]);
    assert_eq!(delivered(&abort(&mut e, "w2", 22)), vec![(3, yes())]);
    assert_eq!(prepared(&e), vec![gtid("w3")]);
    assert_eq!(
        e.resource().counts["k"],
        2,
        "h and w1 committed, w2 aborted"
    );
}

#[test]
fn a_waiter_past_its_deadline_votes_no_with_lock_timeout_and_is_remembered() {
    let mut e = engine();
    prep(&mut e, "h", 1, add("k", 1), 10, 1);
    let mut request = prepare("w", 1, add("k", 1));
    request.started_at_ms = Some(2);
    // The request asks for less than the participant's maximum (1000 ms): 300 ms it is.
    request.lock_wait_ms = Some(300);
    assert_eq!(
        reply(&e.step(Event::Prepare {
            request,
            now_ms: 100,
            waiter: 7
        })),
        None
    );
    assert!(delivered(&tick(&mut e, 399)).is_empty(), "not yet");
    let timed_out = tick(&mut e, 400);
    let answers = delivered(&timed_out);
    assert_eq!(answers.len(), 1, "{timed_out:?}");
    assert_eq!(answers[0].0, 7);
    let reason = no_reason(&answers[0].1);
    assert!(
        reason.starts_with("lock_timeout:")
            && reason.contains("300 ms")
            && reason.contains("\"k\"")
            && reason.contains(gtid("h").as_str()),
        "{reason}"
    );
    assert!(timed_out.iter().any(|c| matches!(
        c,
        Command::Log {
            record: Record::Refused { .. },
            ..
        }
    )));
    assert_eq!(e.waiting_len(), 0);
    // A duplicate prepare gets the same no from the tombstone, at once.
    let again = prep(&mut e, "w", 2, add("k", 1), 500, 8);
    assert_eq!(no_reason(&reply(&again).unwrap()), reason);
    // The holder was untouched.
    assert_eq!(prepared(&e), vec![gtid("h")]);
}

#[test]
fn a_prepare_meeting_a_younger_holder_votes_lock_conflict_at_once() {
    let mut e = engine();
    assert_eq!(
        reply(&prep(&mut e, "young", 50, add("k", 1), 10, 1)),
        Some(yes())
    );
    let answer = reply(&prep(&mut e, "old", 5, add("k", 1), 11, 2)).unwrap();
    let reason = no_reason(&answer);
    assert!(
        reason.starts_with("lock_conflict:") && reason.contains(gtid("young").as_str()),
        "{reason}"
    );
    assert_eq!(e.waiting_len(), 0);
    // Its retry is a new attempt, started later than the holder: it waits.
    assert_eq!(
        reply(&prep(&mut e, "old-retry", 60, add("k", 1), 12, 3)),
        None
    );
    assert_eq!(e.waiting_len(), 1);
}

#[test]
fn crossed_attempts_on_two_participants_never_both_wait() {
    // p1 and p2 each hold one attempt's first key; each attempt then prepares its second key
    // at the other participant. With waits by age only the younger dies: there is never a
    // cycle of two waiters.
    for (a_start, b_start) in [(1, 2), (2, 1), (7, 7)] {
        let mut p1 = engine();
        let mut p2 = engine();
        assert_eq!(
            reply(&prep(&mut p1, "a", a_start, add("x", 1), 10, 1)),
            Some(yes())
        );
        assert_eq!(
            reply(&prep(&mut p2, "b", b_start, add("y", 1), 10, 1)),
            Some(yes())
        );
        let b_at_p1 = reply(&prep(&mut p1, "b", b_start, add("x", 1), 11, 2));
        let a_at_p2 = reply(&prep(&mut p2, "a", a_start, add("y", 1), 11, 2));
        let waiting = [&b_at_p1, &a_at_p2].iter().filter(|r| r.is_none()).count();
        assert_eq!(
            waiting, 1,
            "exactly one waits ({a_start}, {b_start}): {b_at_p1:?} {a_at_p2:?}"
        );
        let died = [b_at_p1, a_at_p2].into_iter().flatten().next().unwrap();
        assert!(no_reason(&died).starts_with("lock_conflict:"), "{died:?}");
        // The younger waits where the older holds its key; the older died where the younger
        // holds one. The coordinator aborts the older (it got a no) and the younger is granted.
        let a_older = (a_start, gtid("a")) < (b_start, gtid("b"));
        let (older, older_home) = if a_older {
            ("a", &mut p1)
        } else {
            ("b", &mut p2)
        };
        assert_eq!(older_home.waiting_len(), 1);
        let freed = abort(older_home, older, 20);
        assert_eq!(delivered(&freed), vec![(2, yes())]);
        assert_eq!(older_home.waiting_len(), 0);
        assert_eq!(older_home.prepared_len(), 1);
    }
}

#[test]
fn an_abort_of_a_holder_or_a_timeout_ahead_releases_the_next_waiter() {
    let mut e = engine();
    prep(&mut e, "h", 1, add("k", 1), 10, 1);
    // w1 asks to wait 100 ms, w2 the maximum: w2 is behind w1 in the queue.
    let mut request = prepare("w1", 1, add("k", 1));
    request.started_at_ms = Some(2);
    request.lock_wait_ms = Some(100);
    assert_eq!(
        reply(&e.step(Event::Prepare {
            request,
            now_ms: 10,
            waiter: 2
        })),
        None
    );
    assert_eq!(reply(&prep(&mut e, "w2", 3, add("k", 1), 10, 3)), None);
    // w1 times out; w2 still waits for h.
    let t = tick(&mut e, 110);
    assert_eq!(delivered(&t).len(), 1);
    assert_eq!(delivered(&t)[0].0, 2);
    assert_eq!(e.waiting_list(), vec![gtid("w2")]);
    // h is aborted: w2 is granted in that step.
    assert_eq!(delivered(&abort(&mut e, "h", 120)), vec![(3, yes())]);
    assert_eq!(prepared(&e), vec![gtid("w2")]);
    assert_eq!(e.resource().released, 1);
}

#[test]
fn a_timeout_of_the_waiter_ahead_lets_one_behind_it_go_when_its_keys_are_free() {
    // w1 (older) wants a and b; b is held. w2 (younger) wants only a, which is free, but
    // w1 is ahead on a: w2 queues. When w1 times out, w2 is granted at once.
    let mut e = engine();
    prep(&mut e, "hb", 1, add("b", 1), 10, 1);
    let mut request = prepare("w1", 1, json!({"key": "a", "n": 1, "also": ["b"]}));
    request.started_at_ms = Some(2);
    request.lock_wait_ms = Some(50);
    assert_eq!(
        reply(&e.step(Event::Prepare {
            request,
            now_ms: 10,
            waiter: 2
        })),
        None
    );
    assert_eq!(reply(&prep(&mut e, "w2", 3, add("a", 1), 11, 3)), None);
    let t = tick(&mut e, 60);
    let answers = delivered(&t);
    assert_eq!(answers.len(), 2, "{t:?}");
    assert!(no_reason(&answers[0].1).starts_with("lock_timeout:"));
    assert_eq!(answers[1], (3, yes()));
}

#[test]
fn a_multi_key_waiter_is_not_granted_while_any_of_its_keys_is_held() {
    let mut e = engine();
    prep(&mut e, "ha", 1, add("a", 1), 10, 1);
    prep(&mut e, "hb", 2, add("b", 1), 10, 2);
    let both = json!({"key": "a", "n": 1, "also": ["b"]});
    assert_eq!(reply(&prep(&mut e, "w", 3, both, 11, 3)), None);
    assert!(
        delivered(&commit(&mut e, "ha", 20)).is_empty(),
        "b is still held"
    );
    assert_eq!(e.waiting_len(), 1);
    assert_eq!(delivered(&commit(&mut e, "hb", 21)), vec![(3, yes())]);
    assert_eq!(e.locks_len(), 2, "w holds a and b");
}

#[test]
fn past_the_waiter_bound_a_conflicting_prepare_votes_no_at_once() {
    let mut e = Engine::new(config(1_000, 2), Tally::default());
    prep(&mut e, "h", 1, add("k", 1), 10, 1);
    assert_eq!(reply(&prep(&mut e, "w1", 2, add("k", 1), 10, 2)), None);
    assert_eq!(reply(&prep(&mut e, "w2", 3, add("k", 1), 10, 3)), None);
    let over = reply(&prep(&mut e, "w3", 4, add("k", 1), 10, 4)).unwrap();
    let reason = no_reason(&over);
    assert!(
        reason.starts_with("lock_conflict: too many waiters"),
        "{reason}"
    );
    assert_eq!(e.waiting_len(), 2);
}

#[test]
fn with_no_wait_allowed_a_conflict_votes_no_at_once_as_before() {
    let mut e = Engine::new(config(0, 16), Tally::default());
    prep(&mut e, "h", 1, add("k", 1), 10, 1);
    let answer = reply(&prep(&mut e, "w", 2, add("k", 1), 10, 2)).unwrap();
    assert!(
        no_reason(&answer).starts_with("lock_conflict:"),
        "{answer:?}"
    );
    assert_eq!(e.waiting_len(), 0);
}

#[test]
fn a_duplicate_prepare_while_waiting_shares_the_one_queue_entry_and_its_outcome() {
    let mut e = engine();
    prep(&mut e, "h", 1, add("k", 1), 10, 1);
    assert_eq!(reply(&prep(&mut e, "w", 2, add("k", 2), 11, 2)), None);
    assert_eq!(reply(&prep(&mut e, "w", 2, add("k", 2), 12, 3)), None);
    assert_eq!(e.waiting_len(), 1, "one queue entry");
    // Another payload under the same attempt: no at once, the queued one stays.
    let other = reply(&prep(&mut e, "w", 2, add("k", 9), 13, 4)).unwrap();
    assert!(no_reason(&other).contains("different payload"), "{other:?}");
    let freed = commit(&mut e, "h", 20);
    assert_eq!(delivered(&freed), vec![(2, yes()), (3, yes())]);
    let prepared_records = freed
        .iter()
        .filter(|c| {
            matches!(
                c,
                Command::Log {
                    record: Record::Prepared { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(prepared_records, 1);
}

#[test]
fn an_abort_while_waiting_removes_the_waiter_and_leaves_a_tombstone() {
    let mut e = engine();
    prep(&mut e, "h", 1, add("k", 1), 10, 1);
    assert_eq!(reply(&prep(&mut e, "w", 2, add("k", 1), 11, 2)), None);
    // A commit for it is impossible: it never voted yes.
    match reply(&commit(&mut e, "w", 15)) {
        Some(Reply::Reject(rejection)) => {
            assert!(
                rejection.to_string().contains("never prepared"),
                "{rejection}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.waiting_len(), 1, "the bad commit changed nothing");
    let aborted = abort(&mut e, "w", 20);
    assert_eq!(reply(&aborted), Some(Reply::Ack));
    let answers = delivered(&aborted);
    assert_eq!(answers.len(), 1);
    assert!(no_reason(&answers[0].1).contains("aborted while waiting for a lock"));
    assert!(aborted.iter().any(|c| matches!(
        c,
        Command::Log {
            record: Record::Aborted { .. },
            forced: true
        }
    )));
    assert_eq!(e.waiting_len(), 0);
    // A late duplicate prepare votes no from the tombstone; the holder's commit grants nobody.
    assert!(
        no_reason(&reply(&prep(&mut e, "w", 2, add("k", 1), 30, 3)).unwrap()).contains("aborted")
    );
    assert!(delivered(&commit(&mut e, "h", 40)).is_empty());
}

#[test]
fn a_granted_waiter_runs_the_business_check_and_may_still_vote_no() {
    let mut e = engine();
    prep(&mut e, "h", 1, add("k", 1), 10, 1);
    assert_eq!(reply(&prep(&mut e, "w", 2, add("k", -1), 11, 2)), None);
    let freed = commit(&mut e, "h", 20);
    let answers = delivered(&freed);
    assert!(no_reason(&answers[0].1).contains("negative"), "{answers:?}");
    assert_eq!(e.prepared_len(), 0);
    assert_eq!(e.locks_len(), 0);
}

#[test]
fn after_a_restart_waiters_are_gone_and_holders_keep_their_locks_and_age() {
    let mut e = engine();
    let mut log = Vec::new();
    let keep = |commands: Vec<Command>, log: &mut Vec<Record>| {
        for c in commands {
            if let Command::Log { record, .. } = c {
                log.push(record);
            }
        }
    };
    keep(prep(&mut e, "h", 5, add("k", 1), 10, 1), &mut log);
    keep(prep(&mut e, "w", 6, add("k", 1), 11, 2), &mut log);
    assert_eq!(e.waiting_len(), 1);
    let mut replayed = engine();
    for record in &log {
        replayed.replay(record.clone()).unwrap();
    }
    let restored = Engine::<Tally>::restore(config(1_000, 16), e.snapshot().unwrap()).unwrap();
    for mut r in [replayed, restored] {
        assert_eq!(r.waiting_len(), 0, "waiters are never logged");
        assert_eq!(prepared(&r), vec![gtid("h")]);
        assert_eq!(r.locks_len(), 1);
        // The holder kept its start time (5), not its prepare time (10): one started at 7 is
        // younger and waits, one started at 4 is older and dies.
        let older = reply(&prep(&mut r, "older", 4, add("k", 1), 20, 3)).unwrap();
        assert!(no_reason(&older).starts_with("lock_conflict:"), "{older:?}");
        assert_eq!(reply(&prep(&mut r, "w", 7, add("k", 1), 21, 4)), None);
        assert_eq!(delivered(&commit(&mut r, "h", 30)), vec![(4, yes())]);
    }
}
