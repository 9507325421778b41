//! Deterministic simulation of saga ids used again by other coordinators (issue 25, item 5):
//! the participants' saga barrier must keep each coordinator's steps apart, and refuse an op id
//! that one coordinator id sends again with another payload.
//!
//! Three coordinator lives run the same saga ids against three KV participants:
//! - `c-first`, from the start;
//! - `c-second`, a second coordinator (or `c-first` restarted on a wiped data directory, which
//!   makes a new coordinator id), concurrently;
//! - `c-first` again, once its sagas have ended, restored from an empty backup: the same
//!   coordinator id with a log that forgot them, so every op id it sends was used before.
//!
//! Each life's sagas write keys tagged with the life (`saga-stock:{id}.{tag}`), so what each
//! saga did is an exact number. The pure engines run for real (`SagaEngine`, the participant's
//! barrier, snapshots and replay); the shells are modelled as they are written: the
//! participant's answers go over "HTTP" as status and body the way `participant/src/http.rs`
//! sends them, and the coordinator reads them with its shell's own functions
//! (`coordinator::runtime::{op_outcome, probe_answer}`), its op queries naming itself and the
//! action's digest. The network drops, duplicates and delays every message while faults last;
//! coordinators crash back to their logs, participants crash back to their checkpoint and log.
//! (Durability timing is the `saga_world`'s subject: here a record is durable when appended.)
//!
//! Invariants, once every saga settled: every saga of every life ends in a state the saga
//! oracle accepts for its own keys (`saga_checkout::check`), so no saga is completed on
//! another coordinator's answers (completed means each of its own steps applied once); the
//! first life's effects are still as its sagas ended after the others ran; an op of one
//! coordinator id is never refused `op_id_conflict` because of another coordinator id's op
//! (only the restored life may meet conflicts); and every saga of every life ends.
//!
//! Must never: read the clock, spawn anything, or draw randomness outside the seeded rng.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use coordinator::records::LogRecord;
use coordinator::runtime::{op_outcome, probe_answer};
use coordinator::saga::engine::{
    ProbeAnswer, SagaCommand, SagaConfig, SagaEngine, SagaEvent, SagaWait,
};
use participant::engine::saga::SagaStepped;
use participant::kv::KvStore;
use participant::record::Record;
use participant::snapshot::Snapshot;
use participant::{ApiError, Engine, EngineConfig};
use protocol::digest::{Digest, Fnv128};
use protocol::saga::{OpKind, OpQuery, SagaOpRequest, SagaRequest, SagaResponse, SagaState};
use protocol::{CoordinatorId, Epoch, ErrorBody, ErrorCode, TxId};

use cluster::checkout::{INVENTORY, PAYMENTS, SHIPPING};
use cluster::saga_checkout::{self, Effects, Fate};

const NAMES: [&str; 3] = [INVENTORY, PAYMENTS, SHIPPING];
const CONFIG: SagaConfig = SagaConfig {
    retry_base_ms: 20,
    retry_max_ms: 200,
    step_timeout_ms: 100,
};
/// Faults stop here; afterwards every saga must settle.
const HEAL_AT_MS: u64 = 15_000;
/// Simulated-time bound of a run.
const END_MS: u64 = 600_000;
/// The lives: coordinator id and the tag of the keys its sagas write.
const LIVES: [(&str, &str); 3] = [
    ("c-first", "first"),
    ("c-second", "second"),
    ("c-first", "restored"),
];
/// The life that reuses `c-first`'s id from an empty backup, once `c-first` settled.
const RESTORED: usize = 2;

/// One run's knobs.
#[derive(Debug, Clone, Copy)]
pub struct SagaReuseConfig {
    pub sagas: usize,
    pub mutation: Option<SagaReuseMutation>,
}

impl Default for SagaReuseConfig {
    fn default() -> Self {
        SagaReuseConfig {
            sagas: 4,
            mutation: None,
        }
    }
}

