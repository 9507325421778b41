//! Deterministic simulation of leases and fenced writes: the coordinator's pure lease engine,
//! one KV participant's pure engine, and three workers that acquire, renew, pause (stop taking
//! steps, sometimes between checking their lease and writing) and write through the fence,
//! over a network that delays, duplicates and loses messages, with crashes of both services
//! back to their durable log (plus any prefix of what was not yet synced) and checkpoints.
//!
//! Invariants, checked after every event:
//! - no write with a token lower than an already accepted one (for its resource) is ever
//!   applied: the participant's durable fenced-write history is non-decreasing in token;
//! - a duplicate op id never applies twice, and every answer to one op id is its first answer
//!   (an acknowledged write is never lost);
//! - a token is never granted to two holders, and a new grant's token is higher than every
//!   token granted before it (across crashes and restarts).
//!
//! Like the rest of `sim`, it never opens a socket, reads a clock or draws a number that does
//! not come from the seeded generator: one seed replays one run.

use std::collections::BTreeMap;

use coordinator::leases::{
    LeaseCommand, LeaseEngine, LeaseEvent, LeaseRecord, LeaseReply, LeaseSnapshot,
};
use participant::fence::{FencedAnswer, FencedWrite};
use participant::kv::KvStore;
use participant::record::Record;
use participant::snapshot::Snapshot as PartSnapshot;
use participant::{Command, Engine, EngineConfig, Event, Reply};
use protocol::lease::FenceClaim;

/// A deliberate break of the runtimes' ordering, to show the checks catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencingMutation {
    None,
    /// The coordinator answers a grant before its record is durable.
    GrantBeforeDurable,
    /// The participant answers a fenced write before its record is durable.
    WriteAnswerBeforeDurable,
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
}

const RESOURCE: &str = "orders";
const WORKERS: usize = 3;
const RUN_MS: u64 = 6_000;

#[derive(Debug, Clone)]
enum Payload {
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
}

#[derive(Debug, Default)]
struct Worker {
    token: Option<u64>,
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
    /// Durable fenced writes in log order, for all time: (token, op id).
    history: Vec<(u64, String)>,
    first_answers: BTreeMap<String, FencedAnswer>,
    granted: BTreeMap<u64, usize>,
    stats: FencingStats,
}

