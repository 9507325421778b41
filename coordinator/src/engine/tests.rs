//! Table-driven engine tests: each case feeds events and asserts the exact commands of the
//! last one. The cases named `mistake_*` are the seeds' "common implementation mistakes" that
//! apply to a coordinator, each written so that an engine making that mistake fails it.
//! Attempts, runs and the decision for participants in doubt are in `tests_attempts.rs`.

use protocol::{
    CoordinatorId, Decision, DecisionQuery, DecisionStatus, Epoch, Incarnation, Outcome,
    ParticipantResult, TransactionResponse, TransactionState, VoteKind,
};
use serde_json::json;

use super::test_support::{coordinator, id, name, run, split_archives};
use super::*;
use crate::digest::Digest;
use crate::records::{
    AckRecord, Attempt, BeginRecord, DecisionRecord, EndRecord, EpochRecord, LogRecord,
};

const CONFIG: EngineConfig = EngineConfig {
    retry_base_ms: 100,
    retry_max_ms: 1000,
    retained_max: 1000,
    bounds: crate::engine::Bounds::UNBOUNDED,
};

/// The run the tests' engines start as, and the run after a restart.
const RUN1: Incarnation = Incarnation(0xa1);
const RUN2: Incarnation = Incarnation(0xb2);

fn identity() -> EpochRecord {
    run(RUN1, 1)
}
fn next_identity() -> EpochRecord {
    run(RUN2, 2)
}
fn recovered(now_ms: u64) -> Event {
    Event::RecoveryDone {
        now_ms,
        identity: next_identity(),
    }
}
/// The first attempt of the first run: what the first submit of a fresh engine gets.
fn first() -> Attempt {
    Attempt::new(&coordinator(), RUN1, 1)
}
/// What a participant that was prepared for `attempt` asks with.
fn query_for(attempt: &Attempt) -> DecisionQuery {
    DecisionQuery {
        gtid: attempt.gtid.clone(),
        incarnation: attempt.incarnation,
        epoch: if attempt.incarnation == RUN1 {
            Epoch(1)
        } else {
            Epoch(2)
        },
        position: attempt.position,
    }
}
/// The decision a participant prepared for `attempt` of `txid` hears.
fn ask(engine: &Engine, txid: &str, attempt: &Attempt) -> DecisionStatus {
    engine
        .decision_for(&id(txid), Some(&query_for(attempt)))
        .decision
}

fn submit_as(waiter: WaiterId, wait: WaitFor, digest: u128) -> Event {
    Event::Submit {
        waiter,
        wait,
        txid: id("t"),
        digest: Digest(digest),
        participants: vec![(name("a"), json!({"pa": 1})), (name("b"), json!({"pb": 2}))],
        timeout_ms: 500,
        now_ms: 1000,
        archived: None,
        archive_generation: 0,
        client: None,
    }
}
fn submit() -> Event {
    submit_as(1, WaitFor::Decision, 7)
}
fn vote(p: &str, vote: VoteKind) -> Event {
    Event::VoteReceived {
        txid: id("t"),
        participant: name(p),
        vote,
        reason: (vote != VoteKind::Yes).then(|| "because".to_string()),
        now_ms: 1100,
    }
}
fn durable() -> Event {
    Event::DecisionDurable { txid: id("t") }
}
fn ack(p: &str) -> Event {
    Event::Acked {
        txid: id("t"),
        participant: name(p),
        now_ms: 1200,
    }
}
fn failed(p: &str, jitter: u64) -> Event {
    Event::DeliveryFailed {
        txid: id("t"),
        participant: name(p),
        error: "connection refused".into(),
        jitter,
    }
}
fn retry(p: &str) -> Event {
    Event::RetryDue {
        txid: id("t"),
        participant: name(p),
    }
}
fn deadline() -> Event {
    Event::PrepareDeadline {
        txid: id("t"),
        now_ms: 1500,
    }
}

