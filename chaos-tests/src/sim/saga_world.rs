//! Deterministic simulation of sagas (issue 13): the coordinator's pure `SagaEngine` and the
//! participants' pure saga barrier (`participant::Engine<KvStore>::saga_op`), three KV
//! participants, clients that submit and resubmit checkout sagas, and a seeded network that
//! drops, duplicates and delays every message (actions, compensations, op queries and their
//! answers), with coordinator and participant crashes back to their durable logs (and
//! checkpoints) until the faults heal.
//!
//! Modelled runtime contracts: a record is applied when it is appended and durable only when
//! its fsync comes back, a few milliseconds later and in log order (a checkpoint is ordered
//! with the records, as the WAL orders it); a crash loses every record not yet durable, at
//! the coordinator and at the participants. The coordinator's shell executes a step's other
//! commands (sends, replies) only once its records are durable and then reports that to the
//! engine (`SagaEvent::Durable`); a participant answers only once everything it logged before
//! the answer is durable (its forced barrier); a call that gets no answer within the step
//! timeout is `unknown`.
//!
//! Clocks: the simulation's own time is true time. The coordinator's wall clock is stepped
//! forward and back (up to a minute within a run, up to an hour across a restart) and slewed
//! (up to 20% fast or slow) while faults last; its monotonic clock runs at true time. The
//! shell feeds the saga engine its saga clock (the wall clock read at start, advanced by the
//! monotonic clock), as `runtime::sagas` does. While faults last, participants are also cut
//! off for seconds (so sagas wait on them across coordinator restarts), and some refuse fences
//! (the compensation of a step they have no record of) for a while, some until well after the
//! other faults healed, answering `failed` or 503 without recording anything.
//!
//! Invariants, once every saga settled (checked with `saga_checkout::check`): every saga ends
//! `completed` with every step applied once, or `compensated` with every succeeded step undone
//! once and nothing else, or `needs_attention` with a reason; a client that heard a terminal
//! state never sees another one later; a client told 202 finds its saga after every crash;
//! every saga that began ends (liveness after healing). While it runs:
//! - deadlines (docs/sagas.md, "Deadlines"): a saga's counted time runs on true time while
//!   the coordinator is up, and after a crash resumes from what its latest durable record or
//!   checkpoint counted (downtime and the time after that record do not count). No saga times
//!   out before its counted time reaches `timeout_ms`, and every saga not ended has timed out
//!   by `timeout_ms + DEADLINE_SLACK_MS`;
//! - fences: once the faults healed, a saga whose fence has been refused for `FENCE_HOLD_MS`
//!   shows that step `compensation_failing` (counted in `compensations_failing`), and every
//!   other step that succeeded is compensated by then (the fence held nothing up); no saga is
//!   `compensated` while one of its fences was refused and never taken.
//!
//! Must never: read the clock, spawn anything, or draw randomness outside the seeded rng.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use coordinator::records::{LogRecord, SagaRecord};
use coordinator::saga::engine::{
    ProbeAnswer, SagaCommand, SagaConfig, SagaEngine, SagaEvent, SagaReply, SagaWait,
};
use participant::kv::KvStore;
use participant::record::Record;
use participant::{Engine, EngineConfig};
use protocol::digest::{Digest, Fnv128};
use protocol::saga::{
    OpKind, OpStatus, SagaOpAnswer, SagaOpRequest, SagaRequest, SagaResponse, SagaState,
    StepStatus, op_id,
};
use protocol::{CoordinatorId, Epoch, TxId};

use cluster::checkout::{INVENTORY, PAYMENTS, SHIPPING};
use cluster::saga_checkout::{self, Effects, Fate};

const NAMES: [&str; 3] = [INVENTORY, PAYMENTS, SHIPPING];
const CONFIG: SagaConfig = SagaConfig {
    retry_base_ms: 20,
    retry_max_ms: 200,
    step_timeout_ms: 100,
};
/// Faults stop here; afterwards every saga must settle.
const HEAL_AT_MS: u64 = 20_000;
/// How late past its counted timeout a saga may start compensating: a deadline timer is
/// armed once its step's records are durable, and a stalled disk takes up to 300 ms.
const DEADLINE_SLACK_MS: u64 = 1_000;
/// How long after the faults healed (or after it was first refused, if later) a refused fence
/// may keep the saga's other compensations waiting: a few backoffs and round trips.
const FENCE_HOLD_MS: u64 = 5_000;
/// Where the coordinator's wall clock starts (Unix ms, about 2026).
const WALL_START_MS: u64 = 1_780_000_000_000;
/// Simulated-time bound of a run.
const END_MS: u64 = 600_000;

/// One run's knobs.
#[derive(Debug, Clone, Copy)]
pub struct SagaSimConfig {
    pub sagas: usize,
    /// A deliberately broken shell, to show the invariants catch it.
    pub mutation: Option<SagaMutation>,
}

impl Default for SagaSimConfig {
    fn default() -> Self {
        SagaSimConfig {
            sagas: 6,
            mutation: None,
        }
    }
}

