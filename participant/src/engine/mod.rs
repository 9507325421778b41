//! The participant's protocol logic as a pure state machine: `step(event) -> Vec<Command>`.
//!
//! No I/O, no clock, no randomness: time arrives in events (`now_ms`), jitter arrives as
//! `entropy`, and every effect leaves as a command that the shell executes in order (log appends
//! before the reply that depends on them). A simulation can drive it with no sockets and no disk.
//!
//! The engine owns the resource, the prepared set with its key locks, the tombstones and the
//! highest epoch per coordinator id (with the coordinator run, its incarnation, that claimed
//! it). Attempts are keyed by their global id, never by the client's id. It never decides a transaction's outcome by itself: a
//! prepared transaction leaves the prepared set only through a commit or abort from the
//! coordinator, or through the coordinator's answer to a decision query.

mod decide;
mod fenced;
mod in_doubt;
mod outbox;
#[cfg(test)]
mod outbox_tests;
mod prepare;
mod replay;
pub mod saga;
mod sender;
mod types;
mod vote;
mod waits;

use std::collections::BTreeMap;

use protocol::kv::PreparedEntry;
use protocol::operator::{AttemptState, AttemptStatus};
use protocol::{CoordinatorId, GlobalTxId, Incarnation};

use crate::locks::Locks;
use crate::record::Fence;
use crate::resource::Resource;
use crate::tombstones::{Ended, Tombstones};
use waits::Waits;

pub use crate::rejection::Rejection;
pub use in_doubt::backoff_ms;
pub(crate) use replay::LoggedPrepare;
pub(crate) use sender::Sender;
pub use types::{Command, EngineConfig, Event, PreparedTx, ReplayError, Reply};

/// The participant state machine.
#[derive(Debug)]
pub struct Engine<R: Resource> {
    pub(crate) config: EngineConfig,
    pub(crate) resource: R,
    pub(crate) prepared: BTreeMap<GlobalTxId, PreparedTx<R::Staged>>,
    pub(crate) locks: Locks,
    pub(crate) tombstones: Tombstones,
    pub(crate) epochs: BTreeMap<CoordinatorId, Fence>,
    /// Prepares queued for locks, oldest attempt first (never logged; see `waits`).
    pub(crate) waits: Waits<R::Staged>,
    /// Saga steps seen, with the first answer of each op (see `saga`).
    pub(crate) saga_barrier: crate::saga_barrier::Barrier,
    /// Highest fencing token per fenced resource, and fenced writes' answers by op id.
    pub(crate) fences: crate::fence::Fences,
    /// Intents recorded with writes, and what relays and operators said of them.
    pub(crate) outbox: crate::outbox::Outbox,
}

impl<R: Resource> Engine<R> {
    pub fn new(config: EngineConfig, resource: R) -> Self {
        let tombstones = Tombstones::new(config.tombstone_retention_ms, config.tombstones_max);
        Self {
            config,
            resource,
            prepared: BTreeMap::new(),
            locks: Locks::default(),
            tombstones,
            epochs: BTreeMap::new(),
            waits: Waits::default(),
            saga_barrier: crate::saga_barrier::Barrier::new(),
            fences: crate::fence::Fences::default(),
            outbox: crate::outbox::Outbox::default(),
        }
    }

    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// The fencing tokens accepted and the fenced writes' answers.
    pub fn fences(&self) -> &crate::fence::Fences {
        &self.fences
    }