fn begin_record(attempt: Attempt, digest: u128, at: u64) -> LogRecord {
    LogRecord::Begin(BeginRecord {
        txid: id("t"),
        attempt,
        digest: Digest(digest),
        participants: vec![name("a"), name("b")],
        created_at_ms: at,
        client: None,
    })
}
fn decision(d: Decision, votes: [VoteKind; 2], reason: Option<&str>, at: u64) -> DecisionRecord {
    DecisionRecord {
        txid: id("t"),
        attempt: first(),
        digest: Digest(7),
        decision: d,
        reason: reason.map(str::to_string),
        votes: vec![(name("a"), votes[0]), (name("b"), votes[1])],
        created_at_ms: 1000,
        decided_at_ms: at,
        client: None,
    }
}
fn append_decision(d: Decision, votes: [VoteKind; 2], reason: Option<&str>, at: u64) -> Command {
    Command::AppendDecision(decision(d, votes, reason, at))
}
fn send(p: &str, d: Decision, attempt: u32) -> Command {
    Command::SendDecision {
        txid: id("t"),
        gtid: first().gtid,
        participant: name(p),
        decision: d,
        attempt,
        tracked: true,
    }
}
fn outcome(waiter: WaiterId, o: Outcome, votes: [VoteKind; 2], acked: [bool; 2]) -> Command {
    let reason = match o {
        Outcome::Committed => None,
        Outcome::Aborted => Some("b voted no: because".to_string()),
    };
    Command::Reply {
        waiter,
        reply: Reply::Outcome(TransactionResponse {
            id: id("t"),
            gtid: first().gtid,
            outcome: o,
            reason,
            participants: vec![
                ParticipantResult {
                    name: name("a"),
                    vote: votes[0],
                    acked: acked[0],
                },
                ParticipantResult {
                    name: name("b"),
                    vote: votes[1],
                    acked: acked[1],
                },
            ],
        }),
    }
}
fn ack_record(p: &str) -> Command {
    Command::AppendLazy(LogRecord::Ack(AckRecord {
        txid: id("t"),
        participant: name(p),
    }))
}
fn end_record() -> Command {
    Command::AppendLazy(LogRecord::End(EndRecord {
        txid: id("t"),
        ended_at_ms: 1200,
    }))
}

use VoteKind::{Error as Err_, No, Timeout, Yes};
const COMMIT: Decision = Decision::Commit;
const ABORT: Decision = Decision::Abort;

/// Feeds `events` in order to a fresh engine and returns the commands of the last one.
fn last_commands(events: Vec<Event>) -> (Engine, Vec<Command>) {
    let mut engine = Engine::new(CONFIG, identity());
    let mut last = Vec::new();
    for event in events {
        last = engine.step(event);
    }
    (engine, last)
}

fn committed_and_durable() -> Vec<Event> {
    vec![submit(), vote("a", Yes), vote("b", Yes), durable()]
}

fn with(mut base: Vec<Event>, more: impl IntoIterator<Item = Event>) -> Vec<Event> {
    base.extend(more);
    base
}

