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
//! - (the outbox) a worker's write records its next intent with it: an intent exists exactly
//!   for each worker write the participant holds, across crashes that keep any prefix of the
//!   unsynced records, and each worker's aggregate has seqs 1, 2, 3... in write order;
//! - a token is never granted to two holders, and a new grant's token is higher than every
//!   token granted before it (across crashes and restarts).
//!
//! This file holds the world's state and its network; on it stand the two services as their
//! runtimes run them (`lease_service`, `participant_service`), `deliver` (what each message
//! does where it arrives), `actors` (workers, forger, operator), `oracle` (the invariants)
//! and `run` (one seed, tick by tick).
//!
//! Like the rest of `sim`, it never opens a socket, reads a clock or draws a number that does
//! not come from the seeded generator: one seed replays one run.

mod actors;
mod deliver;
mod lease_service;
mod oracle;
mod participant_service;
mod run;

use std::collections::BTreeMap;

use coordinator::leases::{LeaseEngine, LeaseRecord, LeaseReply, LeaseSnapshot};
use participant::fence::table::FenceRetention;
use participant::fence::{FencePolicy, FenceResetRequest, FencedAnswer, FencedWrite};
use participant::kv::KvStore;
use participant::record::Record;
use participant::snapshot::Snapshot as PartSnapshot;
use participant::{Engine, EngineConfig, Rejection};
use protocol::fence_proof::FenceKeys;

use super::fencing_adversary::Forged;

pub use run::run_fencing_seed;

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
    /// `intents`: the event ids the write recorded (a worker's: one; a forger's: none).
    Write {
        token: u64,
        op_id: String,
        at: u64,
        intents: Vec<String>,
    },
    Reset {
        to: u64,
    },
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
}
