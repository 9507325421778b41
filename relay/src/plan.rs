//! The relay's decisions, pure: events in (a listing, a delivery's result, a report's answer, a
//! tick), commands out (deliver, report, list, set a timer). No I/O, no clock, no randomness:
//! the time comes with each step and the jitter of a backoff comes with the event that asks for
//! one, so a test replays any run exactly.
//!
//! The rules it keeps, per participant and aggregate:
//! - only the lowest-seq open intent of an aggregate (its head, as a listing shows it) is ever
//!   delivered, and only while it is `pending`; a `failed` head holds its aggregate back;
//! - at most one delivery of an aggregate is in flight, and at most `max_in_flight` overall;
//! - a delivery whose outcome is unknown is repeated under the same `event_id` (the same entry,
//!   as listed), after an exponential backoff;
//! - `delivered` is reported only with the receiver's answer, and the aggregate's next intent
//!   goes only after that report was accepted and a listing asked for after it shows the next
//!   head (a listing asked for earlier may predate the report, so it is not trusted for that
//!   aggregate);
//! - a refused report (409: out of order, or already settled) or a 404 sends the aggregate back
//!   to a fresh listing.
//!
//! It must never make up an `event_id` or change an entry: every `Deliver` carries an entry a
//! listing gave.

use std::collections::BTreeMap;

use protocol::outbox::{IntentState, OutboxEntry, OutboxList};
use serde_json::Value;

use crate::backoff::backoff_ms;
pub use crate::events::{Command, Event, Report, ReportResult};

/// How the relay paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Between two listings of one participant.
    pub poll_ms: u64,
    /// The first backoff after an unknown outcome (doubling after each further one).
    pub backoff_base_ms: u64,
    /// The longest backoff.
    pub backoff_max_ms: u64,
    /// Most deliveries in flight at once, over every participant.
    pub max_in_flight: usize,
}