/// Coordinator shells that break the contract, to show the invariants catch them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SagaReuseMutation {
    /// Op queries name no coordinator (an older coordinator): refused 422 while anyone's op on
    /// the step is recorded, so an unknown step stays unknown.
    ProbeWithoutCoordinatorId,
    /// Op queries carry no payload digest: the restored life hears the answers of the ops its
    /// forgotten past sent under the same op ids.
    ProbeWithoutDigest,
    /// The shell reads 409 `op_id_conflict` as unknown, not as a failure of the op.
    ConflictIsUnknown,
}

/// What one run did, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SagaReuseStats {
    pub events: u64,
    pub completed: u64,
    pub compensated: u64,
    pub needs_attention: u64,
    /// Steps of the restored life that ended failed on `op_id_conflict`.
    pub conflicts: u64,
    pub coordinator_crashes: u64,
    pub participant_crashes: u64,
    pub participant_checkpoints: u64,
}

/// A participant's HTTP answer: status and body, as `participant/src/http.rs` sends it.
type Http = (u16, Vec<u8>);

#[derive(Debug, Clone)]
enum Msg {
    Start(usize),
    Submit {
        life: usize,
        saga: usize,
    },
    Op {
        call: u64,
        to: usize,
        kind: OpKind,
        request: SagaOpRequest,
    },
    OpAnswer {
        call: u64,
        http: Http,
    },
    Probe {
        call: u64,
        to: usize,
        op_id: String,
        query: OpQuery,
    },
    ProbeAnswer {
        call: u64,
        http: Http,
    },
    CallTimeout {
        call: u64,
    },
    Timer {
        life: usize,
        run: u64,
        event: SagaEvent,
    },
    CoordinatorUp(usize),
    ParticipantUp(usize),
}

/// What an outstanding coordinator call is for.
#[derive(Debug, Clone)]
struct Call {
    life: usize,
    run: u64,
    id: TxId,
    step: usize,
    kind: Option<OpKind>,
}

struct Life {
    coordinator_id: CoordinatorId,
    tag: &'static str,
    started: bool,
    /// Its data directory replaced (the restored life took `c-first`'s place): gone for good.
    retired: bool,
    engine: Option<SagaEngine>,
    /// The coordinator's log (durable when appended here).
    log: Vec<LogRecord>,
    run: u64,
    requests: Vec<(SagaRequest, Fate)>,
    /// Each saga's view when the life settled or ended.
    ended: BTreeMap<TxId, SagaResponse>,
}

struct Part {
    engine: Engine<KvStore>,
    /// The last checkpoint (its JSON, as the snapshot file holds it) and the records after it.
    checkpoint: Option<String>,
    log: Vec<Record>,
    up: bool,
}

struct World {
    rng: fastrand::Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    payloads: Vec<Option<Msg>>,
    lives: Vec<Life>,
    parts: Vec<Part>,
    calls: BTreeMap<u64, Call>,
    next_call: u64,
    mutation: Option<SagaReuseMutation>,
    stats: SagaReuseStats,
}

fn fresh_participant() -> Engine<KvStore> {
    Engine::new(EngineConfig::default(), KvStore::new())
}

