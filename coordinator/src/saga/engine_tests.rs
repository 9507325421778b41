//! The saga state machine, event by event: which records and messages each event produces.

use protocol::TxId;
use protocol::saga::{OpKind, SagaRequest, SagaState, StepStatus};

use crate::digest::Digest;
use crate::records::{LogRecord, SagaOpOutcome, SagaRecord};
use crate::saga::engine::{
    ProbeAnswer, SagaCommand, SagaConfig, SagaEngine, SagaEvent, SagaReply, SagaWait,
};

const CONFIG: SagaConfig = SagaConfig {
    retry_base_ms: 100,
    retry_max_ms: 1000,
    step_timeout_ms: 500,
};

fn id() -> TxId {
    TxId::new("order-7").unwrap()
}

/// reserve, charge, then email (no compensation: a pivot).
fn request() -> SagaRequest {
    serde_json::from_value(
        serde_json::json!({"id":"order-7","timeout_ms":10000,"steps":[
        {"name":"reserve","participant":"inventory","action":{"r":1},"compensation":{"r":-1}},
        {"name":"charge","participant":"payments","action":{"c":1},"compensation":{"c":-1}},
        {"name":"email","participant":"mailer","action":{"e":1},"compensation":null}]}),
    )
    .unwrap()
}

fn submit(engine: &mut SagaEngine, wait: SagaWait) -> Vec<SagaCommand> {
    engine.step(SagaEvent::Submit {
        waiter: 1,
        wait,
        request: request(),
        digest: Digest(7),
        now_ms: 1000,
        client: None,
    })
}

/// The shell's report that `commands`' records are durable; what the engine answers then.
fn durable(engine: &mut SagaEngine, commands: &[SagaCommand]) -> Vec<SagaCommand> {
    let ids = records(commands)
        .iter()
        .map(|r| r.saga_id().clone())
        .collect();
    engine.step(SagaEvent::Durable { ids, now_ms: 1500 })
}

fn answer(step: usize, kind: OpKind, outcome: SagaOpOutcome) -> SagaEvent {
    answer_at(step, kind, outcome, 2000)
}

fn answer_at(step: usize, kind: OpKind, outcome: SagaOpOutcome, now_ms: u64) -> SagaEvent {
    SagaEvent::OpAnswered {
        id: id(),
        step,
        kind,
        outcome,
        now_ms,
        jitter: 0,
    }
}

fn done() -> SagaOpOutcome {
    SagaOpOutcome::Done { result: None }
}

fn sends(commands: &[SagaCommand]) -> Vec<(usize, OpKind)> {
    commands
        .iter()
        .filter_map(|c| match c {
            SagaCommand::Send { step, kind, .. } => Some((*step, *kind)),
            _ => None,
        })
        .collect()
}

