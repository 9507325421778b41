//! The coordinator's runtime, modelled: it feeds events to the real pure engine
//! (`coordinator::engine::Engine`) and executes its commands against the simulated disk,
//! network and timers with the real runtime's contract: appends in command order; a decision
//! acted on (client answer, phase two) only after its forced append is durable; a prepare or a
//! delivery that gets no answer within its timeout counts as `Timeout` / a failed delivery.
//! Restart rebuilds the engine through `Engine::replay` from what the disk kept, logs the next
//! epoch (forced) with a fresh incarnation and steps `RecoveryDone`, as `runtime::recover_on`
//! does, then sends every participant the epoch probe (`Core::probe_epochs`). Decision queries
//! are answered from `Engine::decision_for`, with the outcome index outranking any answer not
//! from the engine's own record, as `Core::decision_query` does; every answer is checked
//! against the log and the index (`answer_violation`). A query is a claim: one naming an
//! unknown run is counted, nothing more. A participant's `stale_epoch` /
//! `incarnation_conflict` refusal of a message this run sent is stepped as `Event::Fenced`:
//! the behind mark (forced, not awaited) and a raise of this run's epoch (forced; messages
//! carry it once durable, `Event::EpochDurable`), as `Core::fenced` does. An operator may stop
//! it, copy its disk, and later put the copy back (`backup`, `restore`).
//!
//! The outcome index is modelled too: `Command::Archive` outcomes wait in an unsynced batch
//! that the next disk sync commits to a durable map (a crash loses the batch, never the map),
//! then `Event::Archived` is stepped, as the archiver does. A backup copies the map with the
//! log and a restore puts both back. Its disk budget is `index_max` outcomes (the oldest go
//! first), tiny in some runs so that ids are forgotten and reused. Submits look the id up in
//! the map first, as `Core::submit` does.
//!
//! This file holds the node's state and its plumbing to the simulated disk and timers; each
//! role is a file of its own: `shell` (executing the engine's commands under the runtime's
//! contract), `batcher` (phase messages carried in batches, and their answer lines paired
//! back to the items), `inbox` (what reaches the node), `lifecycle` (start, crash, stop, backup and
//! restore, syncs), `outcomes` (the outcome index and the answers checked against it),
//! `epochs` (the fence from this run's side) and `operator_actions` (audited resolutions).

mod batcher;
mod epochs;
mod inbox;
mod lifecycle;
mod operator_actions;
mod outcomes;
mod shell;

use std::collections::{BTreeMap, BTreeSet};

use coordinator::digest::Digest;
use coordinator::engine::{Engine, EngineConfig, WaitFor, WaiterId};
use coordinator::records::{EpochRecord, LogRecord, Retained, Snapshot};
use protocol::{Decision, Epoch, GlobalTxId, ParticipantName, TxId};

use protocol::operator::AuditEntry;

use super::disk::Disk;
use super::io::Io;
use super::net::{Ev, Incarnation, Node, RequestId, Timer};

pub use batcher::BatchTerms;

/// The simulated coordinator's id (what its first start writes).
pub const COORDINATOR_ID: &str = "c-sim";

/// The client id the epoch probe is sent under (`runtime::PROBE_TXID`).
const PROBE_TXID: &str = "twopc-epoch-probe";

/// How long the probe waits before asking an unanswering participant again.
const PROBE_RETRY_MS: u64 = 500;

/// An HTTP call the coordinator is waiting on, with the epoch it carried.
#[derive(Debug, Clone)]
enum Call {
    Prepare(TxId, ParticipantName, Epoch),
    Deliver(TxId, ParticipantName, Epoch),
    Probe(usize, Epoch),
}

