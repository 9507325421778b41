//! Property tests: random orders of events (votes, duplicates, late votes, deadlines, durable
//! notices, acks, failures, timers, client retries) for one transaction, checking the safety
//! rules on every command the engine emits, whatever the order; and random histories of many
//! transactions across checkpoints and crashes (some losing the lazy tail of the log), checking
//! that no attempt id is ever given out twice and that no participant hears an outcome its own
//! attempt did not have.

use proptest::prelude::*;
use serde_json::json;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use protocol::{
    CoordinatorId, Decision, DecisionQuery, DecisionStatus, Epoch, GlobalTxId, Incarnation,
    ParticipantName, TxId, VoteKind,
};

use super::*;
use crate::digest::Digest;
use crate::records::{Attempt, EpochRecord, LogRecord, Snapshot};

const CONFIG: EngineConfig = EngineConfig {
    retry_base_ms: 10,
    retry_max_ms: 100,
    retained_max: 10,
    bounds: crate::engine::Bounds::UNBOUNDED,
};

const PARTS: [&str; 3] = ["a", "b", "c"];

fn name(i: usize) -> ParticipantName {
    ParticipantName::new(PARTS[i]).unwrap()
}

fn txid() -> TxId {
    TxId::new("t").unwrap()
}

fn coordinator() -> CoordinatorId {
    CoordinatorId::new("c-1").unwrap()
}

fn identity(incarnation: Incarnation, epoch: u64) -> EpochRecord {
    EpochRecord {
        coordinator_id: coordinator(),
        epoch: Epoch(epoch),
        incarnation,
    }
}

fn query(attempt: &Attempt, epoch: u64) -> DecisionQuery {
    DecisionQuery {
        gtid: attempt.gtid.clone(),
        incarnation: attempt.incarnation,
        epoch: Epoch(epoch),
        position: attempt.position,
    }
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
    /// A participant prepared for the attempt asks for the decision: it hears pending until
    /// the decision is durable, then that decision; never a presumption about its own attempt.
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

/// The event a step feeds the engine; `None` for a query, which is a read, not an event.
fn to_event(step: &Step, waiter: u64) -> Option<Event> {
    Some(match step {
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
        Step::Query => return None,
    })
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
        archived: None,
        archive_generation: 0,
        client: None,
    }
}

proptest! {
    #[test]
    fn safety_holds_in_any_order(steps in proptest::collection::vec(step(), 0..60)) {
        let mut engine = Engine::new(CONFIG, identity(Incarnation(1), 1));
        let first = engine.step(submit(0, 7));
        let prepares = first.iter().filter(|c| matches!(c, Command::SendPrepare { .. })).count();
        prop_assert_eq!(prepares, 3);
        let attempt = Attempt::new(&coordinator(), Incarnation(1), 1);

        // What the engine should have seen, tracked independently of it.
        let mut first_votes: [Option<VoteKind>; 3] = [None; 3];
        let mut deadline_before_decision = false;
        let mut decided: Option<Decision> = None;
        let mut durable = false;
        let mut in_flight = [false; 3];
        let mut acked = [false; 3];

        for (i, step) in steps.iter().enumerate() {
            let Some(event) = to_event(step, i as u64 + 1) else {
                let answer = engine.decision_for(&txid(), Some(&query(&attempt, 1)));
                let expected = match decided {
                    Some(decision) if durable => decision.into(),
                    _ => DecisionStatus::Pending,
                };
                prop_assert_eq!((answer.decision, answer.reason, answer.unknown_run), (expected, None, false));
                continue;
            };
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
                    Command::AppendForced(_) | Command::AppendEpoch(_) => {
                        prop_assert!(false, "a mark or a raise without a refusal");
                    }
                    Command::AppendLazy(_)
                    | Command::ArmPrepareDeadline { .. }
                    | Command::ArmRetry { .. }
                    | Command::Archive(_)
                    | Command::Reply { reply: Reply::LogFailed { .. }, .. } => {}
                    Command::Reply { reply: Reply::Overloaded { .. }, .. } => {
                        prop_assert!(false, "overloaded with no bounds set");
                    }
                    Command::Reply {
                        reply: Reply::LookAgain | Reply::Busy { .. } | Reply::IndexUnavailable { .. },
                        ..
                    } => prop_assert!(false, "no archiver in this model, nothing staged beyond the bound"),
                }
            }
        }
    }
}