/// Where one aggregate stands.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Nothing in flight: its head, when pending, may go.
    Idle,
    /// One delivery of `entry` in flight; `attempt` counts from 1.
    Delivering { entry: OutboxEntry, attempt: u32 },
    /// The last attempt's outcome is unknown; the same entry goes again at `until_ms`.
    Backoff {
        entry: OutboxEntry,
        attempt: u32,
        until_ms: u64,
    },
    /// The receiver answered (`answer`) or refused for good (`permanent`); the report of it is
    /// in flight, or due again at `retry_at_ms` after a failed one.
    Reporting {
        entry: OutboxEntry,
        outcome: Settled,
        retries: u32,
        retry_at_ms: Option<u64>,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Settled {
    Answer(Value),
    Permanent(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Aggregate {
    /// The lowest-seq open entry of the newest listing trusted for this aggregate.
    head: Option<OutboxEntry>,
    phase: Phase,
    /// Listings of an older generation are not trusted here (asked for before a report of
    /// this aggregate was accepted).
    fresh_from: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Participant {
    aggregates: BTreeMap<String, Aggregate>,
    /// The generation of the listing in flight.
    listing: Option<u64>,
    /// A listing is wanted as soon as none is in flight.
    list_wanted: bool,
    next_poll_ms: u64,
}

/// The planner: all the relay knows, in memory (a restart begins again from listings).
#[derive(Debug, Clone, PartialEq)]
pub struct Planner {
    config: Config,
    participants: BTreeMap<String, Participant>,
    in_flight: usize,
    generation: u64,
    timer: Option<u64>,
    /// The (participant, aggregate) whose delivery started last: the next walk starts after it.
    last_dispatched: Option<(String, String)>,
}

impl Planner {
    /// A planner for these participants; its first `Tick` lists every one of them.
    pub fn new(config: Config, participants: impl IntoIterator<Item = String>) -> Planner {
        let participants = participants
            .into_iter()
            .map(|name| {
                let participant = Participant {
                    aggregates: BTreeMap::new(),
                    listing: None,
                    list_wanted: true,
                    next_poll_ms: 0,
                };
                (name, participant)
            })
            .collect();
        Planner {
            config,
            participants,
            in_flight: 0,
            generation: 0,
            timer: None,
            last_dispatched: None,
        }
    }

    /// Deliveries in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Takes one event at `now_ms` and says what to do.
    pub fn step(&mut self, now_ms: u64, event: Event) -> Vec<Command> {
        let mut out = Vec::new();
        match event {
            Event::Tick => self.tick(now_ms, &mut out),
            Event::Listed {
                participant,
                generation,
                list,
            } => self.listed(&participant, generation, Some(&list)),
            Event::ListFailed {
                participant,
                generation,
            } => self.listed(&participant, generation, None),
            Event::Delivered {
                participant,
                event_id,
                answer,
            } => self.settle(&participant, &event_id, Settled::Answer(answer), &mut out),
            Event::Refused {
                participant,
                event_id,
                error,
            } => self.settle(&participant, &event_id, Settled::Permanent(error), &mut out),
            Event::Unknown {
                participant,
                event_id,
                error,
                jitter_permille,
            } => self.unknown(
                now_ms,
                &participant,
                &event_id,
                error,
                jitter_permille,
                &mut out,
            ),
            Event::Reported {
                participant,
                event_id,
                report,
                result,
                jitter_permille,
            } => self.reported(
                now_ms,
                &participant,
                &event_id,
                report,
                result,
                jitter_permille,
            ),
        }
        self.dispatch(now_ms, &mut out);
        self.lists(&mut out);
        self.set_timer(now_ms, &mut out);
        out
    }

    fn tick(&mut self, now_ms: u64, out: &mut Vec<Command>) {
        // The shell's timer fired (or it woke for another reason): the next one is set anew.
        self.timer = None;
        let poll_ms = self.config.poll_ms;
        for (name, participant) in &mut self.participants {
            if now_ms >= participant.next_poll_ms {
                participant.list_wanted = true;
                participant.next_poll_ms = now_ms.saturating_add(poll_ms);
            }
            for aggregate in participant.aggregates.values_mut() {
                if let Phase::Reporting {
                    entry,
                    outcome,
                    retry_at_ms,
                    ..
                } = &mut aggregate.phase
                    && retry_at_ms.is_some_and(|at| now_ms >= at)
                {
                    *retry_at_ms = None;
                    out.push(report_command(name, entry, outcome));
                }
            }
        }
    }

    fn listed(&mut self, name: &str, generation: u64, list: Option<&OutboxList>) {
        let Some(participant) = self.participants.get_mut(name) else {
            return;
        };
        if participant.listing == Some(generation) {
            participant.listing = None;
        }
        let Some(list) = list else {
            return;
        };
        // Each aggregate's head: its lowest seq among the open entries listed.
        let mut heads: BTreeMap<&str, &OutboxEntry> = BTreeMap::new();
        for entry in &list.intents {
            if !matches!(entry.state, IntentState::Pending | IntentState::Failed) {
                continue;
            }
            let head = heads.entry(entry.aggregate.as_str()).or_insert(entry);
            if entry.seq < head.seq {
                *head = entry;
            }
        }
        for (key, aggregate) in &mut participant.aggregates {
            if generation < aggregate.fresh_from {
                continue;
            }
            let head = heads.get(key.as_str()).map(|e| (*e).clone());
            match &aggregate.phase {
                Phase::Idle => aggregate.head = head,
                Phase::Backoff { entry, .. } => {
                    let same = head.as_ref().is_some_and(|h| {
                        h.event_id == entry.event_id && h.state == IntentState::Pending
                    });
                    if !same {
                        // Settled meanwhile (an operator marked it, or another relay's report):
                        // what the listing says goes.
                        aggregate.phase = Phase::Idle;
                        aggregate.head = head;
                    }
                }
                Phase::Delivering { .. } | Phase::Reporting { .. } => {}
            }
        }
        for (key, entry) in heads {
            if !participant.aggregates.contains_key(key) {
                participant.aggregates.insert(
                    key.to_string(),
                    Aggregate {
                        head: Some(entry.clone()),
                        phase: Phase::Idle,
                        fresh_from: 0,
                    },
                );
            }
        }
        // An idle aggregate with nothing open is forgotten (its fresh_from with it: every
        // later listing is asked for after its last accepted report).
        participant
            .aggregates
            .retain(|_, a| a.phase != Phase::Idle || a.head.is_some() || a.fresh_from > generation);
    }

    fn settle(&mut self, name: &str, event_id: &str, outcome: Settled, out: &mut Vec<Command>) {
        let Some(aggregate) = self.delivering(name, event_id) else {
            return;
        };
        let Phase::Delivering { entry, .. } = &aggregate.phase else {
            return;
        };
        let entry = entry.clone();
        out.push(report_command(name, &entry, &outcome));
        aggregate.phase = Phase::Reporting {
            entry,
            outcome,
            retries: 0,
            retry_at_ms: None,
        };
        self.in_flight -= 1;
    }

    fn unknown(
        &mut self,
        now_ms: u64,
        name: &str,
        event_id: &str,
        error: String,
        jitter_permille: u16,
        out: &mut Vec<Command>,
    ) {
        let config = self.config;
        let Some(aggregate) = self.delivering(name, event_id) else {
            return;
        };
        let Phase::Delivering { entry, attempt } = &aggregate.phase else {
            return;
        };
        out.push(Command::ReportAttempt {
            participant: name.to_string(),
            event_id: event_id.to_string(),
            error,
            permanent: false,
        });
        let until_ms = now_ms.saturating_add(backoff_ms(
            config.backoff_base_ms,
            config.backoff_max_ms,
            *attempt,
            jitter_permille,
        ));
        aggregate.phase = Phase::Backoff {
            entry: entry.clone(),
            attempt: attempt.saturating_add(1),
            until_ms,
        };
        self.in_flight -= 1;
    }

    fn reported(
        &mut self,
        now_ms: u64,
        name: &str,
        event_id: &str,
        report: Report,
        result: ReportResult,
        jitter_permille: u16,
    ) {
        let config = self.config;
        let generation = self.generation;
        let Some(participant) = self.participants.get_mut(name) else {
            return;
        };
        let Some(aggregate) = participant.aggregates.values_mut().find(
            |a| matches!(&a.phase, Phase::Reporting { entry, .. } if entry.event_id == event_id),
        ) else {
            // An attempt report (nothing waits for it), or a stale answer.
            if report == Report::Attempt && result == ReportResult::Refused {
                participant.list_wanted = true;
            }
            return;
        };
        if report == Report::Attempt {
            return;
        }
        match result {
            ReportResult::Accepted | ReportResult::Refused => {
                aggregate.phase = Phase::Idle;
                aggregate.head = None;
                aggregate.fresh_from = generation.saturating_add(1);
                participant.list_wanted = true;
            }
            ReportResult::Failed => {
                if let Phase::Reporting {
                    retries,
                    retry_at_ms,
                    ..
                } = &mut aggregate.phase
                {
                    *retries = retries.saturating_add(1);
                    let delay = backoff_ms(
                        config.backoff_base_ms,
                        config.backoff_max_ms,
                        *retries,
                        jitter_permille,
                    );
                    *retry_at_ms = Some(now_ms.saturating_add(delay));
                }
            }
        }
    }

    /// The aggregate of `participant` whose delivery of `event_id` is in flight.
    fn delivering(&mut self, name: &str, event_id: &str) -> Option<&mut Aggregate> {
        self.participants
            .get_mut(name)?
            .aggregates
            .values_mut()
            .find(|a| matches!(&a.phase, Phase::Delivering { entry, .. } if entry.event_id == event_id))
    }

    /// Starts the deliveries that may go: idle aggregates whose head is pending, and
    /// aggregates whose backoff has ended (the same entry again), up to `max_in_flight`. The
    /// walk starts after the aggregate that went last, so when room is short every aggregate
    /// gets its turn (names early in the order do not take every freed place).
    fn dispatch(&mut self, now_ms: u64, out: &mut Vec<Command>) {
        let mut ready: Vec<(String, String)> = Vec::new();
        for (name, participant) in &self.participants {
            for (key, aggregate) in &participant.aggregates {
                let may_go = match &aggregate.phase {
                    Phase::Idle => aggregate
                        .head
                        .as_ref()
                        .is_some_and(|h| h.state == IntentState::Pending),
                    Phase::Backoff { until_ms, .. } => now_ms >= *until_ms,
                    _ => false,
                };
                if may_go {
                    ready.push((name.clone(), key.clone()));
                }
            }
        }
        let first = self
            .last_dispatched
            .as_ref()
            .map_or(0, |last| ready.partition_point(|k| k <= last));
        ready.rotate_left(first);
        for (name, key) in ready {
            if self.in_flight >= self.config.max_in_flight {
                return;
            }
            let Some(aggregate) = self
                .participants
                .get_mut(&name)
                .and_then(|p| p.aggregates.get_mut(&key))
            else {
                continue;
            };
            let (entry, attempt) = match &aggregate.phase {
                Phase::Idle => match aggregate.head.take() {
                    Some(head) => (head, 1),
                    None => continue,
                },
                Phase::Backoff { entry, attempt, .. } => (entry.clone(), *attempt),
                _ => continue,
            };
            self.in_flight += 1;
            out.push(Command::Deliver {
                participant: name.clone(),
                entry: Box::new(entry.clone()),
            });
            aggregate.phase = Phase::Delivering { entry, attempt };
            self.last_dispatched = Some((name, key));
        }
    }

    fn lists(&mut self, out: &mut Vec<Command>) {
        for (name, participant) in &mut self.participants {
            if participant.list_wanted && participant.listing.is_none() {
                self.generation += 1;
                participant.list_wanted = false;
                participant.listing = Some(self.generation);
                out.push(Command::List {
                    participant: name.clone(),
                    generation: self.generation,
                });
            }
        }
    }

    /// The earliest time something is due: a poll, a backoff's end, a report's retry. A time
    /// already past is not one: what waits then waits for room (a delivery's result), not for
    /// the clock.
    fn set_timer(&mut self, now_ms: u64, out: &mut Vec<Command>) {
        let mut due: Option<u64> = None;
        let mut consider = |at: u64| {
            if at > now_ms {
                due = Some(due.map_or(at, |d| d.min(at)));
            }
        };
        for participant in self.participants.values() {
            consider(participant.next_poll_ms);
            for aggregate in participant.aggregates.values() {
                match &aggregate.phase {
                    Phase::Backoff { until_ms, .. } => consider(*until_ms),
                    Phase::Reporting {
                        retry_at_ms: Some(at),
                        ..
                    } => consider(*at),
                    _ => {}
                }
            }
        }
        if due.is_some() && due != self.timer {
            self.timer = due;
            if let Some(at_ms) = due {
                out.push(Command::SetTimer { at_ms });
            }
        }
    }
}

fn report_command(name: &str, entry: &OutboxEntry, outcome: &Settled) -> Command {
    match outcome {
        Settled::Answer(answer) => Command::ReportDelivered {
            participant: name.to_string(),
            event_id: entry.event_id.clone(),
            answer: answer.clone(),
        },
        Settled::Permanent(error) => Command::ReportAttempt {
            participant: name.to_string(),
            event_id: entry.event_id.clone(),
            error: error.clone(),
            permanent: true,
        },
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
