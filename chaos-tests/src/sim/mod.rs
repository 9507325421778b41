//! Deterministic simulation of the two engines: one coordinator, three KV participants and the
//! checkout clients, driven by a seeded scheduler in simulated time.
//!
//! **Owns:** the scheduler (one event queue in simulated milliseconds; the clock advances by
//! popping the next event), the network model (drop, duplicate, delay and so reorder every kind
//! of message: prepares, votes, commits/aborts, acks, decision queries and answers, client
//! requests and answers), the node wrappers that model each runtime's contract around the real
//! pure engines (`coordinator::engine::Engine`, `participant::Engine<KvStore>`), the
//! durable-state model of each node's log (forced appends durable after a sync, lazy ones with
//! the next sync; a crash keeps the durable records and maybe a prefix of the rest; restart
//! goes through the engines' own replay/restore), crashes at random times and right after any
//! step, and the invariant checks after every step (atomicity, durability of what clients saw,
//! agreement with the coordinator's durable decisions, no double apply, conservation) plus
//! liveness once the faults heal.
//!
//! **Must never:** open a socket, spawn a thread or task to schedule anything, read the wall
//! clock, or draw a random number that does not come from the run's seeded `fastrand::Rng`:
//! one seed must replay one run exactly, step for step. It also never reaches into the
//! engines' private state: it sees only what their public API and the logged records show.
//!
//! Batched phase messages (issue 28) are in the mix: in a batching run ([`Batching`]) the
//! coordinator's sender carries the prepares (and, apart, the decisions) it has for a participant
//! when it runs as one batch, each item with its own request id and timeout; the participant
//! handles the items in order, each as the lone message, and answers each on its own line once
//! that item's records are durable. The network drops, duplicates and delays whole batches,
//! splits them in two, reorders their items, and breaks a batch's answer stream after a few
//! lines; each line travels (and is lost or delayed) on its own.
//!
//! Test-only [`Mutation`]s break the runtimes' ordering on purpose, to show the checks catch it.
//!
//! **Map**, floor by floor (a file imports only from the floors below it):
//! - this file's run types ([`SimConfig`], [`Mutation`], [`RunStats`], [`Failure`]), `net`
//!   (messages, events, the queue, the network's faults) and `disk` (a node's log as its disk
//!   keeps it);
//! - `io` (what one node step may do: send, arm timers, take notes for the trace), and
//!   `phase_items` (a phase message alone or as a batch's item, with where its answer goes);
//! - `coordinator_node` and `participant_node`, the runtimes' contracts around the real
//!   engines (`coordinator_node/` has a file per role), then `forger` (what an adversary
//!   without the peer token can send);
//! - `world`: one run's state and what its seed draws before the first step;
//! - `invariants`, `operator` and `trace`, each acting on the world: the checks, the operator
//!   who resolves what the coordinator cannot, the step trace;
//! - `scheduler`: the event loop over all of them;
//! - [`run`]: one seed run to its end ([`run::run_seed`]) and a run's [`run::fingerprint`], on
//!   top of everything above.
//!
//! Beside it, worlds of their own, each a folder with its state in `mod.rs` and the files that
//! act on it beside: `saga_world` (sagas under faults and clock steps), `saga_reuse` (saga ids
//! reused by other coordinators) and `fencing` (leases and fenced writes), whose adversaries
//! are `fencing_adversary`.

mod coordinator_node;
mod disk;
pub mod fencing;
pub mod fencing_adversary;
mod forger;
pub mod ha;
mod invariants;
mod io;
mod net;
mod operator;
mod participant_node;
mod phase_items;
pub mod run;
mod saga_reuse;
mod saga_world;
mod scheduler;
mod trace;
mod world;

use std::fmt;

pub use disk::Disk;
pub use saga_reuse::{SagaReuseConfig, SagaReuseMutation, SagaReuseStats, run_saga_reuse_seed};
pub use saga_world::{SagaMutation, SagaRunStats, SagaSimConfig, run_saga_seed};

/// A deliberate bug in the modelled runtimes, to prove the simulator catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The real contract.
    None,
    /// The coordinator answers the client and sends phase two before its decision is durable.
    PhaseTwoBeforeDurable,
    /// A participant votes yes before its Prepared record is durable.
    VoteBeforePreparedDurable,
    /// The coordinator counts a prepare that timed out as a yes.
    TimeoutCountsAsYes,
    /// The coordinator answers `abort` where its log cannot prove it (`unknown`): the old
    /// presumed abort for any id with no record, which a restored backup turns into a split.
    AbortWhenUnknown,
    /// The operator resolves attempts in doubt without the judge: whatever it guessed, even
    /// against a participant that already ended the attempt the other way.
    ResolveWithoutEvidence,
    /// Participants take any epoch, however far above the highest they hold: a forged
    /// message (`forger`) fences the coordinator out or commits what it aborted.
    NoEpochBound,
    /// The old rule of issue 24: a decision query naming a run this log does not hold stops
    /// new work (for good), on a hostile peer's say-so.
    BehindFromQuery,
    /// The old resolve of issue 24: an operator's claim is not checked against the attempt's
    /// own identity (a gtid of another id, one not given out yet), and the answer a
    /// resolution gives outranks the outcome index.
    UncheckedClaim,
    /// The old restore of issue 24: a run fenced out by participants that hold its epoch
    /// under another run never raises it, so its answers and resolutions are ignored there
    /// until someone restarts it.
    NoEpochRaise,
    /// Issue 28: the coordinator pairs the k-th answer line of a batch it receives with the
    /// k-th item it sent, instead of by the line's `index` checked against its gtid. Lines come
    /// in the order answers became ready (a prepare that waits for a lock answers after the
    /// items behind it), so a yes is credited to another attempt.
    BatchAnswerByPosition,
}