/// One thing that happens in a history of many transactions.
#[derive(Debug, Clone)]
enum Op {
    /// A client submits id `.0` (with its usual body, or another one).
    Submit(usize, bool),
    /// The participant votes on id `.0`'s live attempt (yes or no).
    Vote(usize, bool),
    Ack(usize),
    /// Every ended outcome is forgotten (the retention window passed).
    Forget,
    Checkpoint,
    /// The process dies and a new run recovers; `lose_tail` drops every lazy record after the
    /// last forced one (what a crash may lose); `seed` picks the new incarnation.
    Crash {
        lose_tail: bool,
        seed: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, any::<bool>()).prop_map(|(t, same)| Op::Submit(t, same || t == 0)),
        4 => (0..3usize, prop_oneof![3 => Just(true), 1 => Just(false)]).prop_map(|(t, yes)| Op::Vote(t, yes)),
        3 => (0..3usize).prop_map(Op::Ack),
        1 => Just(Op::Forget),
        1 => Just(Op::Checkpoint),
        // Few seeds: the new run's first choice often collides with a run in the log.
        1 => (any::<bool>(), 0..4u64).prop_map(|(lose_tail, seed)| Op::Crash { lose_tail, seed }),
    ]
}

/// The engine with a model of its log (what a restart replays) and of every attempt given out.
struct History {
    engine: Engine,
    identity: EpochRecord,
    snapshot: Option<Snapshot>,
    /// Records after the snapshot, in order; `forced` of them are certainly durable.
    log: Vec<LogRecord>,
    forced: usize,
    /// Every attempt any run gave out, with the client id it was for.
    given: Vec<(TxId, Attempt)>,
    gtids: BTreeSet<GlobalTxId>,
    incarnations: BTreeSet<Incarnation>,
    decided: BTreeMap<GlobalTxId, Decision>,
    ended: BTreeSet<GlobalTxId>,
    /// Attempts whose Begin a crash lost (they never decided: a decision is forced after it).
    lost: BTreeSet<GlobalTxId>,
}

fn client_id(t: usize) -> TxId {
    TxId::new(format!("t{t}")).unwrap()
}

impl History {
    fn new() -> History {
        let identity = identity(Incarnation(0), 1);
        History {
            engine: Engine::new(
                EngineConfig {
                    retained_max: 1,
                    bounds: crate::engine::Bounds::UNBOUNDED,
                    ..CONFIG
                },
                identity.clone(),
            ),
            identity: identity.clone(),
            snapshot: None,
            log: vec![LogRecord::Epoch(identity)],
            forced: 1,
            given: Vec::new(),
            gtids: BTreeSet::new(),
            incarnations: [Incarnation(0)].into(),
            decided: BTreeMap::new(),
            ended: BTreeSet::new(),
            lost: BTreeSet::new(),
        }
    }