#[derive(Debug)]
pub struct CoordinatorNode {
    pub config: EngineConfig,
    pub delivery_timeout_ms: u64,
    pub participants: Vec<ParticipantName>,
    pub disk: Disk<LogRecord, Snapshot>,
    pub incarnation: Incarnation,
    /// `None` while crashed.
    pub engine: Option<Engine>,
    identity: Option<EpochRecord>,
    calls: BTreeMap<RequestId, Call>,
    waiters: BTreeMap<WaiterId, (usize, u32)>,
    next_waiter: WaiterId,
    /// Forced decision appends waiting for a sync: (sequence number, txid).
    decision_waits: Vec<(u64, TxId)>,
    /// A forced audit append (an operator's resolution) waiting for a sync.
    audit_waits: Vec<(u64, AuditEntry)>,
    /// A forced raise of this run's epoch waiting for a sync.
    epoch_waits: Vec<(u64, EpochRecord)>,
    sync_scheduled: bool,
    /// The operator's copy of the disk, taken while stopped.
    backup: Option<Disk<LogRecord, Snapshot>>,
    /// Ground truth for the checks, kept across crashes and restores (they are facts about
    /// the world, not about the disk): every decision that ever became durable, per attempt,
    /// and any decision that flipped; every attempt ever begun, with its client id and digest.
    pub durable_decisions: BTreeMap<GlobalTxId, Decision>,
    /// Commit decisions that became durable since the world last checked them.
    pub commits_to_check: Vec<GlobalTxId>,
    pub attempts: BTreeMap<GlobalTxId, (TxId, Digest)>,
    pub flipped: Option<String>,
    /// Operator resolutions that became durable, for the world to settle against the ground
    /// truth (`World::settle_resolutions`).
    pub resolutions: Vec<(GlobalTxId, TxId, Decision)>,
    /// Coordinator crashes and restores so far: attempts in doubt for ever are only acceptable
    /// after a restore.
    pub crashes: u64,
    pub restores: u64,
    /// The outcome index: durable, survives crashes; at most `index_max` outcomes.
    pub index: BTreeMap<TxId, Retained>,
    pub index_max: usize,
    /// Archive outcomes not yet committed to the index (lost in a crash).
    archive_batch: Vec<Retained>,
    backup_index: Option<BTreeMap<TxId, Retained>>,
    /// Every outcome the engine staged and that was not superseded or evicted since: each must
    /// be live or staged in the engine, or durable in the index, at every step.
    must_hold: BTreeMap<TxId, GlobalTxId>,
    /// The first broken promise about ended outcomes (staging or idempotency), if any.
    pub outcome_violation: Option<String>,
    /// The first decision answer that contradicted the log or the index, if any.
    pub answer_violation: Option<String>,
    /// Decision queries that named a run this log does not hold (counted, never believed).
    pub unknown_run_queries: u64,
    /// Raises of the epoch that became durable, over all runs.
    pub raises: u64,
    /// `Mutation::BehindFromQuery`: new work stopped on a query's say-so.
    stopped_by_query: bool,
    /// `Some` in a batching run: phase messages wait in `outbox` for the sender.
    pub batching: Option<BatchTerms>,
    outbox: BTreeMap<usize, batcher::Outbox>,
    /// Lanes whose flush timer is armed.
    flush_armed: BTreeSet<usize>,
    sent_batches: BTreeMap<RequestId, batcher::SentBatch>,
    /// Answer lines refused because they named another attempt than their item's.
    pub lines_refused: u64,
}

impl CoordinatorNode {
    pub fn new(config: EngineConfig, participants: Vec<ParticipantName>) -> Self {
        Self {
            config,
            delivery_timeout_ms: 400,
            participants,
            disk: Disk::new(),
            incarnation: 0,
            engine: None,
            identity: None,
            calls: BTreeMap::new(),
            waiters: BTreeMap::new(),
            next_waiter: 1,
            decision_waits: Vec::new(),
            audit_waits: Vec::new(),
            epoch_waits: Vec::new(),
            sync_scheduled: false,
            backup: None,
            durable_decisions: BTreeMap::new(),
            commits_to_check: Vec::new(),
            attempts: BTreeMap::new(),
            flipped: None,
            resolutions: Vec::new(),
            crashes: 0,
            restores: 0,
            index: BTreeMap::new(),
            index_max: usize::MAX,
            archive_batch: Vec::new(),
            backup_index: None,
            must_hold: BTreeMap::new(),
            outcome_violation: None,
            answer_violation: None,
            unknown_run_queries: 0,
            raises: 0,
            stopped_by_query: false,
            batching: None,
            outbox: BTreeMap::new(),
            flush_armed: BTreeSet::new(),
            sent_batches: BTreeMap::new(),
            lines_refused: 0,
        }
    }

    pub fn is_up(&self) -> bool {
        self.engine.is_some()
    }

    fn node() -> Node {
        Node::Coordinator
    }

    fn part_index(&self, name: &ParticipantName) -> usize {
        self.participants
            .iter()
            .position(|p| p == name)
            .unwrap_or(usize::MAX)
    }

    fn timer_after(&self, io: &mut Io, after_ms: u64, timer: Timer) {
        io.after(
            after_ms,
            Ev::Timer {
                node: Self::node(),
                incarnation: self.incarnation,
                timer,
            },
        );
    }

    fn schedule_sync(&mut self, io: &mut Io) {
        if !self.sync_scheduled {
            self.sync_scheduled = true;
            let delay = io.rng.u64(0..=io.sync_max_ms);
            io.after(
                delay,
                Ev::DiskSync {
                    node: Self::node(),
                    incarnation: self.incarnation,
                },
            );
        }
    }
}

/// A client transaction as the coordinator's API hands it to the engine.
#[derive(Debug, Clone)]
pub struct SubmitTx {
    pub txid: TxId,
    pub digest: Digest,
    pub participants: Vec<(ParticipantName, serde_json::Value)>,
    pub timeout_ms: u64,
    pub wait: WaitFor,
}
