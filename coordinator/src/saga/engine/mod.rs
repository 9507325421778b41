//! The saga state machine: `step(event) -> Vec<SagaCommand>`, in the 2PC engine's style. Time
//! and randomness come in as event fields; what to do next comes from the planner, so the
//! engine only keeps the facts and what is in flight.
//!
//! Durability: every record comes out as `SagaCommand::Append`, and the shell makes each one
//! durable before it executes any later command of the same step (a send, a reply). A record is
//! applied to the table by the same `absorb` that replay uses, so a restarted coordinator holds
//! exactly the table the log describes. Applied is not durable: the shell reports durability
//! as an event (`SagaEvent::Durable`), and until a saga's records are all durable, a repeated
//! submit of it waits and every read (`get`, `list`, `counts`) shows the saga as of its last
//! durable record, as the 2PC engine answers only from `DecisionDurable`.
//!
//! Deadlines: the shell's `now_ms` is a clock that never steps within a run (Unix ms read
//! once at start, advanced by the monotonic clock), and runs' clocks are never compared. A
//! saga's deadline is `timeout_ms` of its elapsed time: measured on this run's clock since the
//! saga began or since the restart, plus the elapsed time its last record or checkpoint logged
//! (docs/sagas.md, "Deadlines"). Downtime does not count, so a deadline may come later than
//! the wall clock says, never earlier.
//!
//! It must never do I/O or read a clock.
//!
//! The map: `io` holds what goes in and comes out; `entry` one saga in the table (its facts,
//! its clock, what is in flight) and `view` how it is shown; `replay` rebuilds the table and
//! takes the checkpoint's copy; `durability` keeps applied apart from durable; `drive` starts
//! what the planner says comes next (forward, compensation, fence, the deadline) and
//! `reconcile` folds the answers and op queries back in.

mod drive;
mod durability;
mod entry;
mod io;
mod reconcile;
mod replay;
mod view;

use std::collections::BTreeMap;

use protocol::TxId;
use protocol::saga::{SagaResponse, SagaState};

pub use entry::{Busy, SagaEntry};
pub use io::{ProbeAnswer, SagaCommand, SagaConfig, SagaEvent, SagaReply, SagaWait};

/// A saga as a checkpoint keeps it, by the name the checkpoint's users (the simulation) know
/// it under here; the log's types live in `records`.
pub use crate::records::SagaSnapshot as Saga;

/// Every saga this coordinator's log holds.
#[derive(Debug, Clone)]
pub struct SagaEngine {
    config: SagaConfig,
    sagas: BTreeMap<TxId, SagaEntry>,
}

impl SagaEngine {
    pub fn new(config: SagaConfig) -> SagaEngine {
        SagaEngine {
            config,
            sagas: BTreeMap::new(),
        }
    }

    /// The saga as of its last durable record (reads never show what a crash can take back).
    pub fn get(&self, id: &TxId) -> Option<&SagaEntry> {
        self.sagas.get(id).and_then(|saga| saga.shown.as_deref())
    }

    /// Every saga as of its last durable record.
    fn shown(&self) -> impl Iterator<Item = &SagaEntry> {
        self.sagas.values().filter_map(|saga| saga.shown.as_deref())
    }

    /// Stuck first (needs_attention, compensating, running), then ended; oldest first within.
    pub fn list(&self, state: Option<SagaState>, limit: usize, now_ms: u64) -> Vec<SagaResponse> {
        let rank = |s: SagaState| match s {
            SagaState::NeedsAttention => 0,
            SagaState::Compensating => 1,
            SagaState::Running => 2,
            SagaState::Compensated => 3,
            SagaState::Completed => 4,
        };
        let mut found: Vec<(u8, u64, &SagaEntry)> = self
            .shown()
            .map(|saga| (saga.state(), saga))
            .filter(|(s, _)| state.is_none_or(|wanted| wanted == *s))
            .map(|(s, saga)| (rank(s), saga.begin.created_at_ms, saga))
            .collect();
        found.sort_by_key(|(rank, created, _)| (*rank, *created));
        found
            .into_iter()
            .take(limit)
            .map(|(_, _, saga)| saga.view(now_ms))
            .collect()
    }

    /// Steps whose compensation (or fence) keeps failing, over every saga not ended.
    pub fn compensations_failing(&self) -> u64 {
        self.shown()
            .filter(|s| s.ended.is_none())
            .flat_map(|s| &s.facts)
            .filter(|f| f.is_compensation_failing())
            .count() as u64
    }

    /// Whether `id` waits for its backoff timer (so a retry now would start something).
    pub fn is_waiting(&self, id: &TxId) -> bool {
        self.sagas.get(id).is_some_and(|s| s.busy == Busy::Waiting)
    }

    /// How many sagas are in each state (metrics).
    pub fn counts(&self) -> BTreeMap<SagaState, u64> {
        let mut counts: BTreeMap<SagaState, u64> =
            SagaState::ALL.into_iter().map(|s| (s, 0)).collect();
        for saga in self.shown() {
            *counts.entry(saga.state()).or_default() += 1;
        }
        counts
    }

    pub fn step(&mut self, event: SagaEvent) -> Vec<SagaCommand> {
        let mut out = Vec::new();
        match event {
            SagaEvent::Submit {
                waiter,
                wait,
                request,
                digest,
                now_ms,
                client,
            } => self.submit(waiter, wait, (request, client), digest, now_ms, &mut out),
            SagaEvent::OpAnswered {
                id,
                step,
                kind,
                outcome,
                now_ms,
                jitter,
            } => self.op_answered(id, step, kind, outcome, now_ms, jitter, &mut out),
            SagaEvent::ProbeAnswered {
                id,
                step,
                answer,
                now_ms,
                jitter,
            } => self.probe_answered(id, step, answer, now_ms, jitter, &mut out),
            SagaEvent::RetryDue { id, now_ms } => {
                if let Some(saga) = self.sagas.get_mut(&id)
                    && saga.busy == Busy::Waiting
                {
                    saga.busy = Busy::Idle;
                    self.drive(&id, now_ms, &mut out);
                }
            }
            SagaEvent::DeadlineDue { id, now_ms } => self.deadline(&id, now_ms, &mut out),
            SagaEvent::Durable { ids, now_ms } => self.records_durable(ids, now_ms, &mut out),
            SagaEvent::Recovered { now_ms } => {
                let live: Vec<TxId> = self
                    .sagas
                    .iter()
                    .filter(|(_, s)| s.ended.is_none())
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in live {
                    if let Some(saga) = self.sagas.get_mut(&id) {
                        saga.busy = Busy::Idle;
                        // The remaining time is what the log says is left, never a wall-clock
                        // difference: the downtime does not count.
                        saga.resume_clock(now_ms);
                    }
                    self.deadline(&id, now_ms, &mut out);
                    self.drive(&id, now_ms, &mut out);
                }
            }
        }
        out
    }
}
