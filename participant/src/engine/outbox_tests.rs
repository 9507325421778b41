//! The outbox's tests, beside the engine: writes with intents, conditions, reports and
//! operators' actions, replay and checkpoints; and a property test that drives random writes,
//! reports, retention and restarts (from the records the engine emitted, with and without a
//! checkpoint) and checks the outbox's invariants after every step.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use protocol::outbox::{Intent, IntentState, OutboxEntry};
use serde_json::{Value, json};

use super::*;
use crate::engine::{Command, EngineConfig, Event, Reply};
use crate::fence::FencedAnswer;
use crate::kv::KvStore;
use crate::outbox::{IntentRequest, OutboxRetention, Write};
use crate::record::Record;

const RETENTION_MS: u64 = 50;

fn config() -> EngineConfig {
    EngineConfig {
        outbox_retention: OutboxRetention {
            settled_ms: RETENTION_MS,
        },
        ..EngineConfig::default()
    }
}

fn intent(event_id: &str, aggregate: &str) -> Intent {
    Intent {
        event_id: event_id.into(),
        aggregate: aggregate.into(),
        target: "payments".into(),
        kind: "payment.authorize.v1".into(),
        body: json!({"for": event_id}),
    }
}

fn write(op_id: &str, ops: Value, next: Vec<Intent>) -> Event {
    Event::Write {
        write: Write {
            op_id: op_id.into(),
            fence: None,
            payload: json!({ "ops": ops }),
            next,
        },
        now_ms: 10,
    }
}

fn request(event_id: &str, request: IntentRequest, now_ms: u64) -> Event {
    Event::Intent {
        event_id: event_id.into(),
        request,
        now_ms,
    }
}

fn delivered() -> IntentRequest {
    IntentRequest::Delivered {
        answer: json!({"ok": true}),
    }
}

/// The reply and the records of one step.
fn step(engine: &mut Engine<KvStore>, event: Event, log: &mut Vec<Record>) -> Reply {
    let mut reply = None;
    for command in engine.step(event) {
        match command {
            Command::Log { record, forced } => {
                assert!(forced, "every outbox record is forced: {record:?}");
                log.push(record);
            }
            Command::Reply(r) => reply = Some(r),
            Command::Deliver { .. } | Command::AskDecision { .. } => {}
        }
    }
    reply.expect("every outbox event is answered in its step")
}

fn code(reply: &Reply) -> Option<protocol::ErrorCode> {
    match reply {
        Reply::Reject(rejection) => Some(rejection.code()),
        _ => None,
    }
}

fn entry(reply: Reply) -> OutboxEntry {
    match reply {
        Reply::Intent(entry) => *entry,
        other => panic!("not an intent: {other:?}"),
    }
}

fn replayed(log: &[Record]) -> Engine<KvStore> {
    let mut engine = Engine::new(config(), KvStore::new());
    for record in log {
        engine.replay(record.clone()).unwrap();
    }
    engine
}

/// A worker paused past its lease resends a transition another worker already made, its
/// intent included: it is told `stale_token` (the fence is judged before the event id), so it
/// learns that it lost its lease, not that someone else used its id.
#[test]
fn a_stale_writer_repeating_an_event_id_is_told_stale_token() {
    let mut engine = Engine::new(config(), KvStore::new());
    let mut log = Vec::new();
    let fenced = |op_id: &str, token: u64| Event::Write {
        write: Write {
            op_id: op_id.into(),
            fence: Some(protocol::lease::FenceClaim::unproven(
                "checkout-workers",
                token,
            )),
            payload: json!({"ops": [{"op": "put", "key": "checkout:c-1", "value": "stock_reserved"}]}),
            next: vec![intent("pay-c-1", "checkout:c-1")],
        },
        now_ms: 10,
    };
    let first = step(&mut engine, fenced("by-b", 2), &mut log);
    assert!(
        matches!(first, Reply::Fenced(FencedAnswer::Applied { .. })),
        "{first:?}"
    );
    let stale = step(&mut engine, fenced("by-a", 1), &mut log);
    assert!(
        matches!(&stale, Reply::Fenced(FencedAnswer::Stale(s)) if s.highest == 2),
        "{stale:?}"
    );
    // An honest writer with the current token reusing the id is told the id is taken.
    let reused = step(&mut engine, fenced("by-b-again", 2), &mut log);
    assert_eq!(code(&reused), Some(protocol::ErrorCode::IdConflict));
}

