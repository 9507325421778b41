//! The tokio shell around the engine: it feeds events in, executes the commands that come out
//! (log appends, HTTP sends, timers, client replies), and feeds the results back as events.
//!
//! Ordering rules kept here: appends are submitted to the log while the engine lock is held,
//! so the log's order is the engine's order; a decision is acted on only after its forced
//! append resolved (the `DecisionDurable` event), so nobody hears an outcome that a crash
//! could undo.
//!
//! The map: this module holds `Core` (the engine, the log, the participants) and its small
//! accessors; `transactions` (a client's submit, status and listing), `decision_query` (what a
//! participant in doubt is told), `commands` (executing what the engine returns) and `sends`
//! (prepares and phase-two messages) and `batches` (many in one request) carry the two-phase
//! commit, with `durable` (one task waiting on the decisions' forced appends) and `deadlines`
//! (one timer task for every prepare deadline); `start` (recovery),
//! `housekeeping`, `fencing`, `operator` and `saga_operator` (audited actions), `sagas`,
//! `leases` and `cluster` stand beside them, all on `participants` (the HTTP calls).

mod archiver;
mod batches;
mod cluster;
mod commands;
mod deadlines;
mod decision_query;
mod durable;
mod fencing;
mod housekeeping;
mod leases;
mod operator;
pub mod participants;
mod saga_operator;
mod sagas;
mod sends;
mod start;
mod transactions;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_batches;
#[cfg(test)]
mod tests_start;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use protocol::{ParticipantName, TxId};
use wal::Wal;

use crate::config::Config;
use crate::engine::view::Gauges;
use crate::engine::{Engine, Reply, WaitFor, WaiterId};
use crate::http_client::Endpoint;
use crate::metrics::Metrics;
use crate::outcomes::OutcomeStore;
use crate::records::{EpochRecord, Retained};

pub use fencing::PROBE_TXID;
pub use housekeeping::housekeeping;
pub use operator::{OperatorError, RetryTarget, check_operator};
pub use sagas::{SagaOutcome, SagaShell, op_outcome, probe_answer};
pub use start::{GroupStart, StartError, recover, recover_on, recover_with};

pub use crate::clock::now_ms;

/// The running coordinator after recovery: the engine, the log and the means to act.
#[derive(Debug)]
pub struct Core {
    engine: Mutex<Engine>,
    waiters: Mutex<HashMap<WaiterId, oneshot::Sender<Reply>>>,
    next_waiter: AtomicU64,
    wal: Wal,
    /// This run as it started; its epoch may rise since (`epoch`, `runtime::fencing`).
    identity: EpochRecord,
    /// The epoch every message carries now: `identity.epoch`, or a raise of it once durable.
    epoch: AtomicU64,
    /// Shared, so a task that outlives no core (the epoch probe) can hold its peer alone.
    participants: BTreeMap<ParticipantName, Arc<Endpoint>>,
    config: Config,
    metrics: Arc<Metrics>,
    /// Set while recovery issues its resends (for the `coordinator::during_recovery` point).
    recovering: AtomicBool,
    /// Mirrors `Engine::behind` so the hot path checks a flag, not the engine lock. Once set
    /// (by evidence from participants, or from the log at start) only an operator's audited
    /// clear lifts it: new work is refused; decisions already in the log are still delivered
    /// and answered.
    behind: AtomicBool,
    /// Mirrors the engine's count of live transactions after every step, so a phase message
    /// can tell without the engine lock whether it has company to be batched with (`batches`).
    live_transactions: std::sync::atomic::AtomicUsize,
    /// Ended outcomes for the whole retention window (the engine stages only the archiver's
    /// lag).
    pub(crate) outcomes: Arc<OutcomeStore>,
    /// To the archiver task: outcomes the engine staged (`Command::Archive`).
    archive: tokio::sync::mpsc::UnboundedSender<Retained>,
    /// Mirrors `Engine::archive_generation`, stored under the engine lock when `Archived` is
    /// stepped, so `submit` reads it before its index lookup without taking the lock.
    archive_generation: AtomicU64,
    /// Operator actions run one at a time (see `operator`).
    operator_lock: tokio::sync::Mutex<()>,
    /// The saga table (issue 13), run by `sagas.rs`.
    sagas: SagaShell,
    /// The lease service (`runtime::leases`); its records share this log.
    leases: crate::leases::Leases,
    /// In a coordinator group (`ha`): the leader's replication, for the outcome index.
    pub(crate) group: Option<crate::ha::mirror::GroupMirror>,
    /// Each participant's queue of phase messages waiting to go in one batch (`batches`).
    lanes: batches::Lanes,
    /// Every armed prepare deadline, kept by one timer task (`deadlines`).
    deadlines: Arc<deadlines::Deadlines>,
    /// To the task that waits on decision records' forced appends (`durable`).
    decisions: tokio::sync::mpsc::UnboundedSender<durable::PendingDecision>,
}

/// A new transaction, checked by the API.
#[derive(Debug)]
pub struct NewTransaction {
    pub txid: TxId,
    pub digest: crate::digest::Digest,
    pub participants: Vec<(ParticipantName, serde_json::Value)>,
    pub timeout_ms: u64,
    pub wait: WaitFor,
    /// The client's name from its token, recorded on the attempt.
    pub client: Option<String>,
}

impl Core {
    fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        // The engine is only mutated inside `step`, which does not panic on any input; if a
        // panic happened anyway, the table is still the best record we have.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This run, at the epoch its messages carry now.
    pub fn identity(&self) -> EpochRecord {
        EpochRecord {
            epoch: self.epoch(),
            ..self.identity.clone()
        }
    }

    /// The epoch messages carry now.
    pub fn epoch(&self) -> protocol::Epoch {
        protocol::Epoch(self.epoch.load(Ordering::Acquire))
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Blocking: writes everything submitted, then closes the log (shutdown).
    pub fn close_log(&self) {
        self.wal.close();
    }

    pub fn is_poisoned(&self) -> bool {
        self.wal.is_poisoned()
    }

    pub fn knows_participant(&self, name: &ParticipantName) -> bool {
        self.participants.contains_key(name)
    }

    /// Why this coordinator takes no new work, if it learned that its log is behind.
    pub fn log_behind(&self) -> Option<String> {
        if !self.behind.load(Ordering::Relaxed) {
            return None;
        }
        self.lock_engine().behind().map(|b| b.evidence.clone())
    }

    /// Whether callers of the decision route proved they are peers (a peer token is
    /// configured, so the route refuses everyone else).
    pub fn peers_authenticate(&self) -> bool {
        // With authentication on, the decision route takes the peer token only.
        self.config.keys.current().enabled()
    }

    /// Every configured participant's load here (zero when it holds nothing).
    pub fn participant_loads(&self) -> Vec<crate::metrics::ParticipantLoad> {
        let engine = self.lock_engine();
        self.participants
            .keys()
            .map(|name| {
                let load = engine.load(name);
                crate::metrics::ParticipantLoad {
                    name: name.to_string(),
                    live: load.live,
                    pending_acks: load.pending_acks,
                }
            })
            .collect()
    }

    pub fn gauges(&self) -> Gauges {
        self.lock_engine().gauges()
    }

    /// The log's counters (records, fsyncs, batches, bytes), for metrics and the benchmark.
    pub fn wal_stats(&self) -> wal::WalStats {
        self.wal.stats()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn log_bytes(&self) -> u64 {
        self.wal.stats().log_bytes_on_disk
    }

    fn lock_waiters(&self) -> MutexGuard<'_, HashMap<WaiterId, oneshot::Sender<Reply>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}