#[test]
fn each_event_in_each_state_gives_exactly_these_commands() {
    let cases: Vec<(&str, Vec<Event>, Vec<Command>)> = vec![
        (
            "submit logs begin lazily, prepares everyone in parallel, arms the deadline",
            vec![submit()],
            vec![
                Command::AppendLazy(begin_record(first(), 7, 1000)),
                Command::SendPrepare {
                    txid: id("t"),
                    attempt: first(),
                    participant: name("a"),
                    payload: json!({"pa": 1}),
                    timeout_ms: 500,
                    started_at_ms: 1000,
                    named: vec![name("a"), name("b")],
                },
                Command::SendPrepare {
                    txid: id("t"),
                    attempt: first(),
                    participant: name("b"),
                    payload: json!({"pb": 2}),
                    timeout_ms: 500,
                    started_at_ms: 1000,
                    named: vec![name("a"), name("b")],
                },
                Command::ArmPrepareDeadline {
                    txid: id("t"),
                    after_ms: 500,
                },
            ],
        ),
        (
            "mistake_partial_votes: one yes of two decides nothing",
            vec![submit(), vote("a", Yes)],
            vec![],
        ),
        (
            "all yes: the commit decision is logged (forced), nothing is sent yet",
            vec![submit(), vote("a", Yes), vote("b", Yes)],
            vec![append_decision(COMMIT, [Yes, Yes], None, 1100)],
        ),
        (
            "one no: abort, with the participant's reason",
            vec![submit(), vote("a", Yes), vote("b", No)],
            vec![append_decision(
                ABORT,
                [Yes, No],
                Some("b voted no: because"),
                1100,
            )],
        ),
        (
            "mistake_timeout_as_neutral: a deadline with a vote missing aborts",
            vec![submit(), vote("a", Yes), deadline()],
            vec![append_decision(
                ABORT,
                [Yes, Timeout],
                Some("b did not vote in time"),
                1500,
            )],
        ),
        (
            "mistake_timeout_as_neutral: a timed-out prepare counts as no even if the rest said yes",
            vec![submit(), vote("a", Yes), vote("b", Timeout)],
            vec![append_decision(
                ABORT,
                [Yes, Timeout],
                Some("b did not vote in time"),
                1100,
            )],
        ),
        (
            "a malformed vote (error) aborts",
            vec![submit(), vote("a", Err_), vote("b", Yes)],
            vec![append_decision(
                ABORT,
                [Err_, Yes],
                Some("a did not answer with a vote: because"),
                1100,
            )],
        ),
        (
            "mistake_duplicate_vote: the same yes twice does not stand in for the other vote",
            vec![submit(), vote("a", Yes), vote("a", Yes)],
            vec![],
        ),
        (
            "a duplicate vote cannot replace the first one",
            vec![submit(), vote("a", No), vote("a", Yes), vote("b", Yes)],
            vec![append_decision(
                ABORT,
                [No, Yes],
                Some("a voted no: because"),
                1100,
            )],
        ),
        (
            "a vote from a participant not in the transaction is ignored",
            vec![submit(), vote("a", Yes), vote("zz", Yes)],
            vec![],
        ),
        (
            "a late vote after the decision changes nothing",
            vec![submit(), vote("a", Yes), deadline(), vote("b", Yes)],
            vec![],
        ),
        (
            "the deadline after the decision changes nothing",
            vec![submit(), vote("a", Yes), vote("b", Yes), deadline()],
            vec![],
        ),
        (
            "decision durable: the client hears, then phase two goes to everyone",
            committed_and_durable(),
            vec![
                outcome(1, Outcome::Committed, [Yes, Yes], [false, false]),
                send("a", COMMIT, 1),
                send("b", COMMIT, 1),
            ],
        ),
        (
            "no phase-two message and no ack handling before the decision is durable",
            vec![submit(), vote("a", Yes), vote("b", Yes), ack("a")],
            vec![],
        ),
        (
            "a retry timer before the decision is durable sends nothing",
            vec![submit(), vote("a", Yes), vote("b", Yes), retry("a")],
            vec![],
        ),
        (
            "first ack: logged lazily",
            with(committed_and_durable(), [ack("a")]),
            vec![ack_record("a")],
        ),
        (
            "mistake_duplicate_ack: a second ack from the same participant is not counted",
            with(committed_and_durable(), [ack("a"), ack("a")]),
            vec![],
        ),
        (
            "last ack: only End is logged (lazily); it implies every ack",
            with(committed_and_durable(), [ack("a"), ack("b")]),
            vec![end_record()],
        ),
        (
            "a failed delivery arms a retry with backoff (attempt 1: 50..=100 ms)",
            with(committed_and_durable(), [failed("a", 0)]),
            vec![Command::ArmRetry {
                txid: id("t"),
                participant: name("a"),
                after_ms: 50,
            }],
        ),
        (
            "the retry timer resends, counting the attempt",
            with(committed_and_durable(), [failed("a", 0), retry("a")]),
            vec![send("a", COMMIT, 2)],
        ),
        (
            "the second failure backs off further (attempt 2: 100..=200 ms, jitter 100 gives 200)",
            with(
                committed_and_durable(),
                [failed("a", 0), retry("a"), failed("a", 100)],
            ),
            vec![Command::ArmRetry {
                txid: id("t"),
                participant: name("a"),
                after_ms: 200,
            }],
        ),
        (
            "a stray retry timer while a delivery is in flight does not start a second one",
            with(committed_and_durable(), [retry("a")]),
            vec![],
        ),
        (
            "a failure reported after the ack changes nothing",
            with(committed_and_durable(), [ack("a"), failed("a", 0)]),
            vec![],
        ),
        (
            "mistake_duplicate_id: the same request again while preparing joins, never re-prepares",
            vec![submit(), submit_as(2, WaitFor::Decision, 7)],
            vec![],
        ),
        (
            "the same id with another body is a conflict",
            vec![submit(), submit_as(2, WaitFor::Decision, 8)],
            vec![Command::Reply {
                waiter: 2,
                reply: Reply::Conflict { txid: id("t") },
            }],
        ),
        (
            "both waiters of a duplicated request hear the one outcome",
            vec![
                submit(),
                submit_as(2, WaitFor::Decision, 7),
                vote("a", Yes),
                vote("b", Yes),
                durable(),
            ],
            vec![
                outcome(1, Outcome::Committed, [Yes, Yes], [false, false]),
                outcome(2, Outcome::Committed, [Yes, Yes], [false, false]),
                send("a", COMMIT, 1),
                send("b", COMMIT, 1),
            ],
        ),
        (
            "a retry after the decision answers at once with the recorded outcome",
            with(
                committed_and_durable(),
                [submit_as(3, WaitFor::Decision, 7)],
            ),
            vec![outcome(3, Outcome::Committed, [Yes, Yes], [false, false])],
        ),
        (
            "a retry after the end answers from the retained outcome",
            with(
                committed_and_durable(),
                [ack("a"), ack("b"), submit_as(4, WaitFor::Decision, 7)],
            ),
            vec![outcome(4, Outcome::Committed, [Yes, Yes], [true, true])],
        ),
        (
            "a different body after the end is still a conflict",
            with(
                committed_and_durable(),
                [ack("a"), ack("b"), submit_as(4, WaitFor::Decision, 9)],
            ),
            vec![Command::Reply {
                waiter: 4,
                reply: Reply::Conflict { txid: id("t") },
            }],
        ),
        (
            "wait=acked: nobody hears at the decision...",
            vec![
                submit_as(1, WaitFor::Acked, 7),
                vote("a", Yes),
                vote("b", Yes),
                durable(),
            ],
            vec![send("a", COMMIT, 1), send("b", COMMIT, 1)],
        ),
        (
            "...and the client hears at the last ack, with every ack true",
            vec![
                submit_as(1, WaitFor::Acked, 7),
                vote("a", Yes),
                vote("b", Yes),
                durable(),
                ack("b"),
                ack("a"),
            ],
            vec![
                end_record(),
                outcome(1, Outcome::Committed, [Yes, Yes], [true, true]),
            ],
        ),
        (
            "a decision that cannot be logged answers log_failed",
            vec![
                submit(),
                vote("a", Yes),
                vote("b", Yes),
                Event::DecisionFailed {
                    txid: id("t"),
                    error: "fsync failed".into(),
                },
            ],
            vec![Command::Reply {
                waiter: 1,
                reply: Reply::LogFailed {
                    error: "fsync failed".into(),
                },
            }],
        ),
        (
            "after a failed decision log, a durable notice is ignored (nothing is sent)",
            vec![
                submit(),
                vote("a", Yes),
                vote("b", Yes),
                Event::DecisionFailed {
                    txid: id("t"),
                    error: "fsync failed".into(),
                },
                durable(),
            ],
            vec![],
        ),
    ];
    for (what, events, expected) in cases {
        let (_, got) = last_commands(events);
        let (archives, got) = split_archives(got);
        assert_eq!(got, expected, "case: {what}");
        // Every End stages its outcome for the index, with the time the End names.
        let ends: Vec<u64> = got
            .iter()
            .filter_map(|c| match c {
                Command::AppendLazy(LogRecord::End(end)) => Some(end.ended_at_ms),
                _ => None,
            })
            .collect();
        let archived: Vec<u64> = archives.iter().map(|r| r.ended_at_ms).collect();
        assert_eq!(archived, ends, "case: {what}");
    }
}

