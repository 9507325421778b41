//! Property tests: random orders of events (votes, duplicates, late votes, deadlines, durable
//! notices, acks, failures, timers, client retries) for one transaction, checking the safety
//! rules on every command the engine emits, whatever the order.

use proptest::prelude::*;
use serde_json::json;

use protocol::{Decision, ParticipantName, TxId, VoteKind};

use super::*;
use crate::digest::Digest;

const PARTS: [&str; 3] = ["a", "b", "c"];

fn name(i: usize) -> ParticipantName {
    ParticipantName::new(PARTS[i]).unwrap()
}

fn txid() -> TxId {
    TxId::new("t").unwrap()
}

#[derive(Debug, Clone)]
enum Step {
    Vote(usize, VoteKind),
    Deadline,
    Durable,
    Ack(usize),
    Fail(usize, u64),
    Retry(usize),
    Resubmit(bool),
    /// A participant asks for the decision (the runtime's path for ids it cannot answer at
    /// once; here the id is always known, so it must never presume anything).
    Query,
}

fn step() -> impl Strategy<Value = Step> {
    let vote = prop_oneof![
        Just(VoteKind::Yes),
        Just(VoteKind::Yes),
        Just(VoteKind::No),
        Just(VoteKind::Timeout),
        Just(VoteKind::Error),
    ];
    prop_oneof![
        4 => (0..3usize, vote).prop_map(|(p, v)| Step::Vote(p, v)),
        1 => Just(Step::Deadline),
        2 => Just(Step::Durable),
        3 => (0..3usize).prop_map(Step::Ack),
        2 => (0..3usize, any::<u64>()).prop_map(|(p, j)| Step::Fail(p, j)),
        2 => (0..3usize).prop_map(Step::Retry),
        1 => any::<bool>().prop_map(Step::Resubmit),
        1 => Just(Step::Query),
    ]
}

fn to_event(step: &Step, waiter: u64) -> Event {
    match step {
        Step::Vote(p, vote) => Event::VoteReceived {
            txid: txid(),
            participant: name(*p),
            vote: *vote,
            reason: None,
            now_ms: 2,
        },
        Step::Deadline => Event::PrepareDeadline {
            txid: txid(),
            now_ms: 3,
        },
        Step::Durable => Event::DecisionDurable { txid: txid() },
        Step::Ack(p) => Event::Acked {
            txid: txid(),
            participant: name(*p),
            now_ms: 4,
        },
        Step::Fail(p, jitter) => Event::DeliveryFailed {
            txid: txid(),
            participant: name(*p),
            error: "down".into(),
            jitter: *jitter,
        },
        Step::Retry(p) => Event::RetryDue {
            txid: txid(),
            participant: name(*p),
        },
        Step::Resubmit(same) => submit(waiter, if *same { 7 } else { 8 }),
        Step::Query => Event::UnknownIdQueried {
            waiter,
            txid: txid(),
            now_ms: 5,
        },
    }
}

fn submit(waiter: u64, digest: u128) -> Event {
    Event::Submit {
        waiter,
        wait: WaitFor::Decision,
        txid: txid(),
        digest: Digest(digest),
        participants: (0..3).map(|i| (name(i), json!({"i": i}))).collect(),
        timeout_ms: 100,
        now_ms: 1,
    }
}