#[test]
fn a_write_records_its_intents_in_one_record_with_seqs_per_aggregate() {
    let mut engine = Engine::new(config(), KvStore::new());
    let mut log = Vec::new();
    let ops = json!([{"op": "put", "key": "checkout:c-1", "value": "stock_reserved"}]);
    let next = vec![intent("e-1", "checkout:c-1"), intent("e-2", "checkout:c-1")];
    let reply = step(
        &mut engine,
        write("w-1", ops.clone(), next.clone()),
        &mut log,
    );
    let Reply::Fenced(FencedAnswer::Applied {
        token,
        receipt,
        intents,
    }) = &reply
    else {
        panic!("{reply:?}")
    };
    assert_eq!(*token, 0);
    assert_eq!(receipt, &json!([{"key": "checkout:c-1", "version": 1}]));
    let seqs: Vec<u64> = intents.iter().map(|i| i.seq).collect();
    assert_eq!(seqs, [1, 2]);
    assert_eq!(log.len(), 1, "the write and its intents are one record");
    // The same op id answers the same, behind a barrier, and records nothing more.
    let again = step(&mut engine, write("w-1", ops.clone(), next), &mut log);
    assert_eq!(again, reply);
    assert!(matches!(log.last(), Some(Record::FencedRepeat { .. })));
    assert_eq!(engine.outbox().len(), 2);
    // Another write reusing an event id: 409 id_conflict, nothing written.
    let reused = step(
        &mut engine,
        write("w-2", ops.clone(), vec![intent("e-2", "x")]),
        &mut log,
    );
    assert_eq!(code(&reused), Some(protocol::ErrorCode::IdConflict));
    // The same op id with other content: op_id_conflict.
    let other = step(&mut engine, write("w-1", ops, vec![]), &mut log);
    assert_eq!(code(&other), Some(protocol::ErrorCode::OpIdConflict));
    assert_eq!(engine.resource().get("checkout:c-1").unwrap().version, 1);
}

#[test]
fn a_failed_check_writes_nothing_records_no_intent_and_answers_condition_failed() {
    let mut engine = Engine::new(config(), KvStore::new());
    let mut log = Vec::new();
    let ops = json!([
        {"op": "check", "key": "checkout:c-1", "version": 3},
        {"op": "put", "key": "checkout:c-1", "value": "payment_authorized"}
    ]);
    let reply = step(
        &mut engine,
        write("w-1", ops, vec![intent("e-1", "c")]),
        &mut log,
    );
    assert_eq!(code(&reply), Some(protocol::ErrorCode::ConditionFailed));
    assert!(log.is_empty() && engine.outbox().is_empty());
    assert!(engine.resource().get("checkout:c-1").is_none());
    // Other refusals keep their codes: an add below its min is invalid_payload.
    let ops = json!([{"op": "add", "key": "n", "delta": -1, "min": 0}]);
    let reply = step(&mut engine, write("w-2", ops, vec![]), &mut log);
    assert_eq!(code(&reply), Some(protocol::ErrorCode::InvalidPayload));
    let bad = step(
        &mut engine,
        write(
            "w-3",
            json!([]),
            vec![intent("e-1", "c"), intent("e-1", "c")],
        ),
        &mut log,
    );
    assert_eq!(code(&bad), Some(protocol::ErrorCode::InvalidPayload));
    assert!(log.is_empty());
}