/// Deliberately broken shells: ones that answer before what the answer rests on is durable,
/// or time deadlines on the wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SagaMutation {
    /// The coordinator's shell feeds the saga engine its wall clock, which steps and slews
    /// (as before issue 25, item 5), instead of the saga clock that cannot step in a run.
    DeadlineOnWallClock,
    /// The coordinator's shell sends a step's replies without waiting for its records.
    CoordinatorRepliesBeforeDurable,
    /// The participant answers a repeated op and a probe from its barrier in memory, with no
    /// forced barrier behind the first op's record (issue 25, item 2).
    ParticipantAnswersFromMemory,
}

/// What waits at the coordinator for the fsync of the log before it.
#[derive(Debug, Clone)]
enum Unsynced {
    /// One step's records, and the commands that run once they are durable.
    Step {
        records: Vec<LogRecord>,
        commands: Vec<SagaCommand>,
        /// What the deadline oracle counted for each record's saga when it was logged.
        stamps: Vec<Stamp>,
    },
    /// A checkpoint: the table as the records before it left it, and what the oracle
    /// counted for each saga when it was taken.
    Checkpoint(Vec<coordinator::saga::engine::Saga>, Vec<(TxId, u64)>),
}

/// One logged record as the deadline oracle sees it.
#[derive(Debug, Clone)]
struct Stamp {
    id: TxId,
    counted: u64,
    begin: bool,
    /// A `TimedOut` or `End`: the deadline no longer has to fire.
    settles: bool,
}

/// A saga's time as docs/sagas.md ("Deadlines") counts it, kept on the simulation's true time
/// independently of the engine.
#[derive(Debug, Clone)]
struct Counted {
    timeout: u64,
    /// Counted time at true time `since` (the begin, or the coordinator's restart).
    at_since: u64,
    since: u64,
    /// Counted time as of the latest durable record or checkpoint about the saga.
    durable: u64,
    begin_durable: bool,
    settled: bool,
    settled_durable: bool,
}

/// The coordinator's wall clock: true time, stepped and slewed.
#[derive(Debug, Clone, Copy)]
struct WallClock {
    /// Its reading at true time `at`, and its rate from then (per mille of true time).
    reading: u64,
    at: u64,
    rate_per_mille: u64,
}

impl WallClock {
    fn read(&self, now: u64) -> u64 {
        self.reading + (now - self.at) * self.rate_per_mille / 1000
    }

    /// Stepped by `delta_ms` (never below a day after the epoch) at `now`.
    fn step(&mut self, now: u64, delta_ms: i64) {
        let reading = self.read(now).saturating_add_signed(delta_ms);
        *self = WallClock {
            reading: reading.max(86_400_000),
            at: now,
            rate_per_mille: self.rate_per_mille,
        };
    }

    fn slew(&mut self, now: u64, rate_per_mille: u64) {
        *self = WallClock {
            reading: self.read(now),
            at: now,
            rate_per_mille,
        };
    }
}

/// What one run did, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SagaRunStats {
    pub events: u64,
    pub completed: u64,
    pub compensated: u64,
    pub needs_attention: u64,
    pub coordinator_crashes: u64,
    pub participant_crashes: u64,
    /// Operator "retry now"s (`POST /v1/sagas/{id}/retry`): an early `RetryDue`, which the
    /// engine must take only for a saga waiting for its timer.
    pub operator_retries: u64,
    /// Steps and slews of the coordinator's wall clock.
    pub clock_jumps: u64,
    /// Sagas that timed out (a `TimedOut` record made durable).
    pub timeouts: u64,
    /// Fences a participant refused.
    pub fences_refused: u64,
}

#[derive(Debug, Clone)]
enum Msg {
    Submit(usize, SagaWait),
    Op {
        call: u64,
        to: usize,
        kind: OpKind,
        request: SagaOpRequest,
    },
    OpAnswer {
        call: u64,
        answer: Option<SagaOpAnswer>,
    },
    Probe {
        call: u64,
        to: usize,
        op_id: String,
    },
    ProbeAnswer {
        call: u64,
        answer: ProbeAnswer,
    },
    CallTimeout {
        call: u64,
    },
    Timer {
        run: u64,
        event: SagaEvent,
    },
    CoordinatorUp,
    ParticipantUp(usize),
    /// The coordinator's oldest unsynced write is durable (if `run` is still running).
    CoordinatorSynced {
        run: u64,
    },
    /// Participant `to`'s oldest unsynced write is durable (if its `life` is still on).
    ParticipantSynced {
        to: usize,
        life: u64,
    },
}

/// What an outstanding coordinator call is for.
#[derive(Debug, Clone)]
struct Call {
    run: u64,
    id: TxId,
    step: usize,
    kind: Option<OpKind>,
}

struct Part {
    engine: Engine<KvStore>,
    log: Vec<Record>,
    up: bool,
    /// Cut off from the coordinator until then (a partition): what is sent to it is lost.
    cut_until: u64,
    /// Bumped by each crash, so a sync of the dead process's write is ignored.
    life: u64,
    /// Written, not yet durable, in order: a record (or none: the barrier of a repeat or a
    /// probe) and the answer that waits for it.
    unsynced: std::collections::VecDeque<(Option<Record>, Msg)>,
    /// When the last write queued becomes durable (fsyncs complete in order).
    synced_at: u64,
}

fn fresh_participant() -> Engine<KvStore> {
    Engine::new(EngineConfig::default(), KvStore::new())
}

