//! The pure two-phase-commit engine: `step(event) -> Vec<Command>`.
//!
//! No I/O, clock or randomness in here: the runtime feeds events (with the time and random
//! numbers they need) and executes the commands in order. The rules it enforces:
//! - commit only if every participant voted yes; a missing, late, malformed, timed-out or no
//!   vote means abort; duplicate and late votes change nothing;
//! - the decision is logged (and must be durable) before anyone hears it;
//! - phase two is retried until every participant acknowledged, never given up.
//!
//! This module holds the table and dispatches events; each kind of event is handled where its
//! idea lives: `admission` (a submit), `phases` (votes, the decision, acknowledgements, the
//! end), `delivery` (phase two's retries), `epoch` (fencing and raises), `replay` (recovery),
//! `operator` (audited actions), with `rules`, `tx`, `io`, `load` and `view` below them.

mod admission;
mod backoff;
mod delivery;
mod epoch;
mod io;
pub mod judge;
mod load;
mod operator;
mod phases;
mod replay;
mod retained;
mod rules;
mod tx;
pub mod view;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_admission;
#[cfg(test)]
mod tests_attempts;
#[cfg(test)]
mod tests_epoch;
#[cfg(test)]
mod tests_staging;

use std::collections::BTreeMap;

use protocol::{Incarnation, ParticipantName, TxId};

pub use backoff::retry_delay_ms;
pub use epoch::{EPOCH_RAISE_MAX, EPOCH_RAISES_MAX, EpochState, Fenced};
pub use io::{Command, Event, Reply, WaitFor, WaiterId};
pub use load::{Bounds, Load};
pub use operator::{AUDIT_KEPT, OperatorSnapshot};
pub use replay::Replayed;
pub use tx::{Decided, Delivery, Phase};
pub use view::{AnswerSource, DecisionAnswer, Owner};

use crate::records::{Attempt, BehindRecord, EpochRecord, RunSpan};
use load::Loads;
use operator::OperatorState;
use retained::RetainedSet;
use tx::Tx;

/// The engine's tunables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// First phase-two retry delay; doubles per failure.
    pub retry_base_ms: u64,
    /// Cap on the phase-two retry delay.
    pub retry_max_ms: u64,
    /// Most ended outcomes staged (ended, not yet durable in the outcome index); beyond it
    /// new attempts are refused (`Reply::Busy`) until the archiver catches up.
    pub retained_max: usize,
    /// Admission control: past these, new transactions naming that participant are refused
    /// (`Reply::Overloaded`), and a retry past the waiters bound too.
    pub bounds: Bounds,
}

/// Every transaction the coordinator knows: live ones, and ended ones not yet durable in the
/// outcome index (staging; the index, outside the engine, holds the rest of the retention
/// window); and every run (incarnation) its log holds, with how far it holds each.
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
    live: BTreeMap<TxId, Tx>,
    retained: RetainedSet,
    /// This run's identity: `None` between replay and `RecoveryDone`, when nothing is begun.
    identity: Option<EpochRecord>,
    /// The position the next attempt of this run gets (1, 2, ...).
    next_position: u64,
    runs: BTreeMap<Incarnation, RunSpan>,
    /// Proof that this log is behind what participants saw, once learned (durable).
    behind: Option<BehindRecord>,
    /// Raises of this run's epoch past a run that claimed it (`epoch`).
    epoch: EpochState,
    /// What each participant holds in `live`, kept in step with it by `step`.
    loads: Loads,
    /// Counts `Archived` events: a submit whose index lookup predates one must look again.
    archive_generation: u64,
    /// Attempts operators resolved by hand, and the audit trail.
    operator: OperatorState,
    /// Operator actions whose records are submitted and not yet durable (applied to
    /// `operator` only once durable, so nothing shows them before): a checkpoint taken
    /// meanwhile covers their records, so its copy includes them.
    audit_in_flight: Vec<protocol::operator::AuditEntry>,
}

impl Engine {
    /// An engine for a new, empty log whose run is `identity`.
    pub fn new(config: EngineConfig, identity: EpochRecord) -> Engine {
        let mut engine = Engine::empty(config);
        engine.begin_run(identity);
        engine
    }

    fn empty(config: EngineConfig) -> Engine {
        Engine {
            config,
            live: BTreeMap::new(),
            retained: RetainedSet::new(),
            identity: None,
            next_position: 1,
            runs: BTreeMap::new(),
            behind: None,
            epoch: EpochState::default(),
            loads: Loads::default(),
            archive_generation: 0,
            operator: OperatorState::default(),
            audit_in_flight: Vec::new(),
        }
    }

    /// What `participant` holds here now (admission control, metrics).
    pub fn load(&self, participant: &ParticipantName) -> Load {
        self.loads.get(participant)
    }

