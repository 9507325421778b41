//! Deterministic simulation of leases and fenced writes: the coordinator's pure lease engine,
//! one KV participant's pure engine, and three workers that acquire, renew, pause (stop taking
//! steps, sometimes between checking their lease and writing) and write through the fence,
//! over a network that delays, duplicates and loses messages, with crashes of both services
//! back to their durable log (plus any prefix of what was not yet synced) and checkpoints.
//!
//! The adversary is in the mix too (`fencing_adversary`): a client that forges tokens (2^64-1,
//! just above the last grant, with a missing, made-up or borrowed proof) and reuses honest op
//! ids for other writes, and an operator who resets the fence when a forged token got in. Half
//! the seeds run with a fence key (grants carry proofs, the participant checks them), half
//! without (the participant's jump bound is all there is). The participant prunes its fence
//! table on short retentions, and its clock is stepped at restarts (a wall clock read anew).
//!
//! Invariants, checked after every event:
//! - no write with a token lower than an already accepted one (for its resource) is ever
//!   applied: the participant's durable fenced-write history is non-decreasing in token
//!   between operator resets, and not below a reset's new highest after it;
//! - a duplicate op id never applies twice within the op answers' retention, and every answer
//!   to one op id is its first answer (an acknowledged write is never lost);
//! - a reused op id never hands out another write's answer;
//! - with a key, no forged token is ever applied; without, none jumps more than the bound
//!   above every token applied before it;
//! - a token is never granted to two holders, and a new grant's token is higher than every
//!   token granted before it (across crashes and restarts).
//!
//! Like the rest of `sim`, it never opens a socket, reads a clock or draws a number that does
//! not come from the seeded generator: one seed replays one run.

use std::collections::BTreeMap;

use coordinator::leases::{
    LeaseCommand, LeaseEngine, LeaseEvent, LeaseRecord, LeaseReply, LeaseSnapshot,
};
use participant::fence::table::FenceRetention;
use participant::fence::{FencePolicy, FenceResetRequest, FencedAnswer, FencedWrite};
use participant::kv::KvStore;
use participant::record::Record;
use participant::snapshot::Snapshot as PartSnapshot;
use participant::{Command, Engine, EngineConfig, Event, Rejection, Reply};
use protocol::fence_proof::FenceKeys;
use protocol::lease::FenceClaim;

use super::fencing_adversary::{self, Forged, Target};

/// A deliberate break of the runtimes' ordering, to show the checks catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencingMutation {
    None,
    /// The coordinator answers a grant before its record is durable.
    GrantBeforeDurable,
    /// The participant answers a fenced write before its record is durable.
    WriteAnswerBeforeDurable,
    /// The participant answers `stale_token` before the forced record behind it is durable
    /// (the barrier that makes the writes which raised the highest token durable first).
    StaleAnswerBeforeDurable,
    /// The participant measures retention on a wall clock that steps within a run (the
    /// engine is fed the stepped time), so op answers go before their window is over.
    SteppingClock,
}

/// What one run did.
#[derive(Debug, Clone, Copy, Default)]
pub struct FencingStats {
    pub grants: u64,
    pub applied: u64,
    pub stale: u64,
    pub repeats: u64,
    pub crashes: u64,
    pub pauses: u64,
    /// Forged writes sent, and those the participant applied (only without a key, within the
    /// jump bound).
    pub forged: u64,
    pub forged_applied: u64,
    /// Reused op ids refused `op_id_conflict`.
    pub op_id_conflicts: u64,
    pub resets: u64,
    /// Entries the participant's retention took.
    pub pruned: u64,
}