struct World {
    rng: fastrand::Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    payloads: Vec<Option<Msg>>,
    coordinator: Option<SagaEngine>,
    /// The coordinator's durable log: a checkpoint (the table) and the records after it.
    checkpoint: Vec<coordinator::saga::engine::Saga>,
    log: Vec<LogRecord>,
    /// Appended, not yet durable, in log order.
    unsynced: std::collections::VecDeque<Unsynced>,
    synced_at: u64,
    run: u64,
    calls: BTreeMap<u64, Call>,
    next_call: u64,
    parts: Vec<Part>,
    requests: Vec<(SagaRequest, Fate)>,
    /// What clients heard as terminal, by saga.
    heard: BTreeMap<TxId, SagaResponse>,
    /// Sagas a client was told 202 (accepted durably) for.
    accepted: std::collections::BTreeSet<TxId>,
    mutation: Option<SagaMutation>,
    stats: SagaRunStats,
    coordinator_id: CoordinatorId,
    wall: WallClock,
    /// This run's saga clock: the wall clock's reading when the run started, and when.
    run_base: u64,
    run_started: u64,
    /// The deadline oracle, by saga.
    counted: BTreeMap<TxId, Counted>,
    /// Until when each participant refuses fences.
    fences_refused_until: Vec<u64>,
    /// Fences refused and not taken since, with when first refused.
    fence_refusals: BTreeMap<(TxId, String), u64>,
    /// The first broken invariant seen while running.
    violation: Option<String>,
}

impl World {
    fn faulty(&self) -> bool {
        self.now < HEAL_AT_MS
    }

    /// The time the saga engine hears: the saga clock (the mutation: the wall clock).
    fn coordinator_now(&self) -> u64 {
        if self.mutation == Some(SagaMutation::DeadlineOnWallClock) {
            return self.wall.read(self.now);
        }
        self.run_base + (self.now - self.run_started)
    }

    fn violated(&mut self, why: String) {
        self.violation.get_or_insert(why);
    }

    /// What the oracle counts for `id` now.
    fn counted_now(&self, id: &TxId) -> Option<u64> {
        let c = self.counted.get(id)?;
        Some(if self.coordinator.is_some() {
            c.at_since + (self.now - c.since)
        } else {
            c.at_since
        })
    }

    /// The oracle's view of records just logged; a `TimedOut` before the counted time
    /// reached the timeout is a violation.
    fn stamp(&mut self, records: &[LogRecord]) -> Vec<Stamp> {
        let mut stamps = Vec::new();
        for record in records {
            let LogRecord::Saga(record) = record else {
                continue;
            };
            let id = record.saga_id().clone();
            if let SagaRecord::Begin(begin) = record {
                self.counted.insert(
                    id.clone(),
                    Counted {
                        timeout: begin.request.timeout_ms(),
                        at_since: 0,
                        since: self.now,
                        durable: 0,
                        begin_durable: false,
                        settled: false,
                        settled_durable: false,
                    },
                );
            }
            let Some(counted) = self.counted_now(&id) else {
                self.violated(format!("saga {id} logged a record without a begin"));
                continue;
            };
            let settles = matches!(record, SagaRecord::TimedOut(_) | SagaRecord::End(_));
            if let (SagaRecord::TimedOut(_), Some(c)) = (record, self.counted.get(&id))
                && counted < c.timeout
            {
                let timeout = c.timeout;
                self.violated(format!(
                    "saga {id} timed out after {counted} ms of its {timeout} ms (counted on \
                     true time, downtime excluded): early"
                ));
            }
            if settles && let Some(c) = self.counted.get_mut(&id) {
                c.settled = true;
            }
            stamps.push(Stamp {
                id,
                counted,
                begin: matches!(record, SagaRecord::Begin(_)),
                settles,
            });
        }
        stamps
    }

    /// Every saga not ended has timed out by its counted timeout plus the slack.
    fn check_deadlines(&mut self) {
        if self.coordinator.is_none() {
            return;
        }
        let late = self.counted.iter().find_map(|(id, c)| {
            let counted = c.at_since + (self.now - c.since);
            (!c.settled && counted > c.timeout + DEADLINE_SLACK_MS)
                .then(|| (id.clone(), counted, c.timeout))
        });
        if let Some((id, counted, timeout)) = late {
            self.violated(format!(
                "saga {id} has run {counted} ms (counted on true time, downtime excluded) of \
                 its {timeout} ms and has not started compensating"
            ));
        }
    }