#[test]
fn abort_outcome_reaches_client_and_participants() {
    let (engine, got) = last_commands(vec![submit(), vote("a", Yes), vote("b", No), durable()]);
    assert_eq!(
        got,
        // Presumed abort: only "a" voted yes and holds locks; "b" voted no and is owed
        // nothing, so it hears nothing and counts as done.
        vec![
            outcome(1, Outcome::Aborted, [Yes, No], [false, false]),
            send("a", ABORT, 1),
        ]
    );
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Abort);
    let status = engine.status(&id("t")).unwrap();
    assert_eq!(status.state, TransactionState::Aborting);
    assert_eq!(
        engine.gauges().pending_acks,
        1,
        "only the yes voter is pending"
    );
}

/// Under presumed abort an abort is owed only to yes voters: a participant whose vote never
/// came gets the abort once, untracked, and the transaction ends without waiting for it; so a
/// participant that is down adds no pending work however many attempts meet the outage.
#[test]
fn an_abort_is_owed_only_to_yes_voters() {
    let mut engine = Engine::new(CONFIG, identity());
    engine.step(submit());
    engine.step(vote("a", Yes));
    engine.step(Event::VoteReceived {
        txid: id("t"),
        participant: name("b"),
        vote: VoteKind::Error,
        reason: Some("connection refused".into()),
        now_ms: 1100,
    });
    let untracked = Command::SendDecision {
        txid: id("t"),
        gtid: first().gtid,
        participant: name("b"),
        decision: ABORT,
        attempt: 1,
        tracked: false,
    };
    let commands = engine.step(durable());
    assert!(commands.contains(&send("a", ABORT, 1)), "{commands:?}");
    assert!(commands.contains(&untracked), "{commands:?}");
    assert_eq!(engine.load(&name("b")), crate::engine::Load::default());
    assert_eq!(engine.load(&name("a")).pending_acks, 1);
    // The untracked one's failure changes nothing; the yes voter's ack ends it.
    let failed = engine.step(Event::DeliveryFailed {
        txid: id("t"),
        participant: name("b"),
        error: "connection refused".into(),
        jitter: 0,
    });
    assert_eq!(failed, vec![], "no retry for an untracked abort");
    let ended = engine.step(ack("a"));
    assert!(
        ended
            .iter()
            .any(|c| matches!(c, Command::AppendLazy(LogRecord::End(_)))),
        "{ended:?}"
    );
    assert_eq!(engine.gauges().pending_acks, 0);
    assert_eq!(engine.gauges().oldest_pending_ack_decided_at_ms, None);
    // A participant that prepared after all (its vote was lost) asks and hears abort.
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Abort);
}