const RESOURCE: &str = "orders";
const WORKERS: usize = 3;
const RUN_MS: u64 = 6_000;
/// The key half the seeds run with (the lease service signs, the participant checks).
const FENCE_KEY: &str = "sim-fence-key-0123456789abcdef0123456789";
/// The participant's jump bound without a key: far above a run's grants (a few hundred).
const JUMP_MAX: u64 = 1_000;
/// Retention short enough to act within a run; op answers outlive every honest retry and
/// late copy (late copies come at most ~2 s after their send).
const RETENTION: FenceRetention = FenceRetention {
    highest_ms: 1_000,
    answers_ms: 3_000,
    answers_max: 100_000,
};
/// How far the participant's clock may step at a restart (a wall clock read anew).
const RESTART_STEP_MS: u64 = 400;

#[derive(Debug, Clone)]
pub(crate) enum Payload {
    Acquire {
        worker: usize,
        ttl_ms: u64,
    },
    Renew {
        worker: usize,
        token: u64,
    },
    Lease {
        worker: usize,
        reply: LeaseReply,
    },
    Write {
        worker: usize,
        write: FencedWrite,
    },
    Written {
        worker: usize,
        op_id: String,
        answer: FencedAnswer,
    },
    /// A forged write, and what was forged about it.
    Forged {
        write: FencedWrite,
        forged: Forged,
    },
    /// The participant's answer to a forged write it took up (stale, or applied).
    ForgedAnswered {
        op_id: String,
        forged: Forged,
        answer: FencedAnswer,
    },
    /// The participant's refusal of a write it would not take (no valid proof, too high a
    /// token, a reused op id).
    Refused {
        op_id: String,
        forged: Option<Forged>,
        rejection: Rejection,
    },
    /// An operator's reset, and its answer.
    Reset(FenceResetRequest),
    ResetDone,
}

#[derive(Debug, Default)]
struct Worker {
    token: Option<u64>,
    /// The proof that came with its grant (with a key).
    proof: Option<String>,
    /// Its own view: the lease holds until then (measured from when it asked).
    believed_until: u64,
    asked_at: u64,
    waiting_lease: bool,
    paused_until: u64,
    /// A write it decided on, sent when a pause ends (the pause between check and write).
    deferred: Option<FencedWrite>,
    /// Writes sent and not answered, resent after a while with the same op id.
    unanswered: BTreeMap<String, (FencedWrite, u64)>,
    writes: u64,
}

/// A log as the simulation keeps it: synced records, then those not yet synced.
#[derive(Debug)]
struct Log<R> {
    durable: Vec<R>,
    pending: Vec<R>,
}

impl<R: Clone> Log<R> {
    fn new() -> Self {
        Log {
            durable: Vec::new(),
            pending: Vec::new(),
        }
    }
}

struct World {
    rng: fastrand::Rng,
    now: u64,
    mutation: FencingMutation,
    network: Vec<(u64, u64, Payload)>,
    sent: u64,
    leases: LeaseEngine,
    lease_log: Log<LeaseRecord>,
    lease_snapshot: LeaseSnapshot,
    lease_waiting: Vec<Payload>,
    part: Engine<KvStore>,
    part_log: Log<Record>,
    part_snapshot: Option<PartSnapshot>,
    part_waiting: Vec<Payload>,
    workers: Vec<Worker>,
    /// Durable fenced writes and resets in log order, for all time.
    history: Vec<Applied>,
    first_answers: BTreeMap<String, FencedAnswer>,
    /// When each op id's first answer reached its writer.
    answered_at: BTreeMap<String, u64>,
    /// What each honest op id wrote (the worker's payload), to tell its answer from another's.
    payloads: BTreeMap<String, serde_json::Value>,
    granted: BTreeMap<u64, usize>,
    stats: FencingStats,
    /// With a key: the lease service signs grants and the participant checks proofs.
    keys: Option<FenceKeys>,
    /// The participant's clock minus the true time (stepped at restarts; within a run only
    /// with `SteppingClock`).
    clock_offset: i64,
    reset_waiting: bool,
}

/// One durable event of the fence's history.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    Write { token: u64, op_id: String, at: u64 },
    Reset { to: u64 },
}