    /// Steps the engine, logging what it appends; forced decisions become durable at once.
    fn apply(&mut self, event: Event) -> Result<(), TestCaseError> {
        let mut queue = VecDeque::from([event]);
        while let Some(mut event) = queue.pop_front() {
            if let Event::Submit {
                archive_generation, ..
            } = &mut event
            {
                *archive_generation = self.engine.archive_generation();
            }
            prop_assert!(
                self.engine.loads_mirror_the_table(),
                "admission load counts drifted from the table"
            );
            let submitted = match &event {
                Event::Submit { txid, .. } => Some(txid.clone()),
                _ => None,
            };
            let mut prepared = BTreeMap::new();
            // One step may end several transactions (recovery), and with `retained_max: 1`
            // only the last stays retained: the others' attempts are known from before.
            let live_before: BTreeMap<TxId, GlobalTxId> = self
                .engine
                .list(None, usize::MAX)
                .into_iter()
                .map(|status| (status.id, status.gtid))
                .collect();
            for command in self.engine.step(event) {
                match command {
                    Command::AppendLazy(record) => {
                        if let LogRecord::End(end) = &record {
                            let gtid = self
                                .engine
                                .status(&end.txid)
                                .map(|status| status.gtid)
                                .or_else(|| live_before.get(&end.txid).cloned());
                            prop_assert!(
                                gtid.is_some(),
                                "ended what was neither live nor retained"
                            );
                            if let Some(gtid) = gtid {
                                self.ended.insert(gtid);
                            }
                        }
                        self.log.push(record);
                    }
                    Command::AppendDecision(record) => {
                        let earlier = self
                            .decided
                            .insert(record.attempt.gtid.clone(), record.decision);
                        prop_assert_eq!(earlier, None, "{} decided twice", record.attempt.gtid);
                        queue.push_back(Event::DecisionDurable {
                            txid: record.txid.clone(),
                        });
                        self.log.push(LogRecord::Decision(record));
                        self.forced = self.log.len();
                    }
                    Command::SendPrepare { txid, attempt, .. } => {
                        prop_assert_eq!(Some(&txid), submitted.as_ref());
                        prepared.insert(attempt.gtid.clone(), (txid, attempt));
                    }
                    // Only a participant's fencing refusal marks or raises, and no step
                    // here is one.
                    Command::AppendForced(_) | Command::AppendEpoch(_) => {
                        prop_assert!(false, "a mark or a raise without a refusal");
                    }
                    Command::ArmPrepareDeadline { .. }
                    | Command::SendDecision { .. }
                    | Command::ArmRetry { .. }
                    | Command::Reply { .. } => {}
                    // An index that forgets at once (a zero window): every outcome leaves
                    // staging as soon as it is "archived", so ids are forgotten and reused.
                    Command::Archive(retained) => queue.push_back(Event::Archived {
                        archived: vec![(retained.decision.txid, retained.decision.attempt.gtid)],
                    }),
                }
            }
            prop_assert!(
                prepared.len() <= 1,
                "one submit, one attempt: {:?}",
                prepared
            );
            for (txid, attempt) in prepared.into_values() {
                prop_assert_eq!(attempt.incarnation, self.identity.incarnation);
                prop_assert!(
                    self.gtids.insert(attempt.gtid.clone()),
                    "attempt id {} given out twice",
                    attempt.gtid
                );
                self.given.push((txid, attempt));
            }
        }
        Ok(())
    }

    fn crash(&mut self, lose_tail: bool, seed: u64) -> Result<(), TestCaseError> {
        if lose_tail {
            for record in self.log.drain(self.forced..) {
                if let LogRecord::Begin(begin) = record {
                    self.lost.insert(begin.attempt.gtid);
                }
            }
        }
        let replayed = Engine::replay(
            EngineConfig {
                retained_max: 1,
                bounds: crate::engine::Bounds::UNBOUNDED,
                ..CONFIG
            },
            self.snapshot.clone(),
            self.log.clone(),
        );
        let last = replayed.identity.clone();
        prop_assert!(last.is_some(), "the log holds a run");
        let epoch = last.map_or(Epoch(1), |l| l.epoch.next());
        // As recovery does: an incarnation none of the log's runs has.
        let incarnation = (seed..)
            .map(Incarnation)
            .find(|i| !replayed.engine.runs().any(|span| span.incarnation == *i))
            .unwrap_or(Incarnation(u64::MAX));
        prop_assert!(
            self.incarnations.insert(incarnation),
            "incarnation {} repeated: the log forgot a run",
            incarnation
        );
        self.engine = replayed.engine;
        self.identity = identity(incarnation, epoch.0);
        self.log.push(LogRecord::Epoch(self.identity.clone()));
        self.forced = self.log.len();
        self.apply(Event::RecoveryDone {
            now_ms: 9,
            identity: self.identity.clone(),
        })
    }

