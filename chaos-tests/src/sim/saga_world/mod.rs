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
//! This file holds the world's state, its network and its disk timing; on it stand `shell`
//! (the coordinator's shell), `deliver` (what each message does where it arrives), `faults`
//! (what the run throws in), the two oracles kept while it runs (`deadlines`, `fences`), and
//! `run` (one seed, and the invariants at the end). `clock` (the wall clock) stands apart.
//!
//! Must never: read the clock, spawn anything, or draw randomness outside the seeded rng.

mod clock;
mod deadlines;
mod deliver;
mod faults;
mod fences;
mod run;
mod shell;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use coordinator::records::LogRecord;
use coordinator::saga::engine::{
    ProbeAnswer, SagaCommand, SagaConfig, SagaEngine, SagaEvent, SagaWait,
};
use participant::kv::KvStore;
use participant::record::Record;
use participant::{Engine, EngineConfig};
use protocol::saga::{OpKind, SagaOpAnswer, SagaOpRequest, SagaRequest, SagaResponse};
use protocol::{CoordinatorId, TxId};

use cluster::checkout::{INVENTORY, PAYMENTS, SHIPPING};
use cluster::saga_checkout::Fate;

use clock::WallClock;

pub use run::run_saga_seed;

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
}