#[test]
fn a_participant_hears_pending_until_the_decision_is_durable_then_the_outcome() {
    let mut engine = Engine::new(CONFIG, identity());
    // Not begun yet: the position is past what the log holds of this run, so no guess.
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Unknown);
    engine.step(submit());
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Pending);
    engine.step(vote("a", Yes));
    engine.step(vote("b", Yes));
    // Decided but not durable: a participant must not hear commit yet.
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Pending);
    engine.step(durable());
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Commit);
    engine.step(ack("a"));
    engine.step(ack("b"));
    // Ended: from the retained outcome, as a known answer (no presumption, no reason).
    assert_eq!(
        engine.decision_for(&id("t"), Some(&query_for(&first()))),
        DecisionAnswer {
            decision: DecisionStatus::Commit,
            reason: None,
            source: AnswerSource::Record,
            unknown_run: false,
        }
    );
    assert_eq!(
        engine.status(&id("t")).unwrap().state,
        TransactionState::Committed
    );

    // A decision that could not be made durable stays pending: its outcome is unknown until a
    // restart replays the log.
    let (engine, _) = last_commands(vec![
        submit(),
        vote("a", Yes),
        vote("b", Yes),
        Event::DecisionFailed {
            txid: id("t"),
            error: "fsync failed".into(),
        },
    ]);
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Pending);
}

#[test]
fn a_presumed_abort_writes_nothing_and_is_given_only_inside_the_logs_span() {
    let forget = Event::ExpireRetained {
        now_ms: 100_000,
        retention_ms: 1,
    };
    let ended_aborted = vec![
        submit(),
        vote("a", Yes),
        vote("b", No),
        durable(),
        ack("a"),
        ack("b"),
        forget.clone(),
    ];
    let ended_committed = with(committed_and_durable(), [ack("a"), ack("b"), forget]);
    let other_coordinator = Attempt::new(&CoordinatorId::new("c-2").unwrap(), RUN1, 1);
    let unreached = Attempt::new(&coordinator(), RUN1, 2);
    // (what, events, client id asked about, attempt asked about, expected, presumed abort?)
    type Case<'a> = (&'a str, Vec<Event>, &'a str, Attempt, DecisionStatus, bool);
    let cases: Vec<Case> = vec![
        (
            "an attempt of this run that ended and was forgotten: abort, from the span",
            ended_aborted.clone(),
            "t",
            first(),
            DecisionStatus::Abort,
            true,
        ),
        (
            "a committed attempt every participant acknowledged, once forgotten: presumed abort \
             (classic presumed abort: nobody left to ask)",
            ended_committed.clone(),
            "t",
            first(),
            DecisionStatus::Abort,
            true,
        ),
        (
            "a client id nobody submitted, at a covered position: abort",
            ended_aborted.clone(),
            "x",
            first(),
            DecisionStatus::Abort,
            true,
        ),
        (
            "a position this run has not reached: unknown, never abort",
            ended_aborted.clone(),
            "t",
            unreached,
            DecisionStatus::Unknown,
            false,
        ),
        (
            "an attempt id another coordinator composed: unknown",
            ended_aborted,
            "t",
            other_coordinator,
            DecisionStatus::Unknown,
            false,
        ),
        (
            "a live attempt: pending, not presumed",
            vec![submit()],
            "t",
            first(),
            DecisionStatus::Pending,
            false,
        ),
        (
            "a live attempt asked about under another client id: unknown, never a presumed \
             abort that its coming decision could contradict",
            vec![submit(), vote("a", Yes)],
            "x",
            first(),
            DecisionStatus::Unknown,
            false,
        ),
    ];
    for (what, events, txid, attempt, expected, is_presumed) in cases {
        let (engine, _) = last_commands(events);
        let before = engine.snapshot(identity());
        let answer = engine.decision_for(&id(txid), Some(&query_for(&attempt)));
        assert_eq!(answer.decision, expected, "{what}: {answer:?}");
        assert!(!answer.unknown_run, "{what}");
        assert_eq!(
            answer
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with("presumed abort")),
            is_presumed,
            "{what}: {answer:?}"
        );
        assert_eq!(
            answer.reason.is_some(),
            expected == DecisionStatus::Unknown || is_presumed,
            "{what}: unknowns and presumptions say why: {answer:?}"
        );
        // Nothing recorded: the table (as a checkpoint would write it) is unchanged.
        assert_eq!(engine.snapshot(identity()), before, "{what}");
    }
}

