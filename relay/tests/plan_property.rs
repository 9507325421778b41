//! The planner against a model world: a participant's outbox (answering listings, possibly
//! stale ones, and checking reports as claims), a receiver that deduplicates by `event_id`,
//! and a network that drops, duplicates and reorders messages, while the relay crashes (its
//! memory lost; it starts again from a listing) and the participant keeps writing.
//!
//! Checked: every intent is eventually delivered and marked once faults stop; per aggregate,
//! first deliveries come in seq order; the receiver applies each event's effect once; nothing
//! is marked delivered that the receiver does not have; no delivery carries an id or a body
//! that is not an intent's.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use protocol::outbox::{IntentState, OutboxEntry, OutboxList};
use relay::plan::{Command, Config, Event, Planner, Report, ReportResult};
use serde_json::json;

const P: &str = "orders";

fn config() -> Config {
    Config {
        poll_ms: 500,
        backoff_base_ms: 50,
        backoff_max_ms: 800,
        max_in_flight: 3,
    }
}

/// One message on the network. Responses to the relay carry what the relay hears if they are
/// lost instead (the shell's timeout turns every lost request or answer into that).
#[derive(Debug, Clone)]
enum Msg {
    Deliver {
        incarnation: u32,
        entry: OutboxEntry,
    },
    List {
        incarnation: u32,
        generation: u64,
    },
    Report {
        incarnation: u32,
        event_id: String,
        report: Report,
    },
    ToRelay {
        incarnation: u32,
        event: Event,
        if_lost: Event,
    },
}

impl Msg {
    fn incarnation(&self) -> u32 {
        match self {
            Msg::Deliver { incarnation, .. }
            | Msg::List { incarnation, .. }
            | Msg::Report { incarnation, .. }
            | Msg::ToRelay { incarnation, .. } => *incarnation,
        }
    }

    /// What the relay hears when this message is lost.
    fn lost(&self) -> Event {
        match self {
            Msg::Deliver { entry, .. } => Event::Unknown {
                participant: P.into(),
                event_id: entry.event_id.clone(),
                error: "timed out".into(),
                jitter_permille: 500,
            },
            Msg::List { generation, .. } => Event::ListFailed {
                participant: P.into(),
                generation: *generation,
            },
            Msg::Report {
                event_id, report, ..
            } => Event::Reported {
                participant: P.into(),
                event_id: event_id.clone(),
                report: *report,
                result: ReportResult::Failed,
                jitter_permille: 500,
            },
            Msg::ToRelay { if_lost, .. } => if_lost.clone(),
        }
    }
}

#[derive(Debug, Default)]
struct World {
    now: u64,
    incarnation: u32,
    /// The participant's outbox, in write order.
    outbox: Vec<OutboxEntry>,
    /// The open listing after every change, oldest first (stale listings come from here).
    snapshots: Vec<Vec<OutboxEntry>>,
    /// The receiver: how often each event's effect was applied, and the order of first
    /// deliveries per aggregate.
    effects: BTreeMap<String, u32>,
    first_seqs: BTreeMap<String, Vec<u64>>,
    network: Vec<Msg>,
}

impl World {
    fn write(&mut self, aggregate: usize) {
        let aggregate = format!("agg-{aggregate}");
        let seq = self
            .outbox
            .iter()
            .filter(|e| e.aggregate == aggregate)
            .count() as u64
            + 1;
        self.outbox.push(OutboxEntry {
            event_id: format!("{aggregate}-{seq}"),
            aggregate,
            seq,
            target: "payments".into(),
            kind: "payment.authorize.v1".into(),
            body: json!({"seq": seq}),
            state: IntentState::Pending,
            op_id: format!("op-{}", self.outbox.len()),
            created_at_ms: self.now,
            attempts: 0,
            last_error: None,
            last_attempt_at_ms: None,
            delivered_at_ms: None,
            answer: None,
            marks: Vec::new(),
            age_ms: None,
        });
        self.snapshot();
    }

    fn snapshot(&mut self) {
        let open = self
            .outbox
            .iter()
            .filter(|e| e.state == IntentState::Pending)
            .cloned()
            .collect();
        self.snapshots.push(open);
    }