fn config() -> EngineConfig {
    EngineConfig::default()
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

    /// The coordinator answers (the moment a holder may hear it): a token is never answered
    /// to two holders, and a new token is higher than every one answered before.
    fn answer_lease(&mut self, answer: Payload) -> Result<(), String> {
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

    fn fenced_request(&mut self, worker: usize, write: FencedWrite) -> Result<(), String> {
        let op_id = write.op_id.clone();
        let commands = self.part.step(Event::FencedWrite {
            write,
            now_ms: self.now,
        });
        let mut logged = false;
        for command in commands {
            match command {
                Command::Log { record, forced } => {
                    logged |= forced;
                    self.part_log.pending.push(record);
                }
                Command::Reply(Reply::Fenced(answer)) => {
                    let early = self.mutation == FencingMutation::WriteAnswerBeforeDurable
                        && matches!(answer, FencedAnswer::Applied { .. });
                    let reply = Payload::Written {
                        worker,
                        op_id: op_id.clone(),
                        answer,
                    };
                    if logged && !early {
                        self.part_waiting.push(reply);
                    } else {
                        self.send(reply);
                    }
                }
                Command::Reply(other) => return Err(format!("fenced write {op_id}: {other:?}")),
                Command::Deliver { .. } | Command::AskDecision { .. } => {}
            }
        }
        Ok(())
    }
}

impl World {
    fn new(seed: u64, mutation: FencingMutation) -> World {
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
            part: Engine::new(config(), KvStore::new()),
            part_log: Log::new(),
            part_snapshot: None,
            part_waiting: Vec::new(),
            workers: (0..WORKERS).map(|_| Worker::default()).collect(),
            history: Vec::new(),
            first_answers: BTreeMap::new(),
            granted: BTreeMap::new(),
            stats: FencingStats::default(),
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
            if let Record::FencedWrite { op_id, token, .. } = record {
                self.history.push((*token, op_id.clone()));
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
        let mut engine = match &self.part_snapshot {
            Some(snapshot) => {
                Engine::restore(config(), snapshot.clone()).map_err(|e| e.to_string())?
            }
            None => Engine::new(config(), KvStore::new()),
        };
        for record in self.part_log.durable.clone() {
            engine.replay(record).map_err(|e| e.to_string())?;
        }
        self.part = engine;
        self.stats.crashes += 1;
        Ok(())
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
                        w.believed_until = w.asked_at + lease.ttl_ms;
                    }
                    LeaseReply::Lost { .. } => w.token = None,
                    LeaseReply::Held { .. } | LeaseReply::Released(_) => {}
                }
            }
            Payload::Write { worker, write } => self.fenced_request(worker, write)?,
            Payload::Written {
                worker,
                op_id,
                answer,
            } => {
                self.workers[worker].unanswered.remove(&op_id);
                match self.first_answers.get(&op_id) {
                    None => {
                        match &answer {
                            FencedAnswer::Applied { .. } => self.stats.applied += 1,
                            FencedAnswer::Stale(_) => self.stats.stale += 1,
                        }
                        self.first_answers.insert(op_id, answer);
                    }
                    Some(first) => {
                        self.stats.repeats += 1;
                        // A refusal is remembered in memory (and checkpoints), not logged: after
                        // a crash its repeat is refused again, with the highest of then.
                        let same = match (first, &answer) {
                            (FencedAnswer::Stale(a), FencedAnswer::Stale(b)) => {
                                a.token == b.token && a.resource == b.resource
                            }
                            (a, b) => a == b,
                        };
                        if !same {
                            return Err(format!(
                                "op {op_id} answered {first:?} first, then {answer:?}"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
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
            Some(token) if now >= w.believed_until => {
                w.token = None;
                let _ = token;
            }
            Some(token) if self.rng.bool() => {
                w.waiting_lease = true;
                w.asked_at = now;
                self.send(Payload::Renew { worker: i, token });
            }
            Some(token) => {
                w.writes += 1;
                let write = FencedWrite {
                    op_id: format!("w{i}-{}", w.writes),
                    fence: FenceClaim {
                        resource: RESOURCE.into(),
                        token,
                    },
                    payload: serde_json::json!({"ops": [
                        {"op": "put", "key": "k", "value": format!("w{i}-{}", w.writes)}
                    ]}),
                };
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

    fn check(&self) -> Result<(), String> {
        let mut highest = 0;
        let mut seen = std::collections::BTreeSet::new();
        for (token, op_id) in &self.history {
            if *token < highest {
                return Err(format!(
                    "write {op_id} with token {token} applied after token {highest}"
                ));
            }
            highest = *token;
            if !seen.insert(op_id) {
                return Err(format!("op {op_id} applied twice"));
            }
        }
        // A write answered stale_token is never applied later (by a retry or a late copy).
        for (op_id, answer) in &self.first_answers {
            if matches!(answer, FencedAnswer::Stale(_)) && seen.contains(op_id) {
                return Err(format!(
                    "op {op_id} was answered stale_token and later applied"
                ));
            }
        }
        // Every write acknowledged as applied is in the durable history or still on its way.
        for (op_id, answer) in &self.first_answers {
            if matches!(answer, FencedAnswer::Applied { .. })
                && !seen.contains(op_id)
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
            world
                .deliver(payload)
                .map_err(|e| format!("seed {seed} at {} ms: {e}", world.now))?;
            world
                .check()
                .map_err(|e| format!("seed {seed} at {} ms: {e}", world.now))?;
        }
        if world.rng.bool() {
            world
                .sync_leases()
                .map_err(|e| format!("seed {seed} at {} ms: {e}", world.now))?;
        }
        // Syncs are rare enough that answers, crashes and stale writes fall between them.
        if world.rng.u32(0..6) == 0 {
            world.sync_participant();
            world
                .check()
                .map_err(|e| format!("seed {seed} at {} ms: {e}", world.now))?;
        }
        if world.rng.u32(0..400) == 0 {
            world.crash_leases();
        }
        if world.rng.u32(0..200) == 0 {
            world.crash_participant()?;
            world
                .check()
                .map_err(|e| format!("seed {seed} at {} ms: {e}", world.now))?;
        }
        for i in 0..WORKERS {
            if world.rng.u32(0..4) == 0 {
                world.step_worker(i);
            }
        }
    }
    Ok(world.stats)
}