/// Whether the coordinator batches its phase messages in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// Every prepare and decision is a message of its own (a participant without batching).
    PerMessage,
    /// Prepares and decisions travel in batches (the epoch probe stays a lone message).
    Batched,
    /// The seed draws one of the two: half the runs batch.
    Seeded,
}

impl Batching {
    /// `TWOPC_SIM_BATCHING=on|off|seeded`, for soaks of one path; `None` when unset.
    pub fn from_env() -> Option<Batching> {
        match std::env::var("TWOPC_SIM_BATCHING").ok()?.trim() {
            "on" => Some(Batching::Batched),
            "off" => Some(Batching::PerMessage),
            "seeded" => Some(Batching::Seeded),
            _ => None,
        }
    }
}

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// Client transactions (checkout orders) per run.
    pub orders: usize,
    /// Faults (network, crashes) happen in `0..fault_window_ms`; then they stop.
    pub fault_window_ms: u64,
    /// After the faults stop, everything must be resolved within this much simulated time.
    pub quiesce_bound_ms: u64,
    /// Whether to inject faults at all (a fault-free run must commit what it can).
    pub faults: bool,
    pub mutation: Mutation,
    pub batching: Batching,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            orders: 6,
            fault_window_ms: 2_000,
            quiesce_bound_ms: 60_000,
            faults: true,
            mutation: Mutation::None,
            batching: Batching::Seeded,
        }
    }
}

/// What one run did (for the summary line and sanity checks that the faults really happen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    pub steps: u64,
    pub sim_ms: u64,
    pub messages: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub crashes: u64,
    pub committed: u64,
    pub aborted: u64,
    /// Attempts begun.
    pub attempts: u64,
    /// Attempts of an order that already had one: a retry that met a forgotten outcome.
    pub reattempts: u64,
    /// Coordinator disks put back from an operator's copy.
    pub restores: u64,
    /// Attempts a participant still holds in doubt at the end because the coordinator's log
    /// cannot prove their outcome (correct; an operator resolves them).
    pub undecidable: u64,
    /// Prepares that queued for a lock at a participant, and those later granted (a yes).
    pub lock_waits: u64,
    pub lock_grants: u64,
    /// Attempts in doubt an operator resolved from the evidence.
    pub resolved: u64,
    /// Messages an adversary without the peer token forged (`forger`).
    pub forged: u64,
    /// 1 for a run whose coordinator batched (summed over runs: how many did).
    pub batched_runs: u64,
    /// Batch messages sent (prepares and decisions), and the items they carried.
    pub batches: u64,
    pub batch_items: u64,
    /// Batches the network split in two, and batches whose items it reordered.
    pub batch_splits: u64,
    pub batch_reorders: u64,
    /// Answer lines lost because their batch's connection broke (the lines answering forged
    /// batches included, in runs that do not batch too).
    pub lines_cut: u64,
    /// Answer lines an adversary forged, and lines the coordinator refused to credit because
    /// the gtid they name is not the item's at their index.
    pub forged_lines: u64,
    pub lines_refused: u64,
}

/// A run that broke an invariant: everything needed to understand and replay it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub mutation: Mutation,
    pub batching: Batching,
    pub orders: usize,
    pub invariant: String,
    pub detail: String,
    pub step: u64,
    pub now_ms: u64,
    /// The last steps before the failure, oldest first.
    pub trace: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "simulation seed {} (mutation {:?}) broke invariant `{}` at step {} (t={}ms):",
            self.seed, self.mutation, self.invariant, self.step, self.now_ms
        )?;
        writeln!(f, "  {}", self.detail.replace('\n', "\n  "))?;
        writeln!(f, "last {} steps:", self.trace.len())?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        let orders = if self.orders == SimConfig::default().orders {
            String::new()
        } else {
            format!("TWOPC_SIM_ORDERS={} ", self.orders)
        };
        match self.mutation {
            Mutation::None if self.batching == SimConfig::default().batching => write!(
                f,
                "replay this seed with: TWOPC_SIM_SEED={} {orders}cargo test -p twopc-chaos-tests \
                 --test simulation every_invariant_holds_on_shard_0",
                self.seed
            ),
            mutation => write!(
                f,
                "replay: chaos_tests::sim::run::run_seed({}, SimConfig {{ mutation: Mutation::{mutation:?}, \
                 batching: Batching::{:?}, orders: {}, ..SimConfig::default() }})",
                self.seed, self.batching, self.orders
            ),
        }
    }
}