fn error_http(code: ErrorCode, message: String) -> Http {
    let body = serde_json::to_vec(&ErrorBody::new(code, message)).unwrap_or_default();
    (code.status(), body)
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
        if self.rng.u32(0..100) < dup {
            let again = self.rng.u64(1..80);
            self.schedule(again, msg.clone());
        }
        let delay = self.rng.u64(1..40);
        self.schedule(delay, msg);
    }

    /// Steps one life's engine as its shell does: the step's records durable first (here, at
    /// once), the engine told so, then the rest.
    fn step(&mut self, life: usize, event: SagaEvent) {
        let Some(engine) = self.lives[life].engine.as_mut() else {
            return;
        };
        let mut durable = Vec::new();
        let mut rest = Vec::new();
        for command in engine.step(event) {
            match command {
                SagaCommand::Append(record) => {
                    if let LogRecord::Saga(saga) = &record {
                        durable.push(saga.saga_id().clone());
                    }
                    self.lives[life].log.push(record);
                }
                other => rest.push(other),
            }
        }
        if !durable.is_empty() {
            let now_ms = self.now;
            self.step(
                life,
                SagaEvent::Durable {
                    ids: durable,
                    now_ms,
                },
            );
        }
        for command in rest {
            self.execute(life, command);
        }
    }

    fn execute(&mut self, life: usize, command: SagaCommand) {
        let run = self.lives[life].run;
        match command {
            SagaCommand::Append(_) | SagaCommand::Reply { .. } => {}
            SagaCommand::ArmRetry { id, after_ms } => {
                let event = SagaEvent::RetryDue { id, now_ms: 0 };
                self.schedule(after_ms, Msg::Timer { life, run, event });
            }
            SagaCommand::ArmDeadline { id, after_ms } => {
                let event = SagaEvent::DeadlineDue { id, now_ms: 0 };
                self.schedule(after_ms, Msg::Timer { life, run, event });
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
                let call = self.new_call(life, &id, step, Some(kind));
                let to = part_index(participant.as_str());
                let step_name = self.step_of(life, &id, step).0;
                let request = SagaOpRequest {
                    saga_id: id,
                    step: step_name,
                    op_id,
                    coordinator_id: self.lives[life].coordinator_id.clone(),
                    epoch: Epoch(run),
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
                let call = self.new_call(life, &id, step, None);
                let to = part_index(participant.as_str());
                let action = self.step_of(life, &id, step).1;
                let mut query =
                    OpQuery::from_coordinator(&self.lives[life].coordinator_id, Some(&action));
                match self.mutation {
                    Some(SagaReuseMutation::ProbeWithoutCoordinatorId) => {
                        query = OpQuery::default();
                    }
                    Some(SagaReuseMutation::ProbeWithoutDigest) => query.payload_digest = None,
                    Some(SagaReuseMutation::ConflictIsUnknown) | None => {}
                }
                self.schedule(timeout_ms, Msg::CallTimeout { call });
                self.send(Msg::Probe {
                    call,
                    to,
                    op_id,
                    query,
                });
            }
        }
    }

    /// The name and action of step `step` of saga `id` as life `life` defined it.
    fn step_of(&self, life: usize, id: &TxId, step: usize) -> (String, serde_json::Value) {
        self.lives[life]
            .requests
            .iter()
            .find(|(r, _)| r.id == *id)
            .and_then(|(r, _)| r.steps.get(step))
            .map(|s| (s.name.clone(), s.action.clone()))
            .unwrap_or_default()
    }

    fn new_call(&mut self, life: usize, id: &TxId, step: usize, kind: Option<OpKind>) -> u64 {
        self.next_call += 1;
        let call = Call {
            life,
            run: self.lives[life].run,
            id: id.clone(),
            step,
            kind,
        };
        self.calls.insert(self.next_call, call);
        self.next_call
    }

    /// The first of answer and timeout settles a call; later ones, and those of a run that
    /// crashed since, are ignored.
    fn settle(&mut self, call: u64) -> Option<Call> {
        let found = self.calls.remove(&call)?;
        let life = &self.lives[found.life];
        (found.run == life.run && life.engine.is_some()).then_some(found)
    }

    fn conflict_is_unknown(&self, http: &Http) -> bool {
        self.mutation == Some(SagaReuseMutation::ConflictIsUnknown)
            && serde_json::from_slice::<ErrorBody>(&http.1)
                .is_ok_and(|body| body.error == ErrorCode::OpIdConflict)
    }

    fn deliver(&mut self, msg: Msg) {
        let now = self.now;
        let jitter = self.rng.u64(..);
        match msg {
            Msg::Start(life) => {
                self.lives[life].started = true;
                for saga in 0..self.lives[life].requests.len() {
                    let at = self.rng.u64(0..2_000);
                    self.schedule(at, Msg::Submit { life, saga });
                    if self.rng.u32(0..100) < 20 {
                        let again = self.rng.u64(0..5_000);
                        self.schedule(again, Msg::Submit { life, saga });
                    }
                }
            }
            Msg::Submit { life, saga } => {
                if self.lives[life].retired {
                    return;
                }
                if self.lives[life].engine.is_none() {
                    // The client retries until the coordinator is back.
                    self.schedule(100, Msg::Submit { life, saga });
                    return;
                }
                let (request, _) = self.lives[life].requests[saga].clone();
                let digest = Digest(
                    Fnv128::default()
                        .field(&serde_json::to_vec(&request).unwrap_or_default())
                        .finish(),
                );
                let event = SagaEvent::Submit {
                    waiter: saga as u64,
                    wait: SagaWait::Accepted,
                    request,
                    digest,
                    now_ms: now,
                    client: None,
                };
                self.step(life, event);
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
                let http = match part.engine.saga_op(kind, &request, now) {
                    SagaStepped::Answer { answer, record } => {
                        part.log.extend(record);
                        (200, serde_json::to_vec(&answer).unwrap_or_default())
                    }
                    SagaStepped::Busy(why) => error_http(ErrorCode::NotReady, why),
                    SagaStepped::Conflict(why) => error_http(ErrorCode::OpIdConflict, why),
                };
                self.send(Msg::OpAnswer { call, http });
            }
            Msg::OpAnswer { call, http } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let outcome = if self.conflict_is_unknown(&http) {
                    coordinator::records::SagaOpOutcome::Unknown {
                        error: "op_id_conflict read as unknown".into(),
                    }
                } else {
                    op_outcome(http.0, &http.1)
                };
                let event = SagaEvent::OpAnswered {
                    id: found.id,
                    step: found.step,
                    kind: found.kind.unwrap_or(OpKind::Action),
                    outcome,
                    now_ms: now,
                    jitter,
                };
                self.step(found.life, event);
            }
            Msg::Probe {
                call,
                to,
                op_id,
                query,
            } => {
                if !self.parts[to].up {
                    return;
                }
                let http = match self.parts[to].engine.saga_op_status(&op_id, &query) {
                    Ok(status) => (200, serde_json::to_vec(&status).unwrap_or_default()),
                    Err(refused) => {
                        let refused = ApiError::from(refused);
                        error_http(refused.code, refused.message)
                    }
                };
                self.send(Msg::ProbeAnswer { call, http });
            }
            Msg::ProbeAnswer { call, http } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let answer = if self.conflict_is_unknown(&http) {
                    ProbeAnswer::NoAnswer("op_id_conflict read as unknown".into())
                } else {
                    probe_answer(http.0, &http.1)
                };
                let event = SagaEvent::ProbeAnswered {
                    id: found.id,
                    step: found.step,
                    answer,
                    now_ms: now,
                    jitter,
                };
                self.step(found.life, event);
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
                self.step(found.life, event);
            }
            Msg::Timer { life, run, event } => {
                if run != self.lives[life].run {
                    return;
                }
                let event = match event {
                    SagaEvent::RetryDue { id, .. } => SagaEvent::RetryDue { id, now_ms: now },
                    SagaEvent::DeadlineDue { id, .. } => SagaEvent::DeadlineDue { id, now_ms: now },
                    other => other,
                };
                self.step(life, event);
            }
            Msg::CoordinatorUp(life) => {
                if self.lives[life].retired {
                    return;
                }
                let engine = SagaEngine::replay(CONFIG, Vec::new(), &self.lives[life].log);
                self.lives[life].engine = Some(engine);
                self.step(life, SagaEvent::Recovered { now_ms: now });
            }
            Msg::ParticipantUp(i) => {
                let part = &mut self.parts[i];
                let mut engine = match &part.checkpoint {
                    Some(json) => {
                        let snapshot: Snapshot = match serde_json::from_str(json) {
                            Ok(snapshot) => snapshot,
                            Err(e) => panic!("participant {i}: its checkpoint does not parse: {e}"),
                        };
                        Engine::restore(EngineConfig::default(), snapshot).unwrap_or_else(|e| {
                            panic!("participant {i}: its checkpoint does not restore: {e}")
                        })
                    }
                    None => fresh_participant(),
                };
                for record in part.log.clone() {
                    let _ = engine.replay(record);
                }
                part.engine = engine;
                part.up = true;
            }
        }
    }

    fn crash_coordinator(&mut self, life: usize) {
        let target = &mut self.lives[life];
        if target.retired || target.engine.take().is_none() {
            return;
        }
        target.run += 1;
        self.stats.coordinator_crashes += 1;
        let after = self.rng.u64(10..500);
        self.schedule(after, Msg::CoordinatorUp(life));
    }

    fn crash_participant(&mut self, i: usize) {
        if self.parts[i].up {
            self.parts[i].up = false;
            self.stats.participant_crashes += 1;
            let after = self.rng.u64(10..300);
            self.schedule(after, Msg::ParticipantUp(i));
        }
    }

    /// A participant checkpoint: its snapshot, through JSON as the file holds it, replaces the
    /// records before it.
    fn checkpoint_participant(&mut self, i: usize) {
        let part = &mut self.parts[i];
        if !part.up {
            return;
        }
        match serde_json::to_string(&part.engine.snapshot()) {
            Ok(json) => {
                part.checkpoint = Some(json);
                part.log.clear();
                self.stats.participant_checkpoints += 1;
            }
            Err(e) => panic!("participant {i}: its snapshot does not serialize: {e}"),
        }
    }

    /// Every saga of a started life has ended (and is durable in its table).
    fn settled(&self, life: usize) -> bool {
        let life = &self.lives[life];
        life.started
            && life.engine.as_ref().is_some_and(|engine| {
                life.requests
                    .iter()
                    .all(|(r, _)| engine.get(&r.id).is_some_and(|saga| saga.ended.is_some()))
            })
    }

    /// `c-first` settled: record its sagas as they ended, retire it, and start the restored
    /// life under its id on an empty log.
    fn restore_first_from_an_empty_backup(&mut self) {
        let first = &mut self.lives[0];
        if let Some(engine) = first.engine.take() {
            for (request, _) in &first.requests {
                if let Some(saga) = engine.get(&request.id) {
                    first.ended.insert(request.id.clone(), saga.view(self.now));
                }
            }
        }
        first.retired = true;
        self.schedule(0, Msg::Start(RESTORED));
    }

    fn effects(&self, id: &str, tag: &str) -> Effects {
        let int = |i: usize, key: String| {
            self.parts[i]
                .engine
                .resource()
                .get(&key)
                .and_then(|e| e.value.as_i64())
                .unwrap_or(0)
        };
        Effects {
            reserved: int(0, format!("saga-stock:{id}.{tag}")),
            charged: int(1, format!("saga-charge:{id}.{tag}")),
            shipped: self.parts[2]
                .engine
                .resource()
                .get(&format!("saga-ship:{id}.{tag}"))
                .is_some(),
        }
    }
}