    /// Once healed, a fence refused for `FENCE_HOLD_MS` shows as `compensation_failing`, is
    /// counted, and holds no other compensation up.
    fn check_fences(&mut self) {
        let Some(engine) = &self.coordinator else {
            return;
        };
        let now = self.coordinator_now();
        let mut found = None;
        let mut held = 0;
        for ((id, step), first) in &self.fence_refusals {
            if self.now < (*first).max(HEAL_AT_MS) + FENCE_HOLD_MS {
                continue;
            }
            let Some(view) = engine.get(id).map(|saga| saga.view(now)) else {
                continue;
            };
            let refused = |name: &String| {
                self.fence_refusals
                    .contains_key(&(id.clone(), name.clone()))
            };
            let wrong = match view.state {
                SagaState::Compensated => {
                    Some("compensated while its fence is refused".to_string())
                }
                SagaState::Compensating => view.steps.iter().find_map(|s| {
                    let failing = s.status == StepStatus::CompensationFailing;
                    // Done with, never to be done, or a refused fence of its own.
                    let settled = matches!(
                        s.status,
                        StepStatus::Compensated | StepStatus::Failed | StepStatus::Pending
                    ) || (failing && refused(&s.name));
                    if &s.name == step && !failing {
                        Some(format!(
                            "step {} shows {:?}, not compensation_failing, while its fence is \
                             refused",
                            s.name, s.status
                        ))
                    } else if !settled {
                        Some(format!(
                            "step {} is {:?}: held up behind a refused fence",
                            s.name, s.status
                        ))
                    } else {
                        None
                    }
                }),
                _ => None,
            };
            if view.state == SagaState::Compensating {
                held += 1;
            }
            if let Some(why) = wrong {
                found = Some(format!(
                    "saga {id}, fence of {step} refused since {first} ms: {why}: {}",
                    serde_json::to_string(&view).unwrap_or_default()
                ));
                break;
            }
        }
        if found.is_none() && engine.compensations_failing() < held {
            found = Some(format!(
                "compensations_failing is {} with {held} refused fences holding",
                engine.compensations_failing()
            ));
        }
        if let Some(why) = found {
            self.violated(why);
        }
    }

    fn schedule(&mut self, after: u64, msg: Msg) {
        self.seq += 1;
        self.payloads.push(Some(msg));
        let slot = self.payloads.len() - 1;
        self.queue.push(Reverse((self.now + after, self.seq, slot)));
    }

    /// A network message: maybe dropped, maybe duplicated, always delayed a little.
    fn send(&mut self, msg: Msg) {
        let (drop, dup) = if self.faulty() { (8, 5) } else { (0, 0) };
        if self.rng.u32(0..100) < drop {
            return;
        }
        let delay = self.rng.u64(1..40);
        if self.rng.u32(0..100) < dup {
            let again = self.rng.u64(1..80);
            self.schedule(again, msg.clone());
        }
        self.schedule(delay, msg);
    }

    /// A write's fsync comes back a little later, after every earlier one; while faults
    /// last, sometimes much later (a stalled disk), long enough for timeouts and retries.
    fn sync_delay(&mut self, synced_at: u64) -> (u64, u64) {
        let took = if self.faulty() && self.rng.u32(0..100) < 10 {
            self.rng.u64(50..300)
        } else {
            self.rng.u64(1..8)
        };
        let at = synced_at.max(self.now + took);
        (at, at - self.now)
    }

    /// While faults last, the power sometimes goes just before an fsync completes.
    fn power_cut(&mut self) -> bool {
        self.faulty() && self.rng.u32(0..100) < 3
    }

    fn step_coordinator(&mut self, event: SagaEvent) {
        let Some(engine) = self.coordinator.as_mut() else {
            return;
        };
        let commands = engine.step(event);
        let (records, mut rest): (Vec<_>, Vec<_>) = commands
            .into_iter()
            .partition(|c| matches!(c, SagaCommand::Append(_)));
        if self.mutation == Some(SagaMutation::CoordinatorRepliesBeforeDurable) {
            let (replies, others): (Vec<_>, Vec<_>) = rest
                .into_iter()
                .partition(|c| matches!(c, SagaCommand::Reply { .. }));
            rest = others;
            for reply in replies {
                self.execute(reply);
            }
        }
        if records.is_empty() {
            for command in rest {
                self.execute(command);
            }
            return;
        }
        // The shell: the step's records durable first, then the rest.
        let records: Vec<LogRecord> = records
            .into_iter()
            .filter_map(|c| match c {
                SagaCommand::Append(record) => Some(record),
                _ => None,
            })
            .collect();
        let stamps = self.stamp(&records);
        self.unsynced.push_back(Unsynced::Step {
            records,
            commands: rest,
            stamps,
        });
        self.schedule_coordinator_sync();
    }

    fn schedule_coordinator_sync(&mut self) {
        let (at, after) = self.sync_delay(self.synced_at);
        self.synced_at = at;
        self.schedule(after, Msg::CoordinatorSynced { run: self.run });
    }

    /// The oldest unsynced write at the coordinator is durable.
    fn coordinator_synced(&mut self) {
        match self.unsynced.pop_front() {
            Some(Unsynced::Step {
                records,
                commands,
                stamps,
            }) => {
                let ids = records
                    .iter()
                    .filter_map(|r| match r {
                        LogRecord::Saga(record) => Some(record.saga_id().clone()),
                        _ => None,
                    })
                    .collect();
                self.stats.timeouts += records
                    .iter()
                    .filter(|r| matches!(r, LogRecord::Saga(SagaRecord::TimedOut(_))))
                    .count() as u64;
                self.log.extend(records);
                for stamp in stamps {
                    if let Some(c) = self.counted.get_mut(&stamp.id) {
                        c.durable = c.durable.max(stamp.counted);
                        c.begin_durable |= stamp.begin;
                        c.settled_durable |= stamp.settles;
                    }
                }
                let now_ms = self.coordinator_now();
                self.step_coordinator(SagaEvent::Durable { ids, now_ms });
                for command in commands {
                    self.execute(command);
                }
            }
            Some(Unsynced::Checkpoint(table, stamps)) => {
                self.checkpoint = table;
                self.log.clear();
                for (id, counted) in stamps {
                    if let Some(c) = self.counted.get_mut(&id) {
                        c.durable = c.durable.max(counted);
                    }
                }
            }
            None => {}
        }
    }