#[test]
fn reports_keep_order_repeat_unchanged_and_operators_are_audited() {
    let mut engine = Engine::new(config(), KvStore::new());
    let mut log = Vec::new();
    let next = vec![intent("e-1", "a"), intent("e-2", "a")];
    step(&mut engine, write("w-1", json!([]), next), &mut log);
    let out_of_order = step(&mut engine, request("e-2", delivered(), 11), &mut log);
    assert_eq!(
        code(&out_of_order),
        Some(protocol::ErrorCode::IntentOutOfOrder)
    );
    let unknown = step(&mut engine, request("e-9", delivered(), 11), &mut log);
    assert_eq!(code(&unknown), Some(protocol::ErrorCode::NotFound));
    let failed = entry(step(
        &mut engine,
        request(
            "e-1",
            IntentRequest::Attempt {
                error: "x".repeat(5000),
                permanent: true,
            },
            12,
        ),
        &mut log,
    ));
    assert_eq!(failed.state, IntentState::Failed);
    assert_eq!(failed.last_error.as_ref().map(String::len), Some(1024));
    // A failed head still blocks its aggregate.
    let blocked = step(&mut engine, request("e-2", delivered(), 13), &mut log);
    assert_eq!(code(&blocked), Some(protocol::ErrorCode::IntentOutOfOrder));
    let no_reason = IntentRequest::Retry {
        operator: "alice".into(),
        reason: " ".into(),
    };
    let refused = step(&mut engine, request("e-1", no_reason, 14), &mut log);
    assert_eq!(code(&refused), Some(protocol::ErrorCode::InvalidOperator));
    let retry = IntentRequest::Retry {
        operator: "alice".into(),
        reason: "the receiver is fixed".into(),
    };
    let retried = entry(step(
        &mut engine,
        request("e-1", retry.clone(), 15),
        &mut log,
    ));
    assert_eq!(retried.state, IntentState::Pending);
    assert_eq!(retried.marks[0].action, "retry");
    let not_failed = step(&mut engine, request("e-1", retry, 16), &mut log);
    assert_eq!(code(&not_failed), Some(protocol::ErrorCode::NotPending));
    let first = entry(step(&mut engine, request("e-1", delivered(), 17), &mut log));
    assert_eq!((first.state, first.attempts), (IntentState::Delivered, 2));
    let records = log.len();
    let repeat = entry(step(&mut engine, request("e-1", delivered(), 18), &mut log));
    assert_eq!(repeat, first, "a repeat answers the entry unchanged");
    assert!(matches!(log[records..], [Record::FencedRepeat { .. }]));
    let mark = |state| IntentRequest::Mark {
        state,
        operator: "bob".into(),
        reason: "paid by phone".into(),
    };
    let no_state = step(&mut engine, request("e-2", mark(None), 19), &mut log);
    assert_eq!(code(&no_state), Some(protocol::ErrorCode::InvalidPayload));
    let settled = step(
        &mut engine,
        request("e-1", mark(Some(IntentState::Abandoned)), 19),
        &mut log,
    );
    assert_eq!(code(&settled), Some(protocol::ErrorCode::NotPending));
    let marked = entry(step(
        &mut engine,
        request("e-2", mark(Some(IntentState::Delivered)), 20),
        &mut log,
    ));
    assert_eq!(marked.state, IntentState::Delivered);
    // Replay of the records gives the same table.
    assert_eq!(replayed(&log).outbox(), engine.outbox());
}

#[test]
fn old_snapshots_without_an_outbox_load_and_new_ones_carry_it() {
    let mut engine = Engine::new(config(), KvStore::new());
    let mut log = Vec::new();
    step(
        &mut engine,
        write("w-1", json!([]), vec![intent("e-1", "a")]),
        &mut log,
    );
    let mut snapshot = serde_json::to_value(engine.snapshot().unwrap()).unwrap();
    let restored =
        Engine::<KvStore>::restore(config(), serde_json::from_value(snapshot.clone()).unwrap())
            .unwrap();
    assert_eq!(restored.outbox(), engine.outbox());
    snapshot.as_object_mut().unwrap().remove("outbox");
    let old = Engine::<KvStore>::restore(config(), serde_json::from_value(snapshot).unwrap());
    assert!(old.unwrap().outbox().is_empty());
}

// The property test: random steps, then the invariants.

#[derive(Debug, Clone)]
enum Op {
    /// A write under op id `op` (a small pool: repeats happen) of `intents` intents of the
    /// aggregates given, guarded by a check that holds or not.
    Write {
        op: u8,
        aggregates: Vec<u8>,
        check_holds: bool,
    },
    Delivered(u8),
    Attempt(u8, bool),
    Retry(u8),
    Mark(u8, bool),
    Tick(u8),
    Checkpoint,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..12u8, proptest::collection::vec(0..3u8, 0..4), proptest::bool::weighted(0.8))
            .prop_map(|(op, aggregates, check_holds)| Op::Write { op, aggregates, check_holds }),
        4 => (0..24u8).prop_map(Op::Delivered),
        2 => (0..24u8, any::<bool>()).prop_map(|(e, p)| Op::Attempt(e, p)),
        1 => (0..24u8).prop_map(Op::Retry),
        1 => (0..24u8, any::<bool>()).prop_map(|(e, d)| Op::Mark(e, d)),
        2 => (0..40u8).prop_map(Op::Tick),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Restart),
    ]
}