fn part_index(name: &str) -> usize {
    NAMES.iter().position(|n| *n == name).unwrap_or(0)
}

/// A checkout saga of `id` whose steps write keys tagged with the life.
fn request(id: &str, tag: &str, fate: Fate, timeout: u64) -> Result<SagaRequest, String> {
    let mut json = saga_checkout::request(&format!("{id}.{tag}"), 2, 30, fate, timeout);
    json["id"] = serde_json::json!(id);
    serde_json::from_value(json).map_err(|e| e.to_string())
}

/// Runs one seed; `Err` names the broken invariant and the seed.
pub fn run_saga_reuse_seed(seed: u64, config: SagaReuseConfig) -> Result<SagaReuseStats, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let fates = [Fate::Complete, Fate::Declined, Fate::FailAfterPivot];
    let ids: Vec<String> = (0..config.sagas).map(|i| format!("r{seed}-{i}")).collect();
    let mut lives = Vec::new();
    for (coordinator_id, tag) in LIVES {
        let requests = ids
            .iter()
            .map(|id| {
                let fate = fates[rng.usize(..fates.len())];
                let timeout = if rng.bool() { 300 } else { 30_000 };
                Ok((request(id, tag, fate, timeout)?, fate))
            })
            .collect::<Result<Vec<_>, String>>()?;
        lives.push(Life {
            coordinator_id: CoordinatorId::new(coordinator_id).map_err(|e| e.to_string())?,
            tag,
            started: false,
            retired: false,
            engine: Some(SagaEngine::new(CONFIG)),
            log: Vec::new(),
            run: 1,
            requests,
            ended: BTreeMap::new(),
        });
    }
    let mut world = World {
        rng,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        payloads: Vec::new(),
        lives,
        parts: (0..3)
            .map(|_| Part {
                engine: fresh_participant(),
                checkpoint: None,
                log: Vec::new(),
                up: true,
            })
            .collect(),
        calls: BTreeMap::new(),
        next_call: 0,
        mutation: config.mutation,
        stats: SagaReuseStats::default(),
    };
    world.schedule(0, Msg::Start(0));
    let second_at = world.rng.u64(0..3_000);
    world.schedule(second_at, Msg::Start(1));
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
        if !world.lives[RESTORED].started && !world.lives[0].retired && world.settled(0) {
            world.restore_first_from_an_empty_backup();
        }
        if world.faulty() {
            match world.rng.u32(0..1000) {
                0..=4 => {
                    let life = world.rng.usize(0..LIVES.len());
                    world.crash_coordinator(life);
                }
                5..=7 => {
                    let i = world.rng.usize(0..3);
                    world.crash_participant(i);
                }
                8..=12 => {
                    let i = world.rng.usize(0..3);
                    world.checkpoint_participant(i);
                }
                _ => {}
            }
        }
    }
    check(seed, &mut world)?;
    Ok(world.stats)
}