    fn execute(&mut self, command: SagaCommand) {
        match command {
            SagaCommand::Append(_) => {}
            SagaCommand::Reply { reply, .. } => match reply {
                SagaReply::Saga(view) if view.state.is_terminal() => {
                    self.heard.entry(view.id.clone()).or_insert(view);
                }
                SagaReply::Accepted(view) => {
                    self.accepted.insert(view.id);
                }
                _ => {}
            },
            SagaCommand::ArmRetry { id, after_ms } => {
                let event = SagaEvent::RetryDue { id, now_ms: 0 };
                self.schedule(
                    after_ms,
                    Msg::Timer {
                        run: self.run,
                        event,
                    },
                );
            }
            SagaCommand::ArmDeadline { id, after_ms } => {
                let event = SagaEvent::DeadlineDue { id, now_ms: 0 };
                self.schedule(
                    after_ms,
                    Msg::Timer {
                        run: self.run,
                        event,
                    },
                );
            }
            SagaCommand::Send {
                id,
                step,
                kind,
                participant,
                op_id,
                payload,
                timeout_ms,
                ..
            } => {
                let call = self.new_call(&id, step, Some(kind));
                let to = NAMES
                    .iter()
                    .position(|n| *n == participant.as_str())
                    .unwrap_or(0);
                let step_name = self
                    .requests
                    .iter()
                    .find(|(r, _)| r.id == id)
                    .map(|(r, _)| r.steps[step].name.clone())
                    .unwrap_or_default();
                let request = SagaOpRequest {
                    saga_id: id,
                    step: step_name,
                    op_id,
                    coordinator_id: self.coordinator_id.clone(),
                    epoch: Epoch(self.run),
                    payload,
                };
                self.schedule(timeout_ms, Msg::CallTimeout { call });
                self.send(Msg::Op {
                    call,
                    to,
                    kind,
                    request,
                });
            }
            SagaCommand::Probe {
                id,
                step,
                participant,
                op_id,
                timeout_ms,
            } => {
                let call = self.new_call(&id, step, None);
                let to = NAMES
                    .iter()
                    .position(|n| *n == participant.as_str())
                    .unwrap_or(0);
                self.schedule(timeout_ms, Msg::CallTimeout { call });
                self.send(Msg::Probe { call, to, op_id });
            }
        }
    }

    fn new_call(&mut self, id: &TxId, step: usize, kind: Option<OpKind>) -> u64 {
        self.next_call += 1;
        let call = Call {
            run: self.run,
            id: id.clone(),
            step,
            kind,
        };
        self.calls.insert(self.next_call, call);
        self.next_call
    }

    /// The first of answer and timeout settles a call; later ones are ignored.
    fn settle(&mut self, call: u64) -> Option<Call> {
        let found = self.calls.remove(&call)?;
        (found.run == self.run && self.coordinator.is_some()).then_some(found)
    }