/// What the test knows: the writes applied (op id → their intents' event ids, in order) and
/// the state each intent was last answered with.
#[derive(Default)]
struct Model {
    applied: BTreeMap<String, Vec<String>>,
    states: BTreeMap<String, IntentState>,
    /// What each applied op id wrote, resent as its retry.
    sent: BTreeMap<String, Write>,
    /// The next fresh event id.
    next_event: u64,
}

struct Run {
    engine: Engine<KvStore>,
    /// Every record since the checkpoint (or the start), and the checkpoint.
    log: Vec<Record>,
    checkpoint: Option<Value>,
    now_ms: u64,
    model: Model,
}

impl Run {
    /// The engine a restart rebuilds: the checkpoint, the records after it, then the first
    /// tick's retention pass (replay does not know the time; settled entries the live engine
    /// dropped come back until then).
    fn rebuild(&self) -> Engine<KvStore> {
        let mut engine = match &self.checkpoint {
            Some(snapshot) => {
                Engine::restore(config(), serde_json::from_value(snapshot.clone()).unwrap())
                    .unwrap()
            }
            None => Engine::new(config(), KvStore::new()),
        };
        for record in &self.log {
            engine.replay(record.clone()).unwrap();
        }
        engine.step(Event::Tick {
            now_ms: self.now_ms,
        });
        engine
    }

    fn event_id(&self, n: u8) -> String {
        format!("e-{}", u64::from(n) % self.model.next_event.max(1))
    }

    fn apply(&mut self, op: Op) {
        let now_ms = self.now_ms;
        match op {
            Op::Write {
                op,
                aggregates,
                check_holds,
            } => {
                let op_id = format!("w-{op}");
                // A repeat of an applied op id is its retry: the same write again.
                let write = match self.model.sent.get(&op_id) {
                    Some(write) => write.clone(),
                    None => {
                        let next = aggregates
                            .iter()
                            .enumerate()
                            .map(|(i, a)| {
                                let id = format!("e-{}", self.model.next_event + i as u64);
                                intent(&id, &format!("agg-{a}"))
                            })
                            .collect();
                        let version = self.engine.resource().get("k").map_or(0, |e| e.version);
                        let expected = if check_holds { version } else { version + 7 };
                        let ops = json!([{"op": "check", "key": "k", "version": expected},
                                         {"op": "put", "key": "k", "value": op}]);
                        Write {
                            op_id: op_id.clone(),
                            fence: None,
                            payload: json!({ "ops": ops }),
                            next,
                        }
                    }
                };
                let next = write.next.clone();
                let before = self.engine.outbox().counts().written;
                let event = Event::Write {
                    write: write.clone(),
                    now_ms,
                };
                let reply = step(&mut self.engine, event, &mut self.log);
                match reply {
                    Reply::Fenced(FencedAnswer::Applied { intents, .. }) => {
                        let ids: Vec<String> = intents.into_iter().map(|i| i.event_id).collect();
                        if !self.model.applied.contains_key(&op_id) {
                            assert_eq!(ids.len(), next.len());
                            self.model.next_event += 4;
                            for id in &ids {
                                self.model.states.insert(id.clone(), IntentState::Pending);
                            }
                            self.model.applied.insert(op_id.clone(), ids);
                            self.model.sent.insert(op_id, write);
                        } else {
                            assert_eq!(
                                self.model.applied[&op_id], ids,
                                "a repeat answers the same"
                            );
                        }
                    }
                    Reply::Reject(rejection) => {
                        assert_eq!(
                            self.engine.outbox().counts().written,
                            before,
                            "{rejection}: nothing recorded"
                        );
                    }
                    other => panic!("{other:?}"),
                }
            }
            Op::Delivered(n) => self.report(n, delivered()),
            Op::Attempt(n, permanent) => self.report(
                n,
                IntentRequest::Attempt {
                    error: "timeout".into(),
                    permanent,
                },
            ),
            Op::Retry(n) => self.report(
                n,
                IntentRequest::Retry {
                    operator: "op".into(),
                    reason: "retry".into(),
                },
            ),
            Op::Mark(n, as_delivered) => self.report(
                n,
                IntentRequest::Mark {
                    state: Some(if as_delivered {
                        IntentState::Delivered
                    } else {
                        IntentState::Abandoned
                    }),
                    operator: "op".into(),
                    reason: "settled by hand".into(),
                },
            ),
            Op::Tick(ms) => {
                self.now_ms += u64::from(ms);
                self.engine.step(Event::Tick {
                    now_ms: self.now_ms,
                });
            }
            Op::Checkpoint => {
                self.checkpoint =
                    Some(serde_json::to_value(self.engine.snapshot().unwrap()).unwrap());
                self.log.clear();
            }
            Op::Restart => {
                let rebuilt = self.rebuild();
                assert_eq!(
                    rebuilt.outbox(),
                    self.engine.outbox(),
                    "replay: the same table"
                );
                assert_eq!(rebuilt.resource(), self.engine.resource());
                self.engine = rebuilt;
            }
        }
    }