    /// Whether the incremental loads equal a count from scratch (the property tests' check).
    #[cfg(test)]
    pub(crate) fn loads_mirror_the_table(&self) -> bool {
        let mut fresh = Loads::default();
        fresh.recount(self.live.values());
        fresh == self.loads
    }

    /// Every participant holding anything here, with its load.
    pub fn loads(&self) -> impl Iterator<Item = (&ParticipantName, &Load)> {
        self.loads.iter()
    }

    /// How many `Archived` events this engine applied (see `Event::Submit`).
    pub fn archive_generation(&self) -> u64 {
        self.archive_generation
    }

    /// This run starts: later attempts are numbered from 1 under its incarnation.
    fn begin_run(&mut self, identity: EpochRecord) {
        assert!(
            !self.runs.contains_key(&identity.incarnation),
            "incarnation {} is already in this log: incarnations must never repeat",
            identity.incarnation
        );
        self.note_run(&identity);
        self.identity = Some(identity);
        self.next_position = 1;
    }

    /// A run's epoch record: the log holds that run from here on.
    /// A run's later epoch record (a raise) moves its span's epoch up, never down.
    fn note_run(&mut self, identity: &EpochRecord) {
        let span = self.runs.entry(identity.incarnation).or_insert(RunSpan {
            incarnation: identity.incarnation,
            epoch: identity.epoch,
            reach: 0,
        });
        span.epoch = span.epoch.max(identity.epoch);
    }

    /// The log holds `attempt`, so (positions being given in log order) every earlier attempt
    /// of its run too.
    fn note_attempt(&mut self, attempt: &Attempt) {
        let span = self.runs.entry(attempt.incarnation).or_insert(RunSpan {
            incarnation: attempt.incarnation,
            epoch: protocol::Epoch(0),
            reach: 0,
        });
        span.reach = span.reach.max(attempt.position);
    }

    /// This run's identity, once recovery began it.
    pub fn identity(&self) -> Option<&EpochRecord> {
        self.identity.as_ref()
    }

    /// Applies one event; returns what to do, in order.
    pub fn step(&mut self, event: Event) -> Vec<Command> {
        // Every event changes at most the one transaction it names (recovery changes all):
        // take its load out before and put it back after, so the counts mirror the table.
        let touched = event.txid().cloned();
        if let Some(tx) = touched.as_ref().and_then(|txid| self.live.get(txid)) {
            self.loads.account(tx, false);
        }
        let recovery = matches!(event, Event::RecoveryDone { .. });
        let commands = self.apply(event);
        if recovery {
            self.loads.recount(self.live.values());
        } else if let Some(tx) = touched.as_ref().and_then(|txid| self.live.get(txid)) {
            self.loads.account(tx, true);
        }
        commands
    }

    fn apply(&mut self, event: Event) -> Vec<Command> {
        match event {
            Event::Submit {
                waiter,
                wait,
                txid,
                digest,
                participants,
                timeout_ms,
                now_ms,
                archived,
                archive_generation,
                client,
            } => self.submit(
                waiter,
                wait,
                txid,
                digest,
                participants,
                timeout_ms,
                now_ms,
                (archived, archive_generation),
                client,
            ),
            Event::VoteReceived {
                txid,
                participant,
                vote,
                reason,
                now_ms,
            } => self.vote(&txid, &participant, vote, reason, now_ms),
            Event::PrepareDeadline { txid, now_ms } => self.prepare_deadline(&txid, now_ms),
            Event::DecisionDurable { txid } => self.decision_durable(&txid),
            Event::DecisionFailed { txid, error } => self.decision_failed(&txid, error),
            Event::Acked {
                txid,
                participant,
                now_ms,
            } => self.acked(&txid, &participant, now_ms),
            Event::DeliveryFailed {
                txid,
                participant,
                error,
                jitter,
            } => self.delivery_failed(&txid, &participant, error, jitter),
            Event::RetryDue { txid, participant } => self.retry_due(&txid, &participant),
            Event::RetryNow { txid, participant } => {
                self.retry_now(txid.as_ref(), participant.as_ref())
            }
            Event::RecoveryDone { now_ms, identity } => {
                self.begin_run(identity);
                self.recovery_done(now_ms)
            }
            Event::ExpireRetained {
                now_ms,
                retention_ms,
            } => {
                self.retained.expire(now_ms, retention_ms);
                Vec::new()
            }
            Event::Fenced(fenced) => self.fenced(fenced),
            Event::EpochDurable { identity } => self.epoch_durable(identity),
            Event::Archived { archived } => {
                for (txid, gtid) in &archived {
                    self.retained.remove_archived(txid, gtid);
                }
                self.archive_generation += 1;
                Vec::new()
            }
        }
    }
}