    fn deliver(&mut self, msg: Msg) {
        let now = self.now;
        // What the coordinator's shell reads; participants stamp their records with true time.
        let clock = self.coordinator_now();
        let jitter = self.rng.u64(..);
        match msg {
            Msg::Submit(i, wait) => {
                let (request, _) = self.requests[i].clone();
                let digest = Digest(
                    Fnv128::default()
                        .field(&serde_json::to_vec(&request).unwrap_or_default())
                        .finish(),
                );
                let event = SagaEvent::Submit {
                    waiter: i as u64,
                    wait,
                    request,
                    digest,
                    now_ms: clock,
                    client: None,
                };
                self.step_coordinator(event);
            }
            Msg::Op {
                call,
                to,
                kind,
                request,
            } => {
                if !self.reachable(to) {
                    return;
                }
                if kind == OpKind::Compensation && self.refuses_fence(to, call, &request) {
                    return;
                }
                let part = &mut self.parts[to];
                let (answer, record) = match part.engine.saga_op(kind, &request, now) {
                    // One coordinator id and one payload per op id here: never a conflict
                    // (the saga_reuse world has them).
                    participant::engine::saga::SagaStepped::Busy(_)
                    | participant::engine::saga::SagaStepped::Conflict(_) => (None, None),
                    participant::engine::saga::SagaStepped::Answer { answer, record } => {
                        (Some(answer), record)
                    }
                };
                let from_memory = record.is_none() && answer.is_some();
                self.participant_answers(to, record, Msg::OpAnswer { call, answer }, from_memory);
            }
            Msg::OpAnswer { call, answer } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let outcome = match answer {
                    Some(SagaOpAnswer::Done { result }) => {
                        coordinator::records::SagaOpOutcome::Done { result }
                    }
                    Some(SagaOpAnswer::Failed { reason }) => {
                        coordinator::records::SagaOpOutcome::Failed { reason }
                    }
                    None => coordinator::records::SagaOpOutcome::Unknown {
                        error: "busy".into(),
                    },
                };
                let kind = found.kind.unwrap_or(OpKind::Action);
                let event = SagaEvent::OpAnswered {
                    id: found.id,
                    step: found.step,
                    kind,
                    outcome,
                    now_ms: clock,
                    jitter,
                };
                self.step_coordinator(event);
            }
            Msg::Probe { call, to, op_id } => {
                if !self.reachable(to) {
                    return;
                }
                let asked = protocol::saga::OpQuery::from_coordinator(&self.coordinator_id, None);
                let Ok(status) = self.parts[to].engine.saga_op_status(&op_id, &asked) else {
                    return; // never refused here: it names its coordinator, sends no digest
                };
                let from_memory = status.status != OpStatus::NotFound;
                let answer = match status.status {
                    OpStatus::Done => ProbeAnswer::Done(status.result),
                    OpStatus::Failed => ProbeAnswer::Failed(status.reason.unwrap_or_default()),
                    OpStatus::Compensated => ProbeAnswer::Compensated,
                    OpStatus::NotFound => ProbeAnswer::NotFound,
                };
                self.participant_answers(to, None, Msg::ProbeAnswer { call, answer }, from_memory);
            }
            Msg::CoordinatorSynced { run } => {
                if run == self.run && self.coordinator.is_some() {
                    if self.power_cut() {
                        self.crash_coordinator();
                        return;
                    }
                    self.coordinator_synced();
                }
            }
            Msg::ParticipantSynced { to, life } => {
                if life != self.parts[to].life || !self.parts[to].up {
                    return;
                }
                if self.power_cut() {
                    self.crash_participant(to);
                    return;
                }
                let Some((record, answer)) = self.parts[to].unsynced.pop_front() else {
                    return;
                };
                if let Some(record) = record {
                    self.parts[to].log.push(record);
                }
                // A crash after the record is durable, before the answer leaves.
                if self.faulty() && self.rng.u32(0..100) < 3 {
                    self.crash_participant(to);
                    return;
                }
                self.send(answer);
            }
            Msg::ProbeAnswer { call, answer } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let event = SagaEvent::ProbeAnswered {
                    id: found.id,
                    step: found.step,
                    answer,
                    now_ms: clock,
                    jitter,
                };
                self.step_coordinator(event);
            }
            Msg::CallTimeout { call } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let event = match found.kind {
                    Some(kind) => SagaEvent::OpAnswered {
                        id: found.id,
                        step: found.step,
                        kind,
                        outcome: coordinator::records::SagaOpOutcome::Unknown {
                            error: "timeout".into(),
                        },
                        now_ms: clock,
                        jitter,
                    },
                    None => SagaEvent::ProbeAnswered {
                        id: found.id,
                        step: found.step,
                        answer: ProbeAnswer::NoAnswer("timeout".into()),
                        now_ms: clock,
                        jitter,
                    },
                };
                self.step_coordinator(event);
            }
            Msg::Timer { run, event } => {
                if run != self.run {
                    return;
                }
                let event = match event {
                    SagaEvent::RetryDue { id, .. } => SagaEvent::RetryDue { id, now_ms: clock },
                    SagaEvent::DeadlineDue { id, .. } => {
                        SagaEvent::DeadlineDue { id, now_ms: clock }
                    }
                    other => other,
                };
                self.step_coordinator(event);
            }
            Msg::CoordinatorUp => {
                // The machine's clock may have been reset while it was down.
                if self.rng.u32(0..3) == 0 {
                    let delta = self.rng.i64(-3_600_000..=3_600_000);
                    self.wall.step(now, delta);
                    self.stats.clock_jumps += 1;
                }
                self.run_base = self.wall.read(now);
                self.run_started = now;
                for c in self.counted.values_mut() {
                    c.since = now;
                }
                let engine = SagaEngine::replay(CONFIG, self.checkpoint.clone(), &self.log);
                self.coordinator = Some(engine);
                let now_ms = self.coordinator_now();
                self.step_coordinator(SagaEvent::Recovered { now_ms });
            }
            Msg::ParticipantUp(i) => {
                let mut engine = fresh_participant();
                for record in self.parts[i].log.clone() {
                    let _ = engine.replay(record);
                }
                self.parts[i].engine = engine;
                self.parts[i].up = true;
            }
        }
    }

    /// Participant `to` answers once everything it wrote before is durable (its record, or
    /// the forced barrier a repeat or a probe writes); the mutation answers what the barrier
    /// holds in memory at once.
    fn participant_answers(
        &mut self,
        to: usize,
        record: Option<Record>,
        answer: Msg,
        from_memory: bool,
    ) {
        if from_memory && self.mutation == Some(SagaMutation::ParticipantAnswersFromMemory) {
            self.send(answer);
            return;
        }
        let (at, after) = self.sync_delay(self.parts[to].synced_at);
        let part = &mut self.parts[to];
        part.synced_at = at;
        part.unsynced.push_back((record, answer));
        let life = part.life;
        self.schedule(after, Msg::ParticipantSynced { to, life });
    }

    /// An operator asks for a random saga to be tried now, as `Core::retry_saga` does: the
    /// same `RetryDue` the timer would send, early, to the running coordinator.
    fn operator_retry(&mut self) {
        if self.requests.is_empty() {
            return;
        }
        let i = self.rng.usize(0..self.requests.len());
        let id = self.requests[i].0.id.clone();
        self.stats.operator_retries += 1;
        self.schedule(
            0,
            Msg::Timer {
                run: self.run,
                event: SagaEvent::RetryDue { id, now_ms: 0 },
            },
        );
    }

    /// A fence (a compensation of a step participant `to` has no record of) refused while
    /// its window lasts: `failed` or 503, nothing recorded. Any compensation the participant
    /// takes for the step ends its refusal.
    fn refuses_fence(&mut self, to: usize, call: u64, request: &SagaOpRequest) -> bool {
        let key = (request.saga_id.clone(), request.step.clone());
        let action = op_id(&request.saga_id, &request.step, OpKind::Action);
        let asked = protocol::saga::OpQuery::from_coordinator(&request.coordinator_id, None);
        let fence = self.parts[to]
            .engine
            .saga_op_status(&action, &asked)
            .is_ok_and(|status| status.status == OpStatus::NotFound);
        if !fence || self.now >= self.fences_refused_until[to] {
            self.fence_refusals.remove(&key);
            return false;
        }
        self.stats.fences_refused += 1;
        self.fence_refusals.entry(key).or_insert(self.now);
        let answer = if self.rng.bool() {
            Some(SagaOpAnswer::Failed {
                reason: "the fence cannot be recorded now".into(),
            })
        } else {
            None
        };
        self.send(Msg::OpAnswer { call, answer });
        true
    }

    fn crash_coordinator(&mut self) {
        if self.coordinator.take().is_some() {
            self.stats.coordinator_crashes += 1;
            // What was not yet durable is gone, and the oracle's counts resume from the
            // durable ones.
            self.counted.retain(|_, c| c.begin_durable);
            for c in self.counted.values_mut() {
                c.at_since = c.durable;
                c.settled = c.settled_durable;
            }
            self.unsynced.clear();
            self.run += 1;
            let after = self.rng.u64(10..500);
            self.schedule(after, Msg::CoordinatorUp);
        }
    }

    /// Whether a message reaches participant `to`: it is up and not cut off.
    fn reachable(&self, to: usize) -> bool {
        self.parts[to].up && self.now >= self.parts[to].cut_until
    }

    /// A participant cut off for seconds: its steps stay unknown, sagas wait on it past
    /// restarts of the coordinator.
    fn partition(&mut self, i: usize) {
        let until = self.now + self.rng.u64(1_000..6_000);
        self.parts[i].cut_until = until.min(HEAL_AT_MS);
    }

    fn crash_participant(&mut self, i: usize) {
        if self.parts[i].up {
            self.parts[i].up = false;
            self.parts[i].life += 1;
            self.parts[i].unsynced.clear();
            self.stats.participant_crashes += 1;
            let after = self.rng.u64(10..300);
            self.schedule(after, Msg::ParticipantUp(i));
        }
    }

    /// A checkpoint: the table (as every record appended so far left it) replaces the
    /// records before it once it is durable, in log order with them.
    fn checkpoint(&mut self) {
        if let Some(engine) = &self.coordinator {
            let table = engine.snapshot(self.coordinator_now());
            let stamps = self
                .counted
                .keys()
                .filter_map(|id| Some((id.clone(), self.counted_now(id)?)))
                .collect();
            self.unsynced.push_back(Unsynced::Checkpoint(table, stamps));
            self.schedule_coordinator_sync();
        }
    }

    /// While faults last, the coordinator's wall clock is stepped or its rate changed.
    fn clock_fault(&mut self) {
        self.stats.clock_jumps += 1;
        if self.rng.u32(0..4) == 0 {
            let rate = self.rng.u64(800..=1200);
            self.wall.slew(self.now, rate);
        } else {
            let delta = self.rng.i64(-60_000..=60_000);
            self.wall.step(self.now, delta);
        }
    }
}