    /// Carries out the relay's commands (a timer is not needed: the model ticks often).
    fn send(&mut self, commands: Vec<Command>) {
        let incarnation = self.incarnation;
        for command in commands {
            let msg = match command {
                Command::Deliver { participant, entry } => {
                    assert_eq!(participant, P);
                    Msg::Deliver {
                        incarnation,
                        entry: *entry,
                    }
                }
                Command::List { generation, .. } => Msg::List {
                    incarnation,
                    generation,
                },
                Command::ReportDelivered {
                    event_id, answer, ..
                } => {
                    assert_eq!(
                        answer,
                        json!({"effect": event_id}),
                        "the receiver's own answer"
                    );
                    Msg::Report {
                        incarnation,
                        event_id,
                        report: Report::Delivered,
                    }
                }
                Command::ReportAttempt {
                    event_id,
                    permanent,
                    ..
                } => {
                    assert!(!permanent, "this receiver never refuses");
                    Msg::Report {
                        incarnation,
                        event_id,
                        report: Report::Attempt,
                    }
                }
                Command::SetTimer { .. } => continue,
            };
            self.network.push(msg);
        }
    }

    /// Hands message `index` to its addressee; `lag` picks how stale a listing is.
    fn arrive(&mut self, index: usize, lag: usize, planner: &mut Planner) {
        let msg = self.network.remove(index);
        let incarnation = msg.incarnation();
        let if_lost = msg.lost();
        let event = match msg {
            Msg::ToRelay { event, .. } => {
                if incarnation == self.incarnation {
                    let commands = planner.step(self.now, event);
                    self.send(commands);
                }
                return;
            }
            Msg::Deliver { entry, .. } => self.receive(&entry),
            Msg::List { generation, .. } => {
                let back = lag.min(self.snapshots.len().saturating_sub(1));
                let intents = self
                    .snapshots
                    .get(self.snapshots.len().wrapping_sub(1 + back))
                    .cloned()
                    .unwrap_or_default();
                Event::Listed {
                    participant: P.into(),
                    generation,
                    list: OutboxList {
                        intents,
                        pending: 0,
                        failed: 0,
                        oldest_pending_age_ms: None,
                        truncated: false,
                    },
                }
            }
            Msg::Report {
                event_id, report, ..
            } => self.report(&event_id, report),
        };
        self.network.push(Msg::ToRelay {
            incarnation,
            event,
            if_lost,
        });
    }

    /// The receiver: applies an event's effect the first time, answers the same every time.
    fn receive(&mut self, entry: &OutboxEntry) -> Event {
        let intent = self.outbox.iter().find(|e| e.event_id == entry.event_id);
        let intent =
            intent.unwrap_or_else(|| panic!("delivered under an unknown id {}", entry.event_id));
        assert_eq!(
            (&intent.aggregate, intent.seq, &intent.body),
            (&entry.aggregate, entry.seq, &entry.body),
            "a delivery that is not the intent as written"
        );
        let count = self.effects.entry(entry.event_id.clone()).or_insert(0);
        if *count == 0 {
            let firsts = self.first_seqs.entry(entry.aggregate.clone()).or_default();
            assert_eq!(
                entry.seq,
                firsts.len() as u64 + 1,
                "{} delivered before an earlier intent of its aggregate ({firsts:?})",
                entry.event_id
            );
            firsts.push(entry.seq);
        }
        // The effect happens once: a repeat is recognised by its event_id.
        *count = 1;
        Event::Delivered {
            participant: P.into(),
            event_id: entry.event_id.clone(),
            answer: json!({"effect": entry.event_id}),
        }
    }