#[test]
fn pending_acks_and_attempts_are_visible() {
    let (engine, _) = last_commands(with(
        committed_and_durable(),
        [ack("a"), failed("b", 0), retry("b"), failed("b", 0)],
    ));
    assert_eq!(engine.gauges().pending_acks, 1);
    assert_eq!(engine.gauges().committing, 1);
    let decided_at = engine.status(&id("t")).unwrap().decided_at_ms;
    assert!(decided_at.is_some());
    assert_eq!(
        engine.gauges().oldest_pending_ack_decided_at_ms,
        decided_at,
        "the age of a stuck phase two is visible"
    );
    assert_eq!(engine.retrying(), 1);
    let status = engine.status(&id("t")).unwrap();
    let b = &status.participants[1];
    assert_eq!((b.acked, b.attempts), (false, 2));
    assert_eq!(b.last_error.as_deref(), Some("connection refused"));
    let stuck = engine.list(Some(TransactionState::Committing), 10);
    assert_eq!(stuck.len(), 1);
    assert!(
        engine
            .list(Some(TransactionState::Preparing), 10)
            .is_empty()
    );
}

#[test]
fn retained_outcomes_expire_after_the_window() {
    let (mut engine, _) = last_commands(with(committed_and_durable(), [ack("a"), ack("b")]));
    engine.step(Event::ExpireRetained {
        now_ms: 1200 + 999,
        retention_ms: 1000,
    });
    assert!(engine.status(&id("t")).is_some());
    engine.step(Event::ExpireRetained {
        now_ms: 1200 + 1000,
        retention_ms: 1000,
    });
    assert!(engine.status(&id("t")).is_none());
}

#[test]
fn recovery_aborts_begun_resends_unacked_and_ends_fully_acked() {
    let begun = begin_record(first(), 7, 1000);
    let committed = LogRecord::Decision(decision(COMMIT, [Yes, Yes], None, 1100));
    let acked_a = LogRecord::Ack(AckRecord {
        txid: id("t"),
        participant: name("a"),
    });
    let acked_b = LogRecord::Ack(AckRecord {
        txid: id("t"),
        participant: name("b"),
    });
    let cases: Vec<(&str, Vec<LogRecord>, Vec<Command>)> = vec![
        (
            "begun, never decided: abort is logged first (for the attempt the participants \
             were prepared for); sends wait for it to be durable",
            vec![begun.clone()],
            vec![append_decision(
                ABORT,
                [Timeout, Timeout],
                Some("the coordinator restarted before deciding"),
                5000,
            )],
        ),
        (
            "decided, nobody acked: resend to everyone, under the attempt's own gtid",
            vec![begun.clone(), committed.clone()],
            vec![send("a", COMMIT, 1), send("b", COMMIT, 1)],
        ),
        (
            "decided, one acked: resend only to the other",
            vec![begun.clone(), committed.clone(), acked_a.clone()],
            vec![send("b", COMMIT, 1)],
        ),
        (
            "all acked, end not logged: just end it",
            vec![begun.clone(), committed.clone(), acked_a.clone(), acked_b],
            vec![Command::AppendLazy(LogRecord::End(EndRecord {
                txid: id("t"),
                ended_at_ms: 5000,
            }))],
        ),
        (
            "ended: nothing to do",
            vec![
                begun,
                committed,
                acked_a,
                LogRecord::End(EndRecord {
                    txid: id("t"),
                    ended_at_ms: 1300,
                }),
            ],
            vec![],
        ),
    ];
    for (what, records, expected) in cases {
        let mut replayed = Engine::replay(CONFIG, None, records.clone());
        assert_eq!(replayed.engine.identity(), None, "no run before recovery");
        let staged = replayed.engine.gauges().retained as usize;
        let (archives, got) = split_archives(replayed.engine.step(recovered(5000)));
        let ends = got
            .iter()
            .filter(|c| matches!(c, Command::AppendLazy(LogRecord::End(_))))
            .count();
        // What replay staged, and what recovery ends now, goes to the index again.
        assert_eq!(archives.len(), staged + ends, "case: {what}");
        assert_eq!(got, expected, "case: {what}");
        assert_eq!(replayed.engine.identity(), Some(&next_identity()));
        // A crash during recovery: the same log replayed again gives the same work.
        let mut again = Engine::replay(CONFIG, None, records);
        let (_, got_again) = split_archives(again.engine.step(recovered(5000)));
        assert_eq!(got_again, expected, "again: {what}");
    }
}