/// Runs one seed; `Err` names the broken invariant and the seed.
pub fn run_saga_seed(seed: u64, config: SagaSimConfig) -> Result<SagaRunStats, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let fates = [Fate::Complete, Fate::Declined, Fate::FailAfterPivot];
    let requests: Vec<(SagaRequest, Fate)> = (0..config.sagas)
        .map(|i| {
            let fate = fates[rng.usize(..fates.len())];
            // Some deadlines are shorter than a few lost messages take, some last through a
            // partition and a coordinator restart or two: timeouts happen.
            let timeout = match rng.u32(0..3) {
                0 => 300,
                1 => rng.u64(2_000..8_000),
                _ => 30_000,
            };
            let json = saga_checkout::request(&format!("s{seed}-{i}"), 2, 30, fate, timeout);
            let request: SagaRequest = serde_json::from_value(json).map_err(|e| e.to_string())?;
            Ok((request, fate))
        })
        .collect::<Result<_, String>>()?;
    // Some participants refuse fences for a while, some until well after the other faults.
    let fences_refused_until = (0..3)
        .map(|_| match rng.u32(0..3) {
            0 => 0,
            1 => rng.u64(0..HEAL_AT_MS),
            _ => HEAL_AT_MS + rng.u64(2 * FENCE_HOLD_MS..40_000),
        })
        .collect();
    let mut world = World {
        rng,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        payloads: Vec::new(),
        coordinator: Some(SagaEngine::new(CONFIG)),
        checkpoint: Vec::new(),
        log: Vec::new(),
        unsynced: std::collections::VecDeque::new(),
        synced_at: 0,
        run: 1,
        calls: BTreeMap::new(),
        next_call: 0,
        parts: (0..3)
            .map(|_| Part {
                engine: fresh_participant(),
                log: Vec::new(),
                up: true,
                cut_until: 0,
                life: 0,
                unsynced: std::collections::VecDeque::new(),
                synced_at: 0,
            })
            .collect(),
        requests,
        heard: BTreeMap::new(),
        accepted: std::collections::BTreeSet::new(),
        mutation: config.mutation,
        stats: SagaRunStats::default(),
        coordinator_id: CoordinatorId::new("c-sim").map_err(|e| e.to_string())?,
        wall: WallClock {
            reading: WALL_START_MS,
            at: 0,
            rate_per_mille: 1000,
        },
        run_base: WALL_START_MS,
        run_started: 0,
        counted: BTreeMap::new(),
        fences_refused_until,
        fence_refusals: BTreeMap::new(),
        violation: None,
    };
    for i in 0..config.sagas {
        // Each client sends once (waiting for the end, or only for the 202), and some send
        // the same request again: later, or at once (while the first's begin is unsynced).
        let wait = |rng: &mut fastrand::Rng| {
            if rng.bool() {
                SagaWait::Terminal
            } else {
                SagaWait::Accepted
            }
        };
        let at = world.rng.u64(0..2_000);
        let first = wait(&mut world.rng);
        world.schedule(at, Msg::Submit(i, first));
        if world.rng.u32(0..100) < 30 {
            let again = world.rng.u64(0..10_000);
            let second = wait(&mut world.rng);
            world.schedule(again, Msg::Submit(i, second));
        }
        if world.rng.u32(0..100) < 30 {
            let soon = at + world.rng.u64(0..4);
            let second = wait(&mut world.rng);
            world.schedule(soon, Msg::Submit(i, second));
        }
    }
    while let Some(Reverse((at, _, slot))) = world.queue.pop() {
        if at > END_MS {
            break;
        }
        world.now = at;
        world.stats.events += 1;
        let Some(msg) = world.payloads[slot].take() else {
            continue;
        };
        world.deliver(msg);
        if world.faulty() {
            match world.rng.u32(0..1000) {
                0..=4 => world.crash_coordinator(),
                5..=7 => {
                    let i = world.rng.usize(0..3);
                    world.crash_participant(i);
                }
                8..=12 => world.checkpoint(),
                13..=22 => world.operator_retry(),
                23..=30 => world.clock_fault(),
                31 => {
                    let i = world.rng.usize(0..3);
                    world.partition(i);
                }
                _ => {}
            }
        }
        world.check_deadlines();
        if !world.faulty() {
            world.check_fences();
        }
        if let Some(why) = world.violation.take() {
            return Err(format!("seed {seed} at {} ms: {why}", world.now));
        }
    }
    let engine = world
        .coordinator
        .as_ref()
        .ok_or_else(|| format!("seed {seed}: the coordinator never came back"))?;
    for ((id, step), first) in &world.fence_refusals {
        if engine
            .get(id)
            .is_some_and(|saga| saga.state() == SagaState::Compensated)
        {
            return Err(format!(
                "seed {seed}: saga {id} is compensated, but its fence of {step} was refused at \
                 {first} ms and never taken"
            ));
        }
    }
    for (request, fate) in &world.requests {
        let Some(saga) = engine.get(&request.id) else {
            if world.accepted.contains(&request.id) {
                return Err(format!(
                    "seed {seed}: a client was told 202 for saga {} and the coordinator lost it",
                    request.id
                ));
            }
            // Never began: its submits were all lost to crashes; nothing may have been applied.
            let effects = effects_of(&world, request.id.as_str());
            if effects
                != (Effects {
                    reserved: 0,
                    charged: 0,
                    shipped: false,
                })
            {
                return Err(format!(
                    "seed {seed}: saga {} never began but {effects:?}",
                    request.id
                ));
            }
            continue;
        };
        let view = saga.view(world.coordinator_now());
        let json = serde_json::to_value(&view).map_err(|e| e.to_string())?;
        let effects = effects_of(&world, request.id.as_str());
        saga_checkout::check(&json, effects, 2, 30)
            .map_err(|e| format!("seed {seed} ({fate:?}): {e}"))?;
        if let Some(heard) = world.heard.get(&request.id)
            && heard.state != view.state
        {
            return Err(format!(
                "seed {seed}: client heard {:?}, saga ended {:?}",
                heard.state, view.state
            ));
        }
        match view.state {
            SagaState::Completed => world.stats.completed += 1,
            SagaState::Compensated => world.stats.compensated += 1,
            SagaState::NeedsAttention => world.stats.needs_attention += 1,
            SagaState::Running | SagaState::Compensating => unreachable!("checked terminal"),
        }
    }
    Ok(world.stats)
}

fn effects_of(world: &World, id: &str) -> Effects {
    let int = |i: usize, key: String| {
        world.parts[i]
            .engine
            .resource()
            .get(&key)
            .and_then(|e| e.value.as_i64())
            .unwrap_or(0)
    };
    Effects {
        reserved: int(0, format!("saga-stock:{id}")),
        charged: int(1, format!("saga-charge:{id}")),
        shipped: world.parts[2]
            .engine
            .resource()
            .get(&format!("saga-ship:{id}"))
            .is_some(),
    }
}
