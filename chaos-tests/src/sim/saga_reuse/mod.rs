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
//! This file holds the lives, the participants and the network; on it stand `shell` (each
//! life's coordinator shell), `deliver` (what each message does where it arrives), `faults`,
//! `invariants` (the checks once the run is over) and `run` (one seed).
//!
//! Must never: read the clock, spawn anything, or draw randomness outside the seeded rng.

mod deliver;
mod faults;
mod invariants;
mod run;
mod shell;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use coordinator::records::LogRecord;
use coordinator::saga::engine::{SagaConfig, SagaEngine, SagaEvent};
use participant::kv::KvStore;
use participant::record::Record;
use participant::{Engine, EngineConfig};
use protocol::saga::{OpKind, OpQuery, SagaOpRequest, SagaRequest, SagaResponse};
use protocol::{CoordinatorId, ErrorBody, ErrorCode, TxId};

use cluster::checkout::{INVENTORY, PAYMENTS, SHIPPING};
use cluster::saga_checkout::Fate;

pub use run::run_saga_reuse_seed;

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

fn part_index(name: &str) -> usize {
    NAMES.iter().position(|n| *n == name).unwrap_or(0)
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
}