#[test]
fn recovered_abort_then_durable_tells_everyone_once_and_ends() {
    let mut engine = Engine::replay(CONFIG, None, [begin_record(first(), 7, 1000)]).engine;
    engine.step(recovered(5000));
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Pending);
    let once = |p: &str| Command::SendDecision {
        txid: id("t"),
        gtid: first().gtid,
        participant: name(p),
        decision: ABORT,
        attempt: 1,
        tracked: false,
    };
    // No vote is known after the restart: nobody is owed the abort, everyone hears it once
    // (so a participant that prepared releases its locks now), and it ends at once.
    let commands = engine.step(durable());
    assert_eq!(
        commands[..3],
        [
            once("a"),
            once("b"),
            Command::AppendLazy(LogRecord::End(EndRecord {
                txid: id("t"),
                ended_at_ms: 5000,
            })),
        ]
    );
    assert!(
        matches!(commands[3..], [Command::Archive(_)]),
        "the ended outcome goes to the index: {commands:?}"
    );
    assert_eq!(ask(&engine, "t", &first()), DecisionStatus::Abort);
}

#[test]
fn retried_request_after_restart_gets_the_recorded_outcome_or_conflict() {
    let records = vec![
        LogRecord::Epoch(identity()),
        begin_record(first(), 7, 1000),
        LogRecord::Decision(decision(COMMIT, [Yes, Yes], None, 1100)),
        LogRecord::End(EndRecord {
            txid: id("t"),
            ended_at_ms: 1300,
        }),
    ];
    let replayed = Engine::replay(CONFIG, None, records);
    assert_eq!(replayed.identity, Some(identity()));
    let mut engine = replayed.engine;
    let (archives, rest) = split_archives(engine.step(recovered(5000)));
    assert_eq!(rest, vec![]);
    assert_eq!(archives.len(), 1, "the replayed outcome is archived again");
    assert_eq!(archives[0].ended_at_ms, 1300);
    // The recorded outcome names the attempt that made it, not one of this run.
    assert_eq!(
        engine.step(submit_as(9, WaitFor::Decision, 7)),
        vec![outcome(9, Outcome::Committed, [Yes, Yes], [true, true])]
    );
    assert_eq!(
        engine.step(submit_as(10, WaitFor::Decision, 8)),
        vec![Command::Reply {
            waiter: 10,
            reply: Reply::Conflict { txid: id("t") }
        }]
    );
}

#[test]
fn snapshot_then_replay_keeps_every_view() {
    let mut engine = Engine::new(CONFIG, identity());
    let empty = crate::records::Snapshot::decode(&engine.snapshot(identity()).encode()).unwrap();
    assert_eq!(empty, engine.snapshot(identity()));
    // t: committed, a acked; u: preparing; v: decided not yet durable; w: ended.
    for event in with(committed_and_durable(), [ack("a")]) {
        engine.step(event);
    }
    let other = |txid: &str| Event::Submit {
        waiter: 5,
        wait: WaitFor::Decision,
        txid: id(txid),
        digest: Digest(1),
        participants: vec![(name("a"), json!(null))],
        timeout_ms: 100,
        now_ms: 2000,
        archived: None,
        archive_generation: 0,
        client: None,
    };
    let yes = |txid: &str| Event::VoteReceived {
        txid: id(txid),
        participant: name("a"),
        vote: Yes,
        reason: None,
        now_ms: 2001,
    };
    engine.step(other("u"));
    engine.step(other("v"));
    engine.step(yes("v"));
    engine.step(other("w"));
    engine.step(yes("w"));
    engine.step(Event::DecisionDurable { txid: id("w") });
    engine.step(Event::Acked {
        txid: id("w"),
        participant: name("a"),
        now_ms: 2002,
    });
    // Positions follow submit order.
    let attempts: Vec<(&str, Attempt)> = ["t", "u", "v", "w"]
        .into_iter()
        .zip(1..)
        .map(|(txid, position)| (txid, Attempt::new(&coordinator(), RUN1, position)))
        .collect();
    for (txid, attempt) in &attempts {
        assert_eq!(
            engine.status(&id(txid)).unwrap().gtid,
            attempt.gtid,
            "{txid}"
        );
    }

    let snapshot = engine.snapshot(identity());
    // The encoding checkpoints write decodes to the same snapshot.
    let fast = crate::records::Snapshot::decode(&engine.snapshot(identity()).encode()).unwrap();
    assert_eq!(fast, snapshot);
    assert_eq!(fast.retained.len(), 1);
    assert_eq!(
        fast.runs,
        vec![RunSpan {
            incarnation: RUN1,
            epoch: Epoch(1),
            reach: 4
        }]
    );
    let replayed = Engine::replay(CONFIG, Some(snapshot.clone()), []);
    assert_eq!(replayed.identity, Some(identity()));
    let mut restored = replayed.engine;
    assert_eq!(restored.snapshot(identity()), snapshot);
    for (txid, attempt) in attempts.iter().filter(|(txid, _)| *txid != "v") {
        assert_eq!(
            ask(&restored, txid, attempt),
            ask(&engine, txid, attempt),
            "{txid}"
        );
        let view = |e: &Engine| e.status(&id(txid)).map(|s| (s.gtid, s.state, s.outcome));
        assert_eq!(view(&restored), view(&engine), "{txid}");
    }
    // v's decision was submitted before the checkpoint, so it is durable whenever the
    // checkpoint is: the restored table treats it as decided.
    assert_eq!(ask(&restored, "v", &attempts[2].1), DecisionStatus::Commit);
    let resent = restored.step(recovered(3000));
    assert!(resent.contains(&send("b", COMMIT, 1)), "{resent:?}");
    assert!(!resent.contains(&send("a", COMMIT, 1)), "{resent:?}");
    assert!(resent.iter().any(|c| matches!(c,
        Command::AppendDecision(d) if d.txid == id("u") && d.decision == Decision::Abort
            && d.attempt == attempts[1].1)));
}