    /// The outbox: intents recorded with writes.
    pub fn outbox(&self) -> &crate::outbox::Outbox {
        &self.outbox
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn prepared_len(&self) -> usize {
        self.prepared.len()
    }

    /// What this participant holds of one attempt: the evidence an operator resolves from.
    /// Prepared first (a prepared attempt has no tombstone), then how it ended, then whether
    /// retention may have dropped its tombstone.
    pub fn attempt_status(&self, gtid: &GlobalTxId) -> AttemptStatus {
        if let Some(prepared) = self.prepared.get(gtid) {
            return AttemptStatus {
                gtid: gtid.clone(),
                state: AttemptState::Prepared,
                txid: Some(prepared.txid.clone()),
                prepared_at_ms: Some(prepared.prepared_at_ms),
                participants: prepared.participants.clone(),
            };
        }
        let state = match self.tombstones.get(gtid).map(|r| &r.ended) {
            Some(Ended::Committed) => AttemptState::Committed,
            Some(Ended::Aborted) => AttemptState::Aborted,
            Some(Ended::Refused { .. }) => AttemptState::Refused,
            None if self.tombstones.may_have_forgotten(gtid) => AttemptState::Forgotten,
            None => AttemptState::Unknown,
        };
        AttemptStatus {
            gtid: gtid.clone(),
            state,
            txid: None,
            prepared_at_ms: None,
            participants: None,
        }
    }

    /// When the longest-held prepared attempt was prepared: its locks have been held since
    /// (what an in-doubt alert looks at).
    pub fn oldest_prepared_at_ms(&self) -> Option<u64> {
        self.prepared.values().map(|p| p.prepared_at_ms).min()
    }

    pub fn locks_len(&self) -> usize {
        self.locks.len()
    }

    /// Prepares queued for locks now.
    pub fn waiting_len(&self) -> usize {
        self.waits.len()
    }

    /// The attempts queued for locks, oldest first (for operators and tests).
    pub fn waiting_list(&self) -> Vec<GlobalTxId> {
        self.waits
            .by_order
            .keys()
            .map(|(_, gtid)| gtid.clone())
            .collect()
    }

    pub fn tombstones_len(&self) -> usize {
        self.tombstones.len()
    }

    /// The highest epoch seen from `coordinator_id`, with the run that claimed it.
    pub fn highest_epoch(&self, coordinator_id: &CoordinatorId) -> Option<Fence> {
        self.epochs.get(coordinator_id).copied()
    }

    /// The in-doubt attempts, by global id.
    pub fn prepared_list(&self) -> Vec<PreparedEntry> {
        self.prepared
            .iter()
            .map(|(gtid, p)| PreparedEntry {
                txid: p.txid.clone(),
                gtid: gtid.clone(),
                coordinator_id: p.coordinator_id.clone(),
                epoch: p.epoch,
                incarnation: p.incarnation,
                position: p.position,
                last_answer: p.last_answer.clone(),
                keys: p.keys.clone(),
                prepared_at_ms: p.prepared_at_ms,
            })
            .collect()
    }

    /// Feeds one event; returns what to do.
    pub fn step(&mut self, event: Event) -> Vec<Command> {
        let now_ms = event.now_ms();
        let mut commands = self.step_event(event);
        // Every step may release locks or pass a waiter's deadline; answering queued
        // prepares here (after this request's own commands) keeps deadlines accurate to the
        // step rate, and the shell ticks often while anyone waits.
        self.settle_waits(now_ms, &mut commands);
        commands
    }

    fn step_event(&mut self, event: Event) -> Vec<Command> {
        match event {
            Event::Prepare {
                request,
                now_ms,
                waiter,
            } => {
                self.tombstones.prune(now_ms);
                self.prepare(request, now_ms, waiter)
            }
            Event::Commit { request, now_ms } => {
                self.tombstones.prune(now_ms);
                self.commit(request, now_ms)
            }
            Event::Abort { request, now_ms } => {
                self.tombstones.prune(now_ms);
                self.abort(request, now_ms)
            }
            Event::Tick { now_ms } => {
                self.tombstones.prune(now_ms);
                self.prune_fences(now_ms);
                self.outbox.prune(now_ms, &self.config.outbox_retention);
                self.tick(now_ms)
            }
            Event::DecisionAnswer {
                gtid,
                answer,
                now_ms,
                entropy,
            } => self.decision_answer(gtid, answer, now_ms, entropy),
            Event::FencedWrite { write, now_ms } => self.write(write.into(), false, now_ms),
            Event::Write { write, now_ms } => self.write(write, true, now_ms),
            Event::Intent {
                event_id,
                request,
                now_ms,
            } => self.intent_request(event_id, request, now_ms),
            Event::ResetFence { request, now_ms } => self.reset_fence(request, now_ms),
        }
    }

    /// Raises the highest epoch for a coordinator; `Ok(true)` when it rose. A lower epoch is
    /// stale; the same epoch from another run (incarnation) is a rolled-back coordinator log:
    /// two runs cannot both have had one epoch unless one of them started from a restored copy.
    fn fence(
        &mut self,
        coordinator_id: &CoordinatorId,
        epoch: protocol::Epoch,
        incarnation: Incarnation,
    ) -> Result<bool, Rejection> {
        match self.epochs.get(coordinator_id) {
            Some(highest) if epoch < highest.epoch => Err(Rejection::StaleEpoch {
                coordinator_id: coordinator_id.clone(),
                got: epoch,
                highest: highest.epoch,
            }),
            Some(highest) if epoch == highest.epoch && incarnation != highest.incarnation => {
                Err(Rejection::IncarnationConflict {
                    coordinator_id: coordinator_id.clone(),
                    epoch,
                    claimed_by: highest.incarnation,
                    got: incarnation,
                })
            }
            Some(highest) if epoch == highest.epoch => Ok(false),
            highest
                if crate::epoch_bound::jumps_too_far(
                    highest.map(|h| h.epoch.0),
                    epoch.0,
                    self.config.epoch_jump_max,
                ) =>
            {
                Err(Rejection::EpochTooHigh {
                    coordinator_id: coordinator_id.clone(),
                    got: epoch,
                    highest: highest.map_or(protocol::Epoch(0), |h| h.epoch),
                    max_jump: self.config.epoch_jump_max.unwrap_or(u64::MAX),
                })
            }
            Some(_) | None => {
                self.epochs
                    .insert(coordinator_id.clone(), Fence { epoch, incarnation });
                Ok(true)
            }
        }
    }
}
