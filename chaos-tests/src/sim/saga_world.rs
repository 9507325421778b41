//! Deterministic simulation of sagas (issue 13): the coordinator's pure `SagaEngine` and the
//! participants' pure saga barrier (`participant::Engine<KvStore>::saga_op`), three KV
//! participants, clients that submit and resubmit checkout sagas, and a seeded network that
//! drops, duplicates and delays every message (actions, compensations, op queries and their
//! answers), with coordinator and participant crashes back to their durable logs (and
//! checkpoints) until the faults heal.
//!
//! Modelled runtime contracts: the coordinator's records of one step are durable before any
//! message of that step leaves (the shell awaits them); a call that gets no answer within the
//! step timeout is `unknown`; a participant's saga record is durable before its answer leaves.
//!
//! Invariants, once every saga settled (checked with `saga_checkout::check`): every saga ends
//! `completed` with every step applied once, or `compensated` with every succeeded step undone
//! once and nothing else, or `needs_attention` with a reason; a client that heard a terminal
//! state never sees another one later; every saga that began ends (liveness after healing).
//!
//! Must never: read the clock, spawn anything, or draw randomness outside the seeded rng.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use coordinator::records::LogRecord;
use coordinator::saga::engine::{
    ProbeAnswer, SagaCommand, SagaConfig, SagaEngine, SagaEvent, SagaReply, SagaWait,
};
use participant::kv::KvStore;
use participant::record::Record;
use participant::{Engine, EngineConfig};
use protocol::digest::{Digest, Fnv128};
use protocol::saga::{
    OpKind, OpStatus, SagaOpAnswer, SagaOpRequest, SagaRequest, SagaResponse, SagaState,
};
use protocol::{CoordinatorId, Epoch, TxId};

use crate::checkout::{INVENTORY, PAYMENTS, SHIPPING};
use crate::saga_checkout::{self, Effects, Fate};

const NAMES: [&str; 3] = [INVENTORY, PAYMENTS, SHIPPING];
const CONFIG: SagaConfig = SagaConfig {
    retry_base_ms: 20,
    retry_max_ms: 200,
    step_timeout_ms: 100,
};
/// Faults stop here; afterwards every saga must settle.
const HEAL_AT_MS: u64 = 20_000;
/// Simulated-time bound of a run.
const END_MS: u64 = 600_000;

/// One run's knobs.
#[derive(Debug, Clone, Copy)]
pub struct SagaSimConfig {
    pub sagas: usize,
}