#[test]
fn replay_lets_a_reused_id_supersede_the_ended_one() {
    // "t" committed and ended, was dropped from memory (retained_max), and the id was used
    // again, as a new attempt, for a transaction that aborted; no checkpoint in between.
    let second = Attempt::new(&coordinator(), RUN1, 2);
    let records = vec![
        LogRecord::Epoch(identity()),
        begin_record(first(), 7, 1000),
        LogRecord::Decision(decision(COMMIT, [Yes, Yes], None, 1100)),
        LogRecord::End(EndRecord {
            txid: id("t"),
            ended_at_ms: 1300,
        }),
        begin_record(second.clone(), 8, 2000),
        LogRecord::Decision(DecisionRecord {
            attempt: second.clone(),
            digest: Digest(8),
            created_at_ms: 2000,
            ..decision(ABORT, [Yes, No], Some("b voted no: because"), 2100)
        }),
    ];
    let mut engine = Engine::replay(CONFIG, None, records).engine;
    assert_eq!(ask(&engine, "t", &second), DecisionStatus::Abort);
    assert_eq!(
        engine.status(&id("t")).map(|s| s.gtid),
        Some(second.gtid.clone())
    );
    let resend = |p: &str| Command::SendDecision {
        txid: id("t"),
        gtid: second.gtid.clone(),
        participant: name(p),
        decision: ABORT,
        attempt: 1,
        tracked: true,
    };
    // "b" voted no: under presumed abort it is owed nothing.
    assert_eq!(engine.step(recovered(5000)), vec![resend("a")]);
}

/// The client's name (from its token) is in the begin record, the decision record, the
/// status, and survives a checkpoint and a replay: the transaction says who asked for it.
#[test]
fn the_client_name_is_recorded_through_decision_snapshot_and_replay() {
    let mut named = submit();
    if let Event::Submit { client, .. } = &mut named {
        *client = Some("shop".to_string());
    }
    let mut engine = Engine::new(CONFIG, identity());
    let begun = engine.step(named);
    let Some(Command::AppendLazy(LogRecord::Begin(begin))) = begun.first() else {
        panic!("{begun:?}");
    };
    assert_eq!(begin.client.as_deref(), Some("shop"));
    assert_eq!(
        engine.status(&id("t")).and_then(|s| s.client).as_deref(),
        Some("shop")
    );
    engine.step(vote("a", Yes));
    let decided = engine.step(vote("b", Yes));
    let decision = decided
        .iter()
        .find_map(|c| match c {
            Command::AppendDecision(d) => Some(d.clone()),
            _ => None,
        })
        .expect("a decision to log");
    assert_eq!(decision.client.as_deref(), Some("shop"));
    // A checkpoint taken now, and the plain records, both bring the name back.
    let snapshot = engine.snapshot(identity());
    let from_snapshot = Engine::replay(CONFIG, Some(snapshot), Vec::new()).engine;
    assert_eq!(
        from_snapshot
            .status(&id("t"))
            .and_then(|s| s.client)
            .as_deref(),
        Some("shop")
    );
    let records = vec![
        LogRecord::Begin(begin.clone()),
        LogRecord::Decision(decision),
    ];
    let replayed = Engine::replay(CONFIG, None, records).engine;
    assert_eq!(
        replayed.status(&id("t")).and_then(|s| s.client).as_deref(),
        Some("shop")
    );
}