proptest! {
    #[test]
    fn safety_holds_in_any_order(steps in proptest::collection::vec(step(), 0..60)) {
        let mut engine = Engine::new(EngineConfig { retry_base_ms: 10, retry_max_ms: 100, retained_max: 10 });
        let first = engine.step(submit(0, 7));
        let prepares = first.iter().filter(|c| matches!(c, Command::SendPrepare { .. })).count();
        prop_assert_eq!(prepares, 3);

        // What the engine should have seen, tracked independently of it.
        let mut first_votes: [Option<VoteKind>; 3] = [None; 3];
        let mut deadline_before_decision = false;
        let mut decided: Option<Decision> = None;
        let mut durable = false;
        let mut in_flight = [false; 3];
        let mut acked = [false; 3];

        for (i, step) in steps.iter().enumerate() {
            let event = to_event(step, i as u64 + 1);
            match step {
                Step::Vote(p, v) if decided.is_none() && first_votes[*p].is_none() => {
                    first_votes[*p] = Some(*v)
                }
                Step::Deadline if decided.is_none() => deadline_before_decision = true,
                Step::Durable if decided.is_some() => durable = true,
                Step::Ack(p) | Step::Fail(p, _) if durable => in_flight[*p] = false,
                _ => {}
            }
            if let Step::Ack(p) = step && durable {
                acked[*p] = true;
            }
            for command in engine.step(event) {
                match command {
                    Command::AppendDecision(record) => {
                        prop_assert!(decided.is_none(), "decided twice");
                        let all_yes = first_votes.iter().all(|v| *v == Some(VoteKind::Yes));
                        // Commit only on every participant's first vote being yes.
                        prop_assert_eq!(record.decision == Decision::Commit, all_yes);
                        // Decided only when every vote is in or the deadline passed.
                        prop_assert!(first_votes.iter().all(Option::is_some) || deadline_before_decision);
                        decided = Some(record.decision);
                    }
                    Command::SendDecision { participant, decision, .. } => {
                        prop_assert!(durable, "phase two before the decision was durable");
                        prop_assert_eq!(Some(decision), decided);
                        let p = PARTS.iter().position(|n| *n == participant.as_str()).unwrap();
                        prop_assert!(!acked[p], "resent after the ack");
                        prop_assert!(!in_flight[p], "two deliveries at once to {}", p);
                        in_flight[p] = true;
                    }
                    Command::Reply { reply: Reply::Outcome(response), .. } => {
                        prop_assert!(durable, "client answered before the decision was durable");
                        let expected = decided.map(crate::engine::tx::outcome_of);
                        prop_assert_eq!(Some(response.outcome), expected);
                    }
                    Command::Reply { reply: Reply::Conflict { .. }, .. } => {
                        prop_assert!(matches!(step, Step::Resubmit(false)));
                    }
                    Command::SendPrepare { .. } => prop_assert!(false, "prepared twice"),
                    Command::AppendLazy(_)
                    | Command::ArmPrepareDeadline { .. }
                    | Command::ArmRetry { .. }
                    | Command::Reply { reply: Reply::LogFailed { .. }, .. } => {}
                }
            }
        }
    }
}

proptest! {
    /// An id first heard of through a participant's query: whatever follows (more queries,
    /// client submits with any body, the durable notice), exactly one presumed abort is logged,
    /// nobody hears anything before it is durable, everyone hears abort, and no prepare is sent.
    #[test]
    fn a_presumed_abort_is_logged_once_and_never_becomes_an_attempt(
        steps in proptest::collection::vec(0..4u8, 0..30),
    ) {
        let mut engine = Engine::new(EngineConfig { retry_base_ms: 10, retry_max_ms: 100, retained_max: 10 });
        let query = |waiter| Event::UnknownIdQueried { waiter, txid: txid(), now_ms: 5 };
        let first = engine.step(query(0));
        prop_assert!(matches!(&first[..], [Command::AppendDecision(r)] if r.presumed && r.decision == Decision::Abort));
        let mut durable = false;
        for (i, kind) in steps.iter().enumerate() {
            let waiter = i as u64 + 1;
            let event = match kind {
                0 => query(waiter),
                1 => submit(waiter, 7),
                2 => submit(waiter, 8),
                _ => {
                    durable = true;
                    Event::DecisionDurable { txid: txid() }
                }
            };
            for command in engine.step(event) {
                match command {
                    Command::Reply { reply: Reply::Outcome(response), .. } => {
                        prop_assert!(durable, "answered before the presumed abort was durable");
                        prop_assert_eq!(response.outcome, protocol::Outcome::Aborted);
                    }
                    Command::AppendLazy(LogRecord::End(_)) => prop_assert!(durable),
                    Command::AppendDecision(_) => prop_assert!(false, "logged twice"),
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
        }
    }
}