fn records(commands: &[SagaCommand]) -> Vec<SagaRecord> {
    commands
        .iter()
        .filter_map(|c| match c {
            SagaCommand::Append(LogRecord::Saga(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn replies(commands: &[SagaCommand]) -> Vec<SagaReply> {
    commands
        .iter()
        .filter_map(|c| match c {
            SagaCommand::Reply { reply, .. } => Some(reply.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_begin_and_the_first_start_are_logged_before_the_first_action_is_sent() {
    let mut engine = SagaEngine::new(CONFIG);
    let commands = submit(&mut engine, SagaWait::Terminal);
    let first_send = commands
        .iter()
        .position(|c| matches!(c, SagaCommand::Send { .. }))
        .unwrap();
    let appends: Vec<usize> = (0..commands.len())
        .filter(|&i| matches!(commands[i], SagaCommand::Append(_)))
        .collect();
    assert_eq!(appends.len(), 2, "{commands:?}");
    assert!(appends.iter().all(|&i| i < first_send));
    assert!(matches!(records(&commands)[0], SagaRecord::Begin(_)));
    assert_eq!(sends(&commands), [(0, OpKind::Action)]);
    match &commands[first_send] {
        SagaCommand::Send { op_id, .. } => assert_eq!(op_id, "order-7:reserve:action"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_step_succeeds_and_the_waiter_hears_completed() {
    let mut engine = SagaEngine::new(CONFIG);
    submit(&mut engine, SagaWait::Terminal);
    assert_eq!(
        sends(&engine.step(answer(0, OpKind::Action, done()))),
        [(1, OpKind::Action)]
    );
    assert_eq!(
        sends(&engine.step(answer(1, OpKind::Action, done()))),
        [(2, OpKind::Action)]
    );
    let last = engine.step(answer(2, OpKind::Action, done()));
    assert!(
        matches!(records(&last).last(), Some(SagaRecord::End(e)) if e.state == SagaState::Completed)
    );
    match &replies(&last)[..] {
        [SagaReply::Saga(view)] => {
            assert_eq!(view.state, SagaState::Completed);
            assert!(
                view.steps
                    .iter()
                    .all(|s| s.status == StepStatus::Succeeded && s.attempts == 1)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failure_compensates_what_succeeded_in_reverse_and_nothing_else() {
    let mut engine = SagaEngine::new(CONFIG);
    let begun = submit(&mut engine, SagaWait::Terminal);
    durable(&mut engine, &begun);
    let reserved = engine.step(answer(0, OpKind::Action, done()));
    durable(&mut engine, &reserved);
    let failed = engine.step(answer(
        1,
        OpKind::Action,
        SagaOpOutcome::Failed {
            reason: "declined".into(),
        },
    ));
    // The failed charge is not compensated: only reserve is.
    assert_eq!(sends(&failed), [(0, OpKind::Compensation)]);
    durable(&mut engine, &failed);
    // A compensation that fails is retried (same op id) after a backoff, forever.
    let failing = engine.step(answer(
        0,
        OpKind::Compensation,
        SagaOpOutcome::Unknown {
            error: "503".into(),
        },
    ));
    assert!(matches!(
        failing[..],
        [
            SagaCommand::Append(_),
            SagaCommand::ArmRetry { after_ms: 50, .. }
        ]
    ));
    assert!(durable(&mut engine, &failing).is_empty());
    let view = engine.get(&id()).unwrap().view(3000);
    assert_eq!(view.steps[0].status, StepStatus::CompensationFailing);
    assert_eq!(view.state, SagaState::Compensating);
    let again = engine.step(SagaEvent::RetryDue {
        id: id(),
        now_ms: 3000,
    });
    assert_eq!(sends(&again), [(0, OpKind::Compensation)]);
    let end = engine.step(answer(0, OpKind::Compensation, done()));
    match &replies(&end)[..] {
        [SagaReply::Saga(view)] => {
            assert_eq!(view.state, SagaState::Compensated);
            assert_eq!(view.steps[0].status, StepStatus::Compensated);
            assert_eq!(view.steps[0].attempts, 2);
            assert_eq!(view.steps[1].status, StepStatus::Failed);
            assert_eq!(view.steps[2].status, StepStatus::Pending);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_is_asked_under_the_same_op_id_and_never_guessed() {
    let mut engine = SagaEngine::new(CONFIG);
    submit(&mut engine, SagaWait::Terminal);
    engine.step(answer(0, OpKind::Action, done()));
    let unknown = engine.step(answer(
        1,
        OpKind::Action,
        SagaOpOutcome::Unknown {
            error: "timeout".into(),
        },
    ));
    assert!(sends(&unknown).is_empty(), "no compensation on unknown");
    let probe = engine.step(SagaEvent::RetryDue {
        id: id(),
        now_ms: 2100,
    });
    match &probe[..] {
        [SagaCommand::Probe { op_id, step: 1, .. }] => assert_eq!(op_id, "order-7:charge:action"),
        other => panic!("{other:?}"),
    }
    // not_found: the same op is sent again, never a fresh one.
    let resend = engine.step(SagaEvent::ProbeAnswered {
        id: id(),
        step: 1,
        answer: ProbeAnswer::NotFound,
        now_ms: 2200,
        jitter: 0,
    });
    assert_eq!(sends(&resend), [(1, OpKind::Action)]);
    assert!(resend.iter().any(|c| matches!(c, SagaCommand::Send { op_id, attempt: 2, .. } if op_id == "order-7:charge:action")));
}

#[test]
fn a_timeout_with_an_unknown_step_reconciles_then_fences_then_compensates() {
    let mut engine = SagaEngine::new(CONFIG);
    submit(&mut engine, SagaWait::Terminal);
    engine.step(answer(0, OpKind::Action, done()));
    engine.step(answer(
        1,
        OpKind::Action,
        SagaOpOutcome::Unknown {
            error: "timeout".into(),
        },
    ));
    let timed_out = engine.step(SagaEvent::DeadlineDue {
        id: id(),
        now_ms: 20_000,
    });
    assert!(matches!(records(&timed_out)[..], [SagaRecord::TimedOut(_)]));
    assert!(
        sends(&timed_out).is_empty(),
        "the retry timer is still armed"
    );
    engine.step(SagaEvent::RetryDue {
        id: id(),
        now_ms: 20_001,
    });
    let fence = engine.step(SagaEvent::ProbeAnswered {
        id: id(),
        step: 1,
        answer: ProbeAnswer::NotFound,
        now_ms: 20_002,
        jitter: 0,
    });
    assert_eq!(sends(&fence), [(1, OpKind::Compensation)]);
    assert_eq!(
        sends(&engine.step(answer(1, OpKind::Compensation, done()))),
        [(0, OpKind::Compensation)]
    );
    let end = engine.step(answer(0, OpKind::Compensation, done()));
    assert!(
        matches!(&replies(&end)[..], [SagaReply::Saga(v)] if v.state == SagaState::Compensated)
    );
}

#[test]
fn a_failure_after_the_pivot_needs_attention_and_compensates_nothing() {
    let mut engine = SagaEngine::new(CONFIG);
    // email (the pivot) first in this saga: reserve after it fails.
    let mut pivot_first = request();
    pivot_first.steps.swap(0, 2);
    engine.step(SagaEvent::Submit {
        waiter: 1,
        wait: SagaWait::Terminal,
        request: pivot_first,
        digest: Digest(1),
        now_ms: 0,
        client: None,
    });
    engine.step(answer(0, OpKind::Action, done()));
    engine.step(answer(1, OpKind::Action, done()));
    let end = engine.step(answer(
        2,
        OpKind::Action,
        SagaOpOutcome::Failed {
            reason: "gone".into(),
        },
    ));
    assert!(sends(&end).is_empty());
    match &replies(&end)[..] {
        [SagaReply::Saga(v)] => {
            assert_eq!(v.state, SagaState::NeedsAttention);
            assert!(
                v.reason.as_deref().unwrap().contains("email"),
                "{:?}",
                v.reason
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn same_body_joins_other_body_conflicts_and_wait_none_is_accepted() {
    let mut engine = SagaEngine::new(CONFIG);
    let first = submit(&mut engine, SagaWait::Accepted);
    assert!(
        matches!(&replies(&first)[..], [SagaReply::Accepted(v)] if v.state == SagaState::Running)
    );
    assert!(durable(&mut engine, &first).is_empty());
    let again = submit(&mut engine, SagaWait::Terminal);
    assert!(
        again.is_empty(),
        "a retry waits for the same saga, starts nothing"
    );
    let other = engine.step(SagaEvent::Submit {
        waiter: 9,
        wait: SagaWait::Terminal,
        request: request(),
        digest: Digest(8),
        now_ms: 1000,
        client: None,
    });
    assert!(matches!(&replies(&other)[..], [SagaReply::Conflict(_)]));
}

/// Issue 25, item 1: a saga applied but not yet durable is neither shown nor answered for.
#[test]
fn a_repeat_and_every_read_wait_for_the_records_they_rest_on() {
    let mut engine = SagaEngine::new(CONFIG);
    let first = submit(&mut engine, SagaWait::Accepted);
    assert!(matches!(&replies(&first)[..], [SagaReply::Accepted(_)]));
    // The begin is applied, not durable: a repeat is held, reads show nothing.
    let repeat = engine.step(SagaEvent::Submit {
        waiter: 2,
        wait: SagaWait::Accepted,
        request: request(),
        digest: Digest(7),
        now_ms: 1000,
        client: None,
    });
    assert!(replies(&repeat).is_empty(), "{repeat:?}");
    let conflict = engine.step(SagaEvent::Submit {
        waiter: 3,
        wait: SagaWait::Accepted,
        request: request(),
        digest: Digest(8),
        now_ms: 1000,
        client: None,
    });
    assert!(replies(&conflict).is_empty(), "{conflict:?}");
    assert!(engine.get(&id()).is_none());
    assert!(engine.list(None, 10, 1000).is_empty());
    assert_eq!(engine.counts()[&SagaState::Running], 0);
    // The checkpoint covers the record (it is ahead of it in the log): it holds the saga.
    assert_eq!(engine.snapshot(1000).len(), 1);
    // Durable: both are answered, and reads show it.
    let released = durable(&mut engine, &first);
    assert!(
        matches!(
            &released[..],
            [
                SagaCommand::Reply {
                    waiter: 2,
                    reply: SagaReply::Accepted(_)
                },
                SagaCommand::Reply {
                    waiter: 3,
                    reply: SagaReply::Conflict(_)
                }
            ]
        ),
        "{released:?}"
    );
    assert!(engine.get(&id()).is_some());
    assert_eq!(engine.counts()[&SagaState::Running], 1);
    // A step applied and not yet durable: reads show the saga as it was before it.
    let succeeded = engine.step(answer(0, OpKind::Action, done()));
    let shown = engine.get(&id()).unwrap().view(2000);
    assert_ne!(shown.steps[0].status, StepStatus::Succeeded, "{shown:?}");
    durable(&mut engine, &succeeded);
    let shown = engine.get(&id()).unwrap().view(2000);
    assert_eq!(shown.steps[0].status, StepStatus::Succeeded);
}

#[test]
fn duplicate_and_late_answers_change_nothing() {
    let mut engine = SagaEngine::new(CONFIG);
    submit(&mut engine, SagaWait::Terminal);
    engine.step(answer(0, OpKind::Action, done()));
    assert!(engine.step(answer(0, OpKind::Action, done())).is_empty());
    assert!(
        engine
            .step(answer(2, OpKind::Compensation, done()))
            .is_empty()
    );
}

#[test]
fn replay_of_the_log_and_of_a_snapshot_resumes_where_the_log_says() {
    let mut engine = SagaEngine::new(CONFIG);
    let mut log: Vec<LogRecord> = Vec::new();
    let mut keep = |commands: Vec<SagaCommand>| {
        for c in commands {
            if let SagaCommand::Append(r) = c {
                log.push(r);
            }
        }
    };
    keep(submit(&mut engine, SagaWait::Terminal));
    keep(engine.step(answer(0, OpKind::Action, done())));
    // Crash after charge was sent (its start is logged, its outcome is not). The log says
    // the saga had run 1 s of its 10 s; a checkpoint at 2.5 s says 1.5 s.
    let replayed = SagaEngine::replay(CONFIG, Vec::new(), &log);
    let from_snapshot = SagaEngine::replay(CONFIG, engine.snapshot(2500), &[]);
    for (mut engine, left) in [(replayed, 9000), (from_snapshot, 8500)] {
        let resumed = engine.step(SagaEvent::Recovered { now_ms: 3000 });
        assert!(
            resumed.iter().any(
                |c| matches!(c, SagaCommand::ArmDeadline { after_ms, .. } if *after_ms == left)
            ),
            "{resumed:?}"
        );
        assert!(
            resumed
                .iter()
                .any(|c| matches!(c, SagaCommand::Probe { step: 1, .. })),
            "the unknown charge is asked about, not resent blindly: {resumed:?}"
        );
        let view = engine.get(&id()).unwrap().view(3000);
        assert_eq!(view.steps[0].status, StepStatus::Succeeded);
        assert_eq!(view.steps[1].attempts, 1);
    }
    // The snapshot round-trips through the checkpoint encoding.
    let encoded = serde_json::to_vec(&engine.snapshot(2500)).unwrap();
    let decoded: Vec<crate::saga::engine::Saga> = serde_json::from_slice(&encoded).unwrap();
    assert_eq!(serde_json::to_vec(&decoded).unwrap(), encoded);
    assert_eq!(decoded[0].facts, engine.snapshot(2500)[0].facts);
    assert_eq!(decoded[0].elapsed_ms, 1500);
}

/// Found by the saga simulation: a checkpoint taken while an action was in flight carried
/// "in flight" into the next start, so a saga completed later showed that step as running.
#[test]
fn a_checkpoint_holds_only_durable_state() {
    let mut engine = SagaEngine::new(CONFIG);
    submit(&mut engine, SagaWait::Terminal);
    let snapshot = engine.snapshot(1000);
    let mut after = Vec::new();
    for commands in [
        engine.step(answer(0, OpKind::Action, done())),
        engine.step(answer(1, OpKind::Action, done())),
        engine.step(answer(2, OpKind::Action, done())),
    ] {
        after.extend(records(&commands).into_iter().map(LogRecord::Saga));
    }
    let replayed = SagaEngine::replay(CONFIG, snapshot, &after);
    let view = replayed.get(&id()).unwrap().view(5000);
    assert_eq!(view.state, SagaState::Completed);
    assert!(
        view.steps.iter().all(|s| s.status == StepStatus::Succeeded),
        "{view:?}"
    );
}

fn deadline_due(now_ms: u64) -> SagaEvent {
    SagaEvent::DeadlineDue { id: id(), now_ms }
}

fn armed(commands: &[SagaCommand]) -> Vec<u64> {
    commands
        .iter()
        .filter_map(|c| match c {
            SagaCommand::ArmDeadline { after_ms, .. } => Some(*after_ms),
            _ => None,
        })
        .collect()
}

fn logged(commands: &[SagaCommand]) -> Vec<LogRecord> {
    records(commands).into_iter().map(LogRecord::Saga).collect()
}

/// Issue 25, item 5: the deadline is `timeout_ms` of the saga's elapsed time on the shell's
/// clock that never steps, so a timer that fires early re-arms, and every record carries the
/// elapsed time a restart resumes from.
#[test]
fn a_deadline_is_measured_on_the_sagas_elapsed_time() {
    let mut engine = SagaEngine::new(CONFIG);
    let begun = submit(&mut engine, SagaWait::Terminal);
    assert_eq!(armed(&begun), [10_000]);
    let unknown = engine.step(answer(
        0,
        OpKind::Action,
        SagaOpOutcome::Unknown {
            error: "timeout".into(),
        },
    ));
    assert!(
        records(&unknown).iter().all(|r| r.elapsed_ms() == 1000),
        "{unknown:?}"
    );
    // 9.999 s in: not yet. Nothing is logged, the rest is armed again.
    let early = engine.step(deadline_due(10_999));
    assert!(records(&early).is_empty(), "{early:?}");
    assert_eq!(armed(&early), [1]);
    let due = engine.step(deadline_due(11_000));
    match &records(&due)[..] {
        [SagaRecord::TimedOut(t)] => assert_eq!(t.elapsed_ms, 10_000),
        other => panic!("{other:?}"),
    }
    // Once timed out, a late timer changes nothing.
    assert!(engine.step(deadline_due(50_000)).is_empty());
}

/// Issue 25, item 5: after a restart the deadline is re-armed from the remaining time the
/// log holds, whatever the wall clock did meanwhile (stepped back an hour, forward a day),
/// and the downtime does not count.
#[test]
fn a_restart_rearms_the_deadline_from_the_logged_elapsed_time_never_the_wall_clock() {
    let mut engine = SagaEngine::new(CONFIG);
    let mut log = logged(&submit(&mut engine, SagaWait::Terminal));
    // 4 s in, the reservation's outcome is logged (then the charge is sent, and the crash).
    log.extend(logged(&engine.step(answer_at(
        0,
        OpKind::Action,
        done(),
        5000,
    ))));
    // The same reading as the begin's, an hour later, a day later, a clock stepped far back.
    for restart_at in [1000, 3_605_000, 86_405_000, 1] {
        let mut replayed = SagaEngine::replay(CONFIG, Vec::new(), &log);
        let resumed = replayed.step(SagaEvent::Recovered { now_ms: restart_at });
        assert_eq!(
            armed(&resumed),
            [6000],
            "restart at {restart_at}: {resumed:?}"
        );
        assert!(
            records(&resumed)
                .iter()
                .all(|r| !matches!(r, SagaRecord::TimedOut(_)))
        );
        // 5.999 s of this run later: not yet; 6 s: due.
        assert_eq!(armed(&replayed.step(deadline_due(restart_at + 5999))), [1]);
        let due = replayed.step(deadline_due(restart_at + 6000));
        assert!(
            records(&due)
                .iter()
                .any(|r| matches!(r, SagaRecord::TimedOut(t) if t.elapsed_ms == 10_000)),
            "{due:?}"
        );
    }
    // A saga whose log says its time is up times out at the restart, at once.
    let mut late = SagaEngine::new(CONFIG);
    let mut log = logged(&submit(&mut late, SagaWait::Terminal));
    log.extend(logged(&late.step(answer_at(
        0,
        OpKind::Action,
        done(),
        11_500,
    ))));
    let mut replayed = SagaEngine::replay(CONFIG, Vec::new(), &log);
    let resumed = replayed.step(SagaEvent::Recovered { now_ms: 7 });
    assert!(
        records(&resumed)
            .iter()
            .any(|r| matches!(r, SagaRecord::TimedOut(_))),
        "{resumed:?}"
    );
    assert!(armed(&resumed).is_empty());
}

/// Logs and checkpoints written before sagas logged their elapsed time still replay: such a
/// saga gets its whole timeout again from the restart (later than the wall clock says, never
/// earlier).
#[test]
fn a_log_and_a_checkpoint_from_before_elapsed_time_was_logged_give_the_whole_timeout_again() {
    let begin = records(&submit(&mut SagaEngine::new(CONFIG), SagaWait::Terminal))
        .into_iter()
        .find(|r| matches!(r, SagaRecord::Begin(_)))
        .map(LogRecord::Saga)
        .unwrap();
    let old_started = LogRecord::decode(
        2,
        crate::records::record_type::SAGA_STEP_STARTED,
        br#"{"id":"order-7","step":0,"kind":"action","attempt":1}"#,
    )
    .unwrap();
    let old_outcome = LogRecord::decode(
        3,
        crate::records::record_type::SAGA_STEP_OUTCOME,
        br#"{"id":"order-7","step":0,"kind":"action","outcome":{"outcome":"done"}}"#,
    )
    .unwrap();
    let mut replayed = SagaEngine::replay(CONFIG, Vec::new(), &[begin, old_started, old_outcome]);
    let resumed = replayed.step(SagaEvent::Recovered { now_ms: 99_000 });
    assert_eq!(armed(&resumed), [10_000], "{resumed:?}");
    assert_eq!(
        replayed.get(&id()).unwrap().view(99_000).steps[0].status,
        StepStatus::Succeeded
    );
    // A checkpoint's saga without `elapsed_ms`.
    let mut old_saga = serde_json::to_value(&replayed.snapshot(99_000)[0]).unwrap();
    old_saga.as_object_mut().unwrap().remove("elapsed_ms");
    let old_saga: crate::saga::engine::Saga = serde_json::from_value(old_saga).unwrap();
    assert_eq!(old_saga.elapsed_ms, 0);
    let mut restored = SagaEngine::replay(CONFIG, vec![old_saga], &[]);
    let resumed = restored.step(SagaEvent::Recovered { now_ms: 5 });
    assert_eq!(armed(&resumed), [10_000], "{resumed:?}");
}

/// reserve, charge, ship: every step can be undone.
fn three_compensable() -> SagaRequest {
    serde_json::from_value(
        serde_json::json!({"id":"order-7","timeout_ms":10000,"steps":[
        {"name":"reserve","participant":"inventory","action":{"r":1},"compensation":{"r":-1}},
        {"name":"charge","participant":"payments","action":{"c":1},"compensation":{"c":-1}},
        {"name":"ship","participant":"shipping","action":{"s":1},"compensation":{"s":-1}}]}),
    )
    .unwrap()
}

/// Issue 25, item 5: a step found `not_found` is fenced first; a fence that keeps failing
/// shows as `compensation_failing`, is counted, is retried with backoff, and the other steps'
/// compensations go ahead meanwhile (in reverse order of success). The saga is compensated
/// only once the fence succeeded.
#[test]
fn a_failing_fence_is_compensation_failing_counted_and_holds_up_no_other_compensation() {
    let mut engine = SagaEngine::new(CONFIG);
    let mut log: Vec<LogRecord> = Vec::new();
    let mut step = |engine: &mut SagaEngine, event: SagaEvent| {
        let commands = engine.step(event);
        log.extend(logged(&commands));
        let mut all = commands.clone();
        all.extend(durable(engine, &commands));
        (all, log.clone())
    };
    step(
        &mut engine,
        SagaEvent::Submit {
            waiter: 1,
            wait: SagaWait::Terminal,
            request: three_compensable(),
            digest: Digest(3),
            now_ms: 1000,
            client: None,
        },
    );
    step(&mut engine, answer(0, OpKind::Action, done()));
    step(&mut engine, answer(1, OpKind::Action, done()));
    let unknown = SagaOpOutcome::Unknown {
        error: "timeout".into(),
    };
    step(&mut engine, answer(2, OpKind::Action, unknown.clone()));
    step(&mut engine, deadline_due(11_000));
    let (probe, _) = step(
        &mut engine,
        SagaEvent::RetryDue {
            id: id(),
            now_ms: 11_100,
        },
    );
    assert!(
        matches!(probe[..], [SagaCommand::Probe { step: 2, .. }]),
        "{probe:?}"
    );
    // Not found: fenced before anything else is compensated.
    let (fence, _) = step(
        &mut engine,
        SagaEvent::ProbeAnswered {
            id: id(),
            step: 2,
            answer: ProbeAnswer::NotFound,
            now_ms: 11_200,
            jitter: 0,
        },
    );
    assert_eq!(sends(&fence), [(2, OpKind::Compensation)]);
    let refused = SagaOpOutcome::Failed {
        reason: "refused".into(),
    };
    let (failed, log_now) = step(&mut engine, answer(2, OpKind::Compensation, refused));
    assert!(
        failed
            .iter()
            .any(|c| matches!(c, SagaCommand::ArmRetry { .. })),
        "retried with backoff: {failed:?}"
    );
    assert!(sends(&failed).is_empty());
    let view = engine.get(&id()).unwrap().view(11_300);
    assert_eq!(view.state, SagaState::Compensating);
    assert_eq!(view.steps[2].status, StepStatus::CompensationFailing);
    assert_eq!(view.steps[2].last_error.as_deref(), Some("refused"));
    assert_eq!(engine.compensations_failing(), 1);
    // A restart reads the same from the log.
    let replayed = SagaEngine::replay(CONFIG, Vec::new(), &log_now);
    assert_eq!(
        replayed.get(&id()).unwrap().view(0).steps[2].status,
        StepStatus::CompensationFailing
    );
    assert_eq!(replayed.compensations_failing(), 1);
    // The others are not held up: charge, then reserve, while the fence waits its turn.
    let (next, _) = step(
        &mut engine,
        SagaEvent::RetryDue {
            id: id(),
            now_ms: 11_400,
        },
    );
    assert_eq!(sends(&next), [(1, OpKind::Compensation)]);
    let (next, _) = step(&mut engine, answer(1, OpKind::Compensation, done()));
    assert_eq!(sends(&next), [(0, OpKind::Compensation)]);
    let (next, _) = step(&mut engine, answer(0, OpKind::Compensation, done()));
    // Then the fence again (attempt 2), and the saga is not compensated while it fails.
    assert!(
        next.iter().any(|c| matches!(
            c,
            SagaCommand::Send {
                step: 2,
                kind: OpKind::Compensation,
                attempt: 2,
                ..
            }
        )),
        "{next:?}"
    );
    assert!(replies(&next).is_empty());
    let (failed, _) = step(&mut engine, answer(2, OpKind::Compensation, unknown));
    assert!(replies(&failed).is_empty());
    let view = engine.get(&id()).unwrap().view(12_000);
    assert_eq!(view.state, SagaState::Compensating);
    assert_eq!(
        view.steps.iter().map(|s| s.status).collect::<Vec<_>>(),
        [
            StepStatus::Compensated,
            StepStatus::Compensated,
            StepStatus::CompensationFailing
        ]
    );
    assert_eq!(engine.compensations_failing(), 1);
    let (retry, _) = step(
        &mut engine,
        SagaEvent::RetryDue {
            id: id(),
            now_ms: 12_100,
        },
    );
    assert_eq!(sends(&retry), [(2, OpKind::Compensation)]);
    let (end, _) = step(&mut engine, answer(2, OpKind::Compensation, done()));
    match &replies(&end)[..] {
        [SagaReply::Saga(view)] => {
            assert_eq!(view.state, SagaState::Compensated);
            assert_eq!(
                view.steps[2].status,
                StepStatus::Failed,
                "fenced: never applied"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.compensations_failing(), 0);
}