    fn report(&mut self, n: u8, request: IntentRequest) {
        let event_id = self.event_id(n);
        let was = self.engine.outbox().get(&event_id).cloned();
        let relay_delivery = matches!(request, IntentRequest::Delivered { .. });
        let event = Event::Intent {
            event_id: event_id.clone(),
            request,
            now_ms: self.now_ms,
        };
        match step(&mut self.engine, event, &mut self.log) {
            Reply::Intent(entry) => {
                let was = was.expect("answered only for a known intent");
                let settled_before =
                    matches!(was.state, IntentState::Delivered | IntentState::Abandoned);
                if relay_delivery && !settled_before {
                    // Never delivered out of order: every earlier intent of its aggregate
                    // is settled.
                    let earlier_open = self.engine.outbox().entries().any(|e| {
                        e.aggregate == entry.aggregate
                            && e.seq < entry.seq
                            && crate::outbox::table::is_open(e.state)
                    });
                    assert!(!earlier_open, "{event_id} delivered out of order");
                }
                if settled_before {
                    assert_eq!(*entry, was, "a settled intent is answered unchanged");
                }
                self.model.states.insert(event_id, entry.state);
            }
            Reply::Reject(_) => {
                assert_eq!(self.engine.outbox().get(&event_id), was.as_ref());
            }
            other => panic!("{other:?}"),
        }
    }

    fn check(&self) {
        let outbox = self.engine.outbox();
        // An intent exists only with its write, as that write declared it.
        for entry in outbox.entries() {
            let ids = self.model.applied.get(&entry.op_id);
            assert!(
                ids.is_some_and(|ids| ids.contains(&entry.event_id)),
                "{} without its write {}",
                entry.event_id,
                entry.op_id
            );
        }
        // Every applied write's intents exist unless settled and past retention: nothing
        // pending or failed is ever dropped.
        for ids in self.model.applied.values() {
            for id in ids {
                let state = self.model.states[id];
                if crate::outbox::table::is_open(state) {
                    assert_eq!(outbox.get(id).map(|e| e.state), Some(state), "{id}");
                }
            }
        }
        // Seqs per aggregate strictly increase in write order.
        let mut last: BTreeMap<&str, u64> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for entry in outbox.entries() {
            assert!(seen.insert(entry.event_id.as_str()));
            let before = last.insert(&entry.aggregate, entry.seq).unwrap_or(0);
            assert!(entry.seq > before, "{entry:?} after seq {before}");
            assert!(entry.seq <= outbox.last_seq(&entry.aggregate));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn the_outbox_keeps_its_invariants_through_reports_retention_and_restarts(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        let mut run = Run {
            engine: Engine::new(config(), KvStore::new()),
            log: Vec::new(),
            checkpoint: None,
            now_ms: 10,
            model: Model::default(),
        };
        for op in ops {
            run.apply(op);
            run.check();
        }
        let rebuilt = run.rebuild();
        prop_assert_eq!(rebuilt.outbox(), run.engine.outbox());
    }
}