pub(crate) fn config(keys: &Option<FenceKeys>) -> EngineConfig {
    EngineConfig {
        fence: FencePolicy {
            keys: keys.clone(),
            jump_max: JUMP_MAX,
        },
        fence_retention: RETENTION,
        ..EngineConfig::default()
    }
}

impl World {
    fn send(&mut self, payload: Payload) {
        let roll = self.rng.u32(0..100);
        if roll < 3 {
            return; // lost
        }
        if matches!(payload, Payload::Write { .. }) && roll < 13 {
            // A client's retry (or a proxy's copy) that arrives much later.
            let late = self.now + self.rng.u64(200..2_000);
            self.sent += 1;
            self.network.push((late, self.sent, payload.clone()));
        }
        let copies = if roll < 8 { 2 } else { 1 };
        for _ in 0..copies {
            let delay = if self.rng.u32(0..100) < 5 {
                self.rng.u64(50..800)
            } else {
                self.rng.u64(1..15)
            };
            self.sent += 1;
            self.network
                .push((self.now + delay, self.sent, payload.clone()));
        }
    }

    /// The participant's clock: the true time plus its offset.
    fn part_now(&self) -> u64 {
        self.now.saturating_add_signed(self.clock_offset)
    }

    /// The coordinator answers (the moment a holder may hear it): a token is never answered
    /// to two holders, and a new token is higher than every one answered before. With a key,
    /// the API signs the grant for its holder, as `api::leases` does.
    fn answer_lease(&mut self, answer: Payload) -> Result<(), String> {
        let answer = match answer {
            Payload::Lease {
                worker,
                reply: LeaseReply::Granted(mut lease),
            } => {
                if let Some(keys) = &self.keys {
                    lease.proof = Some(keys.sign(&lease.name, lease.token, &lease.holder));
                }
                Payload::Lease {
                    worker,
                    reply: LeaseReply::Granted(lease),
                }
            }
            other => other,
        };
        if let Payload::Lease { worker, reply } = &answer {
            let worker = *worker;
            let reply = reply.clone();
            if let LeaseReply::Granted(lease) = &reply {
                match self.granted.get(&lease.token) {
                    Some(&other) if other != worker => {
                        return Err(format!(
                            "token {} granted to w{other} and to w{worker}",
                            lease.token
                        ));
                    }
                    Some(_) => {}
                    None => {
                        if let Some((&highest, _)) = self.granted.last_key_value()
                            && lease.token < highest
                        {
                            return Err(format!(
                                "new grant of token {} after token {highest}",
                                lease.token
                            ));
                        }
                        self.granted.insert(lease.token, worker);
                        self.stats.grants += 1;
                    }
                }
            }
        }
        self.send(answer);
        Ok(())
    }