impl Default for SagaSimConfig {
    fn default() -> Self {
        SagaSimConfig { sagas: 6 }
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
}

#[derive(Debug, Clone)]
enum Msg {
    Submit(usize),
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
    run: u64,
    calls: BTreeMap<u64, Call>,
    next_call: u64,
    parts: Vec<Part>,
    requests: Vec<(SagaRequest, Fate)>,
    /// What clients heard as terminal, by saga.
    heard: BTreeMap<TxId, SagaResponse>,
    stats: SagaRunStats,
    coordinator_id: CoordinatorId,
}

impl World {
    fn faulty(&self) -> bool {
        self.now < HEAL_AT_MS
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

    fn step_coordinator(&mut self, event: SagaEvent) {
        let Some(engine) = self.coordinator.as_mut() else {
            return;
        };
        let commands = engine.step(event);
        // The shell: every record durable first, then the rest.
        for command in &commands {
            if let SagaCommand::Append(record) = command {
                self.log.push(record.clone());
            }
        }
        for command in commands {
            self.execute(command);
        }
    }

    fn execute(&mut self, command: SagaCommand) {
        match command {
            SagaCommand::Append(_) => {}
            SagaCommand::Reply { reply, .. } => {
                if let SagaReply::Saga(view) = reply
                    && view.state.is_terminal()
                {
                    self.heard.entry(view.id.clone()).or_insert(view);
                }
            }
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
        let jitter = self.rng.u64(..);
        match msg {
            Msg::Submit(i) => {
                let (request, _) = self.requests[i].clone();
                let digest = Digest(
                    Fnv128::default()
                        .field(&serde_json::to_vec(&request).unwrap_or_default())
                        .finish(),
                );
                let wait = SagaWait::Terminal;
                let event = SagaEvent::Submit {
                    waiter: i as u64,
                    wait,
                    request,
                    digest,
                    now_ms: now,
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
                if !self.parts[to].up {
                    return;
                }
                let part = &mut self.parts[to];
                let answer = match part.engine.saga_op(kind, &request, now) {
                    participant::engine::saga::SagaStepped::Busy(_) => None,
                    participant::engine::saga::SagaStepped::Answer { answer, record } => {
                        if let Some(record) = record {
                            part.log.push(record);
                        }
                        Some(answer)
                    }
                };
                // A crash after the record is durable, before the answer leaves.
                if self.faulty() && self.rng.u32(0..100) < 3 {
                    self.crash_participant(to);
                    return;
                }
                self.send(Msg::OpAnswer { call, answer });
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
                    now_ms: now,
                    jitter,
                };
                self.step_coordinator(event);
            }
            Msg::Probe { call, to, op_id } => {
                if !self.parts[to].up {
                    return;
                }
                let status = self.parts[to].engine.saga_op_status(&op_id);
                let answer = match status.status {
                    OpStatus::Done => ProbeAnswer::Done(status.result),
                    OpStatus::Failed => ProbeAnswer::Failed(status.reason.unwrap_or_default()),
                    OpStatus::Compensated => ProbeAnswer::Compensated,
                    OpStatus::NotFound => ProbeAnswer::NotFound,
                };
                self.send(Msg::ProbeAnswer { call, answer });
            }
            Msg::ProbeAnswer { call, answer } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let event = SagaEvent::ProbeAnswered {
                    id: found.id,
                    step: found.step,
                    answer,
                    now_ms: now,
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
                        now_ms: now,
                        jitter,
                    },
                    None => SagaEvent::ProbeAnswered {
                        id: found.id,
                        step: found.step,
                        answer: ProbeAnswer::NoAnswer("timeout".into()),
                        now_ms: now,
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
                    SagaEvent::RetryDue { id, .. } => SagaEvent::RetryDue { id, now_ms: now },
                    SagaEvent::DeadlineDue { id, .. } => SagaEvent::DeadlineDue { id, now_ms: now },
                    other => other,
                };
                self.step_coordinator(event);
            }
            Msg::CoordinatorUp => {
                let engine = SagaEngine::replay(CONFIG, self.checkpoint.clone(), &self.log);
                self.coordinator = Some(engine);
                self.step_coordinator(SagaEvent::Recovered { now_ms: now });
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

    fn crash_coordinator(&mut self) {
        if self.coordinator.take().is_some() {
            self.stats.coordinator_crashes += 1;
            self.run += 1;
            let after = self.rng.u64(10..500);
            self.schedule(after, Msg::CoordinatorUp);
        }
    }

    fn crash_participant(&mut self, i: usize) {
        if self.parts[i].up {
            self.parts[i].up = false;
            self.stats.participant_crashes += 1;
            let after = self.rng.u64(10..300);
            self.schedule(after, Msg::ParticipantUp(i));
        }
    }

    /// A checkpoint: the table replaces the records before it.
    fn checkpoint(&mut self) {
        if let Some(engine) = &self.coordinator {
            self.checkpoint = engine.snapshot();
            self.log.clear();
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
            // Some deadlines are shorter than a few lost messages take: timeouts happen.
            let timeout = if rng.bool() { 300 } else { 30_000 };
            let json = saga_checkout::request(&format!("s{seed}-{i}"), 2, 30, fate, timeout);
            let request: SagaRequest = serde_json::from_value(json).map_err(|e| e.to_string())?;
            Ok((request, fate))
        })
        .collect::<Result<_, String>>()?;
    let mut world = World {
        rng,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        payloads: Vec::new(),
        coordinator: Some(SagaEngine::new(CONFIG)),
        checkpoint: Vec::new(),
        log: Vec::new(),
        run: 1,
        calls: BTreeMap::new(),
        next_call: 0,
        parts: (0..3)
            .map(|_| Part {
                engine: fresh_participant(),
                log: Vec::new(),
                up: true,
            })
            .collect(),
        requests,
        heard: BTreeMap::new(),
        stats: SagaRunStats::default(),
        coordinator_id: CoordinatorId::new("c-sim").map_err(|e| e.to_string())?,
    };
    for i in 0..config.sagas {
        // Each client sends once, and some send the same request again later.
        let at = world.rng.u64(0..2_000);
        world.schedule(at, Msg::Submit(i));
        if world.rng.u32(0..100) < 30 {
            let again = world.rng.u64(0..10_000);
            world.schedule(again, Msg::Submit(i));
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
                _ => {}
            }
        }
    }
    let engine = world
        .coordinator
        .as_ref()
        .ok_or_else(|| format!("seed {seed}: the coordinator never came back"))?;
    for (request, fate) in &world.requests {
        let Some(saga) = engine.get(&request.id) else {
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
        let view = saga.view(world.now);
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