    /// The participant, checking a report as a claim.
    fn report(&mut self, event_id: &str, report: Report) -> Event {
        let answer = |result| Event::Reported {
            participant: P.into(),
            event_id: event_id.to_string(),
            report,
            result,
            jitter_permille: 250,
        };
        let Some(at) = self.outbox.iter().position(|e| e.event_id == event_id) else {
            return answer(ReportResult::Refused);
        };
        if report != Report::Delivered {
            return answer(ReportResult::Accepted);
        }
        assert!(
            self.effects.contains_key(event_id),
            "{event_id} marked delivered, and the receiver does not have it"
        );
        let aggregate = self.outbox[at].aggregate.clone();
        let seq = self.outbox[at].seq;
        if self.outbox[at].state == IntentState::Delivered {
            return answer(ReportResult::Accepted);
        }
        let earlier_open = self
            .outbox
            .iter()
            .any(|e| e.aggregate == aggregate && e.seq < seq && e.state != IntentState::Delivered);
        if earlier_open {
            return answer(ReportResult::Refused);
        }
        self.outbox[at].state = IntentState::Delivered;
        self.snapshot();
        answer(ReportResult::Accepted)
    }

    fn tick(&mut self, planner: &mut Planner) {
        let commands = planner.step(self.now, Event::Tick);
        self.send(commands);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Arrive { pick: usize, lag: usize },
    Duplicate { pick: usize },
    Drop { pick: usize },
    Advance { ms: u64 },
    Crash,
    Write { aggregate: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<usize>(), 0usize..4).prop_map(|(pick, lag)| Op::Arrive { pick, lag }),
        1 => any::<usize>().prop_map(|pick| Op::Duplicate { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Drop { pick }),
        2 => (1u64..700).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Crash),
        1 => (0usize..4).prop_map(|aggregate| Op::Write { aggregate }),
    ]
}

fn run(initial: &[usize], ops: &[Op]) {
    let mut world = World::default();
    for aggregate in initial {
        world.write(*aggregate);
    }
    let mut planner = Planner::new(config(), [P.to_string()]);
    world.tick(&mut planner);
    for op in ops {
        match *op {
            Op::Arrive { pick, lag } if !world.network.is_empty() => {
                let index = pick % world.network.len();
                world.arrive(index, lag, &mut planner);
            }
            Op::Duplicate { pick } if !world.network.is_empty() => {
                // Only requests are duplicated: an answer travels on its request's connection.
                let msg = world.network[pick % world.network.len()].clone();
                if !matches!(msg, Msg::ToRelay { .. }) {
                    world.network.push(msg);
                }
            }
            Op::Drop { pick } if !world.network.is_empty() => {
                let msg = world.network.remove(pick % world.network.len());
                world.network.push(Msg::ToRelay {
                    incarnation: msg.incarnation(),
                    event: msg.lost(),
                    if_lost: msg.lost(),
                });
            }
            Op::Advance { ms } => {
                world.now += ms;
                world.tick(&mut planner);
            }
            Op::Crash => {
                world.incarnation += 1;
                planner = Planner::new(config(), [P.to_string()]);
                world.tick(&mut planner);
            }
            Op::Write { aggregate } => world.write(aggregate),
            _ => {}
        }
    }
    // Faults stop: messages arrive in order, listings are fresh, time moves on.
    for _ in 0..20_000 {
        if world
            .outbox
            .iter()
            .all(|e| e.state == IntentState::Delivered)
        {
            break;
        }
        if world.network.is_empty() {
            world.now += 100;
            world.tick(&mut planner);
        } else {
            world.arrive(0, 0, &mut planner);
        }
    }
    for entry in &world.outbox {
        assert_eq!(
            entry.state,
            IntentState::Delivered,
            "{} was never marked delivered",
            entry.event_id
        );
        assert_eq!(world.effects.get(&entry.event_id), Some(&1));
    }
    let aggregates: BTreeSet<&String> = world.outbox.iter().map(|e| &e.aggregate).collect();
    assert_eq!(aggregates.len(), world.first_seqs.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn intents_arrive_once_in_order_through_faults_and_crashes(
        initial in prop::collection::vec(0usize..4, 0..10),
        ops in prop::collection::vec(op(), 0..300),
    ) {
        run(&initial, &ops);
    }
}

#[test]
fn a_quiet_run_delivers_everything() {
    run(&[0, 0, 1, 2, 2, 2, 3], &[]);
}