    /// What every participant of every attempt would hear now.
    fn check_answers(&self) -> Result<(), TestCaseError> {
        for (txid, attempt) in &self.given {
            let answer = self.engine.decision_for(txid, Some(&query(attempt, 1)));
            let gtid = &attempt.gtid;
            let decided = self.decided.get(gtid).copied();
            prop_assert!(
                !answer.unknown_run,
                "{}: an attempt this coordinator gave out is never of an unknown run",
                gtid
            );
            match answer.decision {
                DecisionStatus::Commit => {
                    prop_assert_eq!(decided, Some(Decision::Commit), "{} heard commit", gtid);
                }
                // Abort for a committed attempt only once every participant acknowledged it.
                DecisionStatus::Abort => prop_assert!(
                    decided != Some(Decision::Commit) || self.ended.contains(gtid),
                    "{} heard abort, but committed",
                    gtid
                ),
                DecisionStatus::Pending => prop_assert!(
                    self.engine.status(txid).is_some_and(|s| &s.gtid == gtid),
                    "{} pending but not live",
                    gtid
                ),
                // Every attempt asked about was given out by a run this log holds: a log
                // that was never rolled back can always answer (a lost Begin included).
                DecisionStatus::Unknown => prop_assert!(
                    false,
                    "{} unknown (its start lost: {}): {:?}",
                    gtid,
                    self.lost.contains(gtid),
                    answer.reason
                ),
            }
        }
        Ok(())
    }
}

proptest! {
    /// Whatever the history of submits, votes, acks, forgetting, checkpoints and crashes: every
    /// attempt gets an id no earlier attempt had (across runs: each restart's incarnation is
    /// new), and a participant asking about its attempt hears that attempt's outcome, pending,
    /// a presumed abort only where no commit can be contradicted, or `unknown` only for an
    /// attempt whose start a crash lost.
    #[test]
    fn attempt_ids_never_repeat_and_answers_never_borrow_another_attempts_outcome(
        ops in proptest::collection::vec(op(), 0..80),
    ) {
        let mut history = History::new();
        for (i, op) in ops.into_iter().enumerate() {
            let waiter = i as u64;
            match op {
                Op::Submit(t, same) => history.apply(Event::Submit {
                    waiter,
                    wait: WaitFor::Decision,
                    txid: client_id(t),
                    digest: Digest(if same { 1 } else { 2 }),
                    participants: vec![(name(0), json!({"t": t}))],
                    timeout_ms: 100,
                    now_ms: 1,
                    archived: None,
                    archive_generation: 0,
                    client: None,
                })?,
                Op::Vote(t, yes) => history.apply(Event::VoteReceived {
                    txid: client_id(t),
                    participant: name(0),
                    vote: if yes { VoteKind::Yes } else { VoteKind::No },
                    reason: None,
                    now_ms: 2,
                })?,
                Op::Ack(t) => history.apply(Event::Acked {
                    txid: client_id(t),
                    participant: name(0),
                    now_ms: 3,
                })?,
                Op::Forget => history.apply(Event::ExpireRetained { now_ms: 1_000, retention_ms: 1 })?,
                Op::Checkpoint => {
                    history.snapshot = Some(history.engine.snapshot(history.identity.clone()));
                    history.log.clear();
                    history.forced = 0;
                }
                Op::Crash { lose_tail, seed } => history.crash(lose_tail, seed)?,
            }
            history.check_answers()?;
        }
    }
}