    fn lease_request(&mut self, worker: usize, event: LeaseEvent) -> Result<(), String> {
        let commands = self.leases.step(event);
        let logged = commands
            .iter()
            .any(|c| matches!(c, LeaseCommand::Append(_)));
        for command in commands {
            match command {
                LeaseCommand::Append(record) => self.lease_log.pending.push(record),
                LeaseCommand::Reply(reply) => {
                    let answer = Payload::Lease { worker, reply };
                    if logged && self.mutation != FencingMutation::GrantBeforeDurable {
                        self.lease_waiting.push(answer);
                    } else {
                        self.answer_lease(answer)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// One participant step for a request; its answer leaves once the forced records of the
    /// step are durable (or at once when none was logged).
    fn participant_request(&mut self, event: Event, answer_of: impl FnOnce(Reply) -> Payload) {
        let commands = self.part.step(event);
        let mut logged = false;
        let mut answer = None;
        for command in commands {
            match command {
                Command::Log { record, forced } => {
                    logged |= forced;
                    self.part_log.pending.push(record);
                }
                Command::Reply(reply) => answer = Some(reply),
                Command::Deliver { .. } | Command::AskDecision { .. } => {}
            }
        }
        let Some(reply) = answer else {
            return;
        };
        let early = matches!(
            (self.mutation, &reply),
            (
                FencingMutation::WriteAnswerBeforeDurable,
                Reply::Fenced(FencedAnswer::Applied { .. })
            ) | (
                FencingMutation::StaleAnswerBeforeDurable,
                Reply::Fenced(FencedAnswer::Stale(_))
            )
        );
        let payload = answer_of(reply);
        if logged && !early {
            self.part_waiting.push(payload);
        } else {
            self.send(payload);
        }
    }

    fn fenced_request(
        &mut self,
        worker: Option<usize>,
        write: FencedWrite,
        forged: Option<Forged>,
    ) {
        let op_id = write.op_id.clone();
        let event = Event::FencedWrite {
            write,
            now_ms: self.part_now(),
        };
        self.participant_request(event, |reply| match (reply, worker) {
            (Reply::Fenced(answer), Some(worker)) => Payload::Written {
                worker,
                op_id,
                answer,
            },
            (Reply::Fenced(answer), None) => match forged {
                Some(forged) => Payload::ForgedAnswered {
                    op_id,
                    forged,
                    answer,
                },
                None => Payload::Refused {
                    op_id,
                    forged,
                    rejection: Rejection::InvalidPayload("an answer for nobody".into()),
                },
            },
            (Reply::Reject(rejection), _) => Payload::Refused {
                op_id,
                forged,
                rejection,
            },
            (other, _) => Payload::Refused {
                op_id,
                forged,
                rejection: Rejection::InvalidPayload(format!("unexpected answer {other:?}")),
            },
        });
    }
}

impl World {
    fn new(seed: u64, mutation: FencingMutation) -> World {
        let keys = seed.is_multiple_of(2).then(|| {
            FenceKeys::parse("sim", FENCE_KEY).unwrap_or_else(|e| panic!("the sim's key: {e}"))
        });
        World {
            rng: fastrand::Rng::with_seed(seed),
            now: 0,
            mutation,
            network: Vec::new(),
            sent: 0,
            leases: LeaseEngine::new(),
            lease_log: Log::new(),
            lease_snapshot: LeaseSnapshot::default(),
            lease_waiting: Vec::new(),
            part: Engine::new(config(&keys), KvStore::new()),
            part_log: Log::new(),
            part_snapshot: None,
            part_waiting: Vec::new(),
            workers: (0..WORKERS).map(|_| Worker::default()).collect(),
            history: Vec::new(),
            first_answers: BTreeMap::new(),
            answered_at: BTreeMap::new(),
            payloads: BTreeMap::new(),
            granted: BTreeMap::new(),
            stats: FencingStats::default(),
            keys,
            clock_offset: 0,
            reset_waiting: false,
        }
    }

    /// Everything submitted is durable; answers waiting for it leave.
    fn sync_leases(&mut self) -> Result<(), String> {
        let pending = std::mem::take(&mut self.lease_log.pending);
        self.lease_log.durable.extend(pending);
        for answer in std::mem::take(&mut self.lease_waiting) {
            self.answer_lease(answer)?;
        }
        if self.rng.u32(0..20) == 0 {
            self.lease_snapshot = self.leases.snapshot();
            self.lease_log.durable.clear();
        }
        Ok(())
    }

    fn note_durable(&mut self, records: &[Record]) {
        for record in records {
            match record {
                Record::FencedWrite { op_id, token, .. } => self.history.push(Applied::Write {
                    token: *token,
                    op_id: op_id.clone(),
                    at: self.now,
                }),
                Record::FenceReset(reset) => self.history.push(Applied::Reset { to: reset.to }),
                _ => {}
            }
        }
    }

    fn sync_participant(&mut self) {
        let pending = std::mem::take(&mut self.part_log.pending);
        self.note_durable(&pending);
        self.part_log.durable.extend(pending);
        for answer in std::mem::take(&mut self.part_waiting) {
            self.send(answer);
        }
        if self.rng.u32(0..20) == 0 {
            self.part_snapshot = Some(self.part.snapshot());
            self.part_log.durable.clear();
        }
    }

    /// A crash: the unsynced tail survives up to a random point; unsent answers are gone.
    fn crash_leases(&mut self) {
        let pending = std::mem::take(&mut self.lease_log.pending);
        let kept = self.rng.usize(0..=pending.len());
        self.lease_log
            .durable
            .extend(pending.into_iter().take(kept));
        self.lease_waiting.clear();
        self.leases = LeaseEngine::recover(
            self.lease_snapshot.clone(),
            self.lease_log.durable.clone(),
            self.now,
        );
        self.stats.crashes += 1;
    }

    fn crash_participant(&mut self) -> Result<(), String> {
        let pending = std::mem::take(&mut self.part_log.pending);
        let kept = self.rng.usize(0..=pending.len());
        let kept: Vec<Record> = pending.into_iter().take(kept).collect();
        self.note_durable(&kept);
        self.part_log.durable.extend(kept);
        self.part_waiting.clear();
        self.reset_waiting = false;
        let config = config(&self.keys);
        let mut engine = match &self.part_snapshot {
            Some(snapshot) => {
                Engine::restore(config, snapshot.clone()).map_err(|e| e.to_string())?
            }
            None => Engine::new(config, KvStore::new()),
        };
        for record in self.part_log.durable.clone() {
            engine.replay(record).map_err(|e| e.to_string())?;
        }
        self.part = engine;
        // The restarted process reads the wall clock anew: it may have stepped either way.
        self.step_clock(RESTART_STEP_MS);
        self.stats.crashes += 1;
        Ok(())
    }

    fn step_clock(&mut self, max_ms: u64) {
        let step = self.rng.i64(-(max_ms as i64)..=max_ms as i64);
        self.clock_offset = self.clock_offset.saturating_add(step);
    }

    fn deliver(&mut self, payload: Payload) -> Result<(), String> {
        match payload {
            Payload::Acquire { worker, ttl_ms } => {
                let event = LeaseEvent::Acquire {
                    name: RESOURCE.into(),
                    holder: format!("w{worker}"),
                    ttl_ms,
                    now_ms: self.now,
                };
                self.lease_request(worker, event)?;
            }
            Payload::Renew { worker, token } => {
                let event = LeaseEvent::Renew {
                    name: RESOURCE.into(),
                    holder: format!("w{worker}"),
                    token,
                    now_ms: self.now,
                };
                self.lease_request(worker, event)?;
            }
            Payload::Lease { worker, reply } => {
                let w = &mut self.workers[worker];
                if !w.waiting_lease {
                    return Ok(()); // a duplicate
                }
                w.waiting_lease = false;
                match reply {
                    LeaseReply::Granted(lease) => {
                        w.token = Some(lease.token);
                        w.proof = lease.proof;
                        w.believed_until = w.asked_at + lease.ttl_ms;
                    }
                    LeaseReply::Lost { .. } => w.token = None,
                    LeaseReply::Held { .. } | LeaseReply::Released(_) => {}
                }
            }
            Payload::Write { worker, write } => self.fenced_request(Some(worker), write, None),
            Payload::Forged { write, forged } => self.fenced_request(None, write, Some(forged)),
            Payload::Written {
                worker,
                op_id,
                answer,
            } => self.written(worker, op_id, answer)?,
            Payload::Refused {
                op_id,
                forged,
                rejection,
            } => self.refused(&op_id, forged, &rejection)?,
            Payload::ForgedAnswered {
                op_id,
                forged,
                answer,
            } => {
                if let FencedAnswer::Applied { receipt, .. } = &answer {
                    // The forger's own write, never another writer's receipt.
                    if receipt["key"].as_str() != Some("forged") {
                        return Err(format!(
                            "forged op {op_id} ({forged:?}) was answered another write's \
                             receipt {receipt}"
                        ));
                    }
                    self.stats.forged_applied += 1;
                }
            }
            Payload::Reset(request) => {
                let event = Event::ResetFence {
                    request,
                    now_ms: self.part_now(),
                };
                self.participant_request(event, |_| Payload::ResetDone);
            }
            Payload::ResetDone => self.reset_waiting = false,
        }
        Ok(())
    }

    fn written(
        &mut self,
        worker: usize,
        op_id: String,
        answer: FencedAnswer,
    ) -> Result<(), String> {
        self.workers[worker].unanswered.remove(&op_id);
        if let (FencedAnswer::Applied { receipt, .. }, Some(payload)) =
            (&answer, self.payloads.get(&op_id))
        {
            // The receipt names the key this op wrote, never another write's.
            let key = payload["ops"][0]["key"].as_str();
            if receipt["key"].as_str() != key {
                return Err(format!(
                    "op {op_id} was answered another write's receipt {receipt}"
                ));
            }
        }
        match self.first_answers.get(&op_id) {
            None => {
                match &answer {
                    FencedAnswer::Applied { .. } => self.stats.applied += 1,
                    FencedAnswer::Stale(_) => self.stats.stale += 1,
                }
                self.answered_at.insert(op_id.clone(), self.now);
                self.first_answers.insert(op_id, answer);
            }
            Some(first) => {
                self.stats.repeats += 1;
                // A refusal is remembered in memory (and checkpoints), not logged: after a
                // crash its repeat is refused again, with the highest of then; and once the
                // answers' retention took it, a repeat is a new write (as documented).
                let same = match (first, &answer) {
                    (FencedAnswer::Stale(a), FencedAnswer::Stale(b)) => {
                        a.token == b.token && a.resource == b.resource
                    }
                    (FencedAnswer::Stale(_), FencedAnswer::Applied { .. }) => {
                        return Err(format!(
                            "op {op_id} answered {first:?} first, then applied: {answer:?}"
                        ));
                    }
                    (a, b) => a == b || self.may_have_been_pruned(&op_id),
                };
                if !same {
                    return Err(format!(
                        "op {op_id} answered {first:?} first, then {answer:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether the retention may have taken `op_id`'s answer by now: it was first applied or
    /// answered longer ago than the answers' retention, less the clock steps restarts bring.
    fn may_have_been_pruned(&self, op_id: &str) -> bool {
        let old =
            |at: u64| self.now.saturating_sub(at) + RESTART_STEP_MS * 4 >= RETENTION.answers_ms;
        self.answered_at.get(op_id).is_some_and(|at| old(*at))
            || self.history.iter().any(|applied| {
                matches!(applied, Applied::Write { op_id: o, at, .. } if o == op_id && old(*at))
            })
    }

    fn refused(
        &mut self,
        op_id: &str,
        forged: Option<Forged>,
        rejection: &Rejection,
    ) -> Result<(), String> {
        match (forged, rejection) {
            (Some(Forged::ReusedOpId), Rejection::OpIdConflict { .. }) => {
                self.stats.op_id_conflicts += 1;
                Ok(())
            }
            (Some(_), Rejection::FenceRefused(_) | Rejection::OpIdConflict { .. }) => Ok(()),
            (_, Rejection::KeyLocked { .. }) => Ok(()),
            (forged, rejection) => Err(format!(
                "op {op_id} ({forged:?}) refused unexpectedly: {rejection}"
            )),
        }
    }

    fn step_worker(&mut self, i: usize) {
        let now = self.now;
        if self.workers[i].paused_until > now {
            return;
        }
        if let Some(write) = self.workers[i].deferred.take() {
            // Back from a pause taken after checking the lease: it writes anyway.
            self.workers[i]
                .unanswered
                .insert(write.op_id.clone(), (write.clone(), now));
            self.send(Payload::Write { worker: i, write });
            return;
        }
        let resend: Vec<FencedWrite> = self.workers[i]
            .unanswered
            .values()
            .filter(|(_, at)| now.saturating_sub(*at) > 400)
            .map(|(w, _)| w.clone())
            .collect();
        for write in resend {
            self.workers[i]
                .unanswered
                .insert(write.op_id.clone(), (write.clone(), now));
            self.send(Payload::Write { worker: i, write });
        }
        let w = &mut self.workers[i];
        if w.waiting_lease {
            if now.saturating_sub(w.asked_at) > 300 {
                w.waiting_lease = false; // the answer was lost; ask again later
            }
            return;
        }
        match w.token {
            None => {
                w.waiting_lease = true;
                w.asked_at = now;
                let ttl_ms = self.rng.u64(100..600);
                self.send(Payload::Acquire { worker: i, ttl_ms });
            }
            Some(_) if now >= w.believed_until => w.token = None,
            Some(token) if self.rng.bool() => {
                w.waiting_lease = true;
                w.asked_at = now;
                self.send(Payload::Renew { worker: i, token });
            }
            Some(token) => {
                w.writes += 1;
                let value = format!("w{i}-{}", w.writes);
                let write = FencedWrite {
                    op_id: value.clone(),
                    fence: FenceClaim {
                        resource: RESOURCE.into(),
                        token,
                        holder: Some(format!("w{i}")),
                        proof: w.proof.clone(),
                    },
                    payload: serde_json::json!({"ops": [
                        {"op": "put", "key": format!("k{}", w.writes % 3), "value": value}
                    ]}),
                };
                self.payloads
                    .insert(write.op_id.clone(), write.payload.clone());
                if self.rng.u32(0..10) == 0 {
                    // Checked its lease, then stopped (GC, SIGSTOP) before writing.
                    w.paused_until = now + self.rng.u64(50..1_500);
                    w.deferred = Some(write);
                    self.stats.pauses += 1;
                } else {
                    w.unanswered
                        .insert(write.op_id.clone(), (write.clone(), now));
                    self.send(Payload::Write { worker: i, write });
                }
            }
        }
    }

    /// The adversary's turn: a forged write, now and then.
    fn step_forger(&mut self) {
        let highest_granted = self.granted.last_key_value().map_or(0, |(t, _)| *t);
        let known: Vec<String> = self.first_answers.keys().cloned().collect();
        let target = Target {
            resource: RESOURCE,
            jump_max: JUMP_MAX,
        };
        if let Some((write, forged)) = fencing_adversary::forge(
            &mut self.rng,
            target,
            highest_granted,
            &known,
            self.stats.forged,
        ) {
            self.stats.forged += 1;
            self.send(Payload::Forged { write, forged });
        }
    }

    /// The operator's turn: when the fence stands above every granted token (a forged token
    /// got in, without a key), they read it and reset it to the last grant.
    fn step_operator(&mut self) {
        if self.reset_waiting {
            return;
        }
        let highest_granted = self.granted.last_key_value().map_or(0, |(t, _)| *t);
        let seen = self.part.fences().effective_highest(RESOURCE);
        if let Some(request) = fencing_adversary::reset_if_forged(RESOURCE, seen, highest_granted) {
            self.reset_waiting = true;
            self.stats.resets += 1;
            self.send(Payload::Reset(request));
        }
    }

    fn tick_participant(&mut self) {
        let before = self.part.fences().pruned();
        self.part.step(Event::Tick {
            now_ms: self.part_now(),
        });
        let after = self.part.fences().pruned();
        self.stats.pruned += (after.highest + after.answers) - (before.highest + before.answers);
    }

    fn check(&self) -> Result<(), String> {
        let mut highest = 0;
        let mut applied_at: BTreeMap<&str, u64> = BTreeMap::new();
        for event in &self.history {
            match event {
                Applied::Reset { to } => highest = *to,
                Applied::Write { token, op_id, at } => {
                    if *token < highest {
                        return Err(format!(
                            "write {op_id} with token {token} applied after token {highest}"
                        ));
                    }
                    if *token > highest.saturating_add(JUMP_MAX) && op_id.starts_with('f') {
                        return Err(format!(
                            "forged write {op_id} with token {token} applied, more than \
                             {JUMP_MAX} above {highest}"
                        ));
                    }
                    if self.keys.is_some() && op_id.starts_with('f') {
                        return Err(format!(
                            "forged write {op_id} (token {token}) applied at a participant that \
                             checks proofs"
                        ));
                    }
                    highest = *token;
                    if let Some(first) = applied_at.insert(op_id, *at)
                        && at.saturating_sub(first) + RESTART_STEP_MS * 4 < RETENTION.answers_ms
                    {
                        return Err(format!(
                            "op {op_id} applied twice, {} ms apart (within the answers' \
                             retention of {} ms)",
                            at - first,
                            RETENTION.answers_ms
                        ));
                    }
                }
            }
        }
        // A write answered stale_token is never applied later (by a retry or a late copy).
        for (op_id, answer) in &self.first_answers {
            if matches!(answer, FencedAnswer::Stale(_))
                && applied_at.contains_key(op_id.as_str())
                && !self.may_have_been_pruned(op_id)
            {
                return Err(format!(
                    "op {op_id} was answered stale_token and later applied"
                ));
            }
        }
        // Every write acknowledged as applied is in the durable history or still on its way.
        for (op_id, answer) in &self.first_answers {
            if matches!(answer, FencedAnswer::Applied { .. })
                && !applied_at.contains_key(op_id.as_str())
                && !self
                    .part_log
                    .pending
                    .iter()
                    .any(|r| matches!(r, Record::FencedWrite { op_id: o, .. } if o == op_id))
            {
                return Err(format!("op {op_id} was acknowledged and then lost"));
            }
        }
        Ok(())
    }
}

/// Runs one seed; `Err` names the broken invariant and when.
pub fn run_fencing_seed(seed: u64, mutation: FencingMutation) -> Result<FencingStats, String> {
    let mut world = World::new(seed, mutation);
    let at = |world: &World, e: String| format!("seed {seed} at {} ms: {e}", world.now);
    while world.now < RUN_MS {
        world.now += world.rng.u64(1..=5);
        world.network.sort_by_key(|(at, n, _)| (*at, *n));
        let due = world
            .network
            .iter()
            .take_while(|(at, ..)| *at <= world.now)
            .count();
        let messages: Vec<Payload> = world.network.drain(..due).map(|(_, _, p)| p).collect();
        for payload in messages {
            world.deliver(payload).map_err(|e| at(&world, e))?;
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.bool() {
            world.sync_leases().map_err(|e| at(&world, e))?;
        }
        // Syncs are rare enough that answers, crashes and stale writes fall between them.
        if world.rng.u32(0..6) == 0 {
            world.sync_participant();
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.u32(0..400) == 0 {
            world.crash_leases();
        }
        if world.rng.u32(0..200) == 0 {
            world.crash_participant()?;
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.u32(0..20) == 0 {
            if mutation == FencingMutation::SteppingClock && world.rng.u32(0..10) == 0 {
                // A wall clock stepped while the process runs, fed straight to the engine.
                world.step_clock(RETENTION.answers_ms);
            }
            world.tick_participant();
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.u32(0..60) == 0 {
            world.step_forger();
        }
        if world.rng.u32(0..50) == 0 {
            world.step_operator();
        }
        for i in 0..WORKERS {
            if world.rng.u32(0..4) == 0 {
                world.step_worker(i);
            }
        }
    }
    Ok(world.stats)
}