/// The invariants, once the run is over.
fn check(seed: u64, world: &mut World) -> Result<(), String> {
    if !world.lives[0].retired {
        return Err(format!(
            "seed {seed}: liveness: coordinator c-first's sagas never all ended"
        ));
    }
    for life in 1..LIVES.len() {
        if !world.settled(life) {
            return Err(format!(
                "seed {seed}: liveness: a saga of life {} (coordinator {}) never ended",
                world.lives[life].tag, world.lives[life].coordinator_id
            ));
        }
        if let Some(engine) = &world.lives[life].engine {
            let views: Vec<(TxId, SagaResponse)> = world.lives[life]
                .requests
                .iter()
                .filter_map(|(r, _)| engine.get(&r.id).map(|s| (r.id.clone(), s.view(world.now))))
                .collect();
            world.lives[life].ended.extend(views);
        }
    }
    for life in &world.lives {
        for (request, fate) in &life.requests {
            let Some(view) = life.ended.get(&request.id) else {
                return Err(format!(
                    "seed {seed}: saga {} of life {} never began",
                    request.id, life.tag
                ));
            };
            let json = serde_json::to_value(view).map_err(|e| e.to_string())?;
            let effects = world.effects(request.id.as_str(), life.tag);
            saga_checkout::check(&json, effects, 2, 30).map_err(|e| {
                format!(
                    "seed {seed}: saga {} of coordinator {} (life {}, {fate:?}) did not end on \
                     its own steps' answers: {e}",
                    request.id, life.coordinator_id, life.tag
                )
            })?;
            let conflicts = view
                .steps
                .iter()
                .filter(|s| {
                    s.last_error
                        .as_deref()
                        .is_some_and(|e| e.starts_with("op_id_conflict"))
                })
                .count() as u64;
            if conflicts > 0 && life.tag != LIVES[RESTORED].1 {
                return Err(format!(
                    "seed {seed}: saga {} of coordinator {} (life {}) was refused op_id_conflict: \
                     its op ids were never used by this coordinator id before, so the refusal \
                     came from another coordinator's op: {view:?}",
                    request.id, life.coordinator_id, life.tag
                ));
            }
            if life.tag == LIVES[RESTORED].1 {
                world.stats.conflicts += conflicts;
            }
            match view.state {
                SagaState::Completed => world.stats.completed += 1,
                SagaState::Compensated => world.stats.compensated += 1,
                SagaState::NeedsAttention => world.stats.needs_attention += 1,
                SagaState::Running | SagaState::Compensating => {
                    return Err(format!(
                        "seed {seed}: saga {} of life {} is {:?} at the end",
                        request.id, life.tag, view.state
                    ));
                }
            }
        }
    }
    Ok(())
}
