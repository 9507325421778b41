//! One saga in the engine's table: what its records say (applied by the same `absorb` live and
//! in replay), its clock (elapsed time, downtime not counted), what is in flight, and the
//! durable copy reads are answered from.

use protocol::saga::{OpKind, SagaState};

use crate::digest::Digest;
use crate::engine::WaiterId;
use crate::records::{
    SagaBeginRecord, SagaEndRecord, SagaOpOutcome, SagaRecord, SagaSnapshot, StepProgress,
};
use crate::saga::planner;
use crate::saga_facts::{self as facts, Fact, LogEvent, PlanStep};

use super::io::SagaWait;

/// What is in flight for a saga (never logged: after a restart nothing is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Busy {
    #[default]
    Idle,
    Op(usize, OpKind),
    Probe(usize),
    /// A retry timer is armed.
    Waiting,
}

/// Where this run's clock stood when a saga had run for `elapsed_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RunningSince {
    now_ms: u64,
    elapsed_ms: u64,
}

/// One saga in the engine's table: what its records say (the part a checkpoint keeps, as a
/// [`SagaSnapshot`]) and what only this run has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SagaEntry {
    pub begin: SagaBeginRecord,
    pub facts: Vec<Fact>,
    pub progress: Vec<StepProgress>,
    pub timed_out: bool,
    /// Successes counted so far (the planner's order numbers).
    pub successes: u32,
    pub ended: Option<SagaEndRecord>,
    /// How long the saga had run as of its last record or checkpoint (see
    /// [`SagaSnapshot::elapsed_ms`]).
    pub elapsed_ms: u64,
    /// This run's clock reading from which its elapsed time advances (`None` until the saga
    /// begins or resumes in this run).
    running_since: Option<RunningSince>,
    pub busy: Busy,
    pub waiters: Vec<WaiterId>,
    /// Consecutive failures of the current operation, for the backoff.
    pub failures: u32,
    /// Records applied here whose durability the shell has not reported yet.
    pub unsynced: u32,
    /// Repeated submits that wait for those records before they are answered.
    pub(super) held: Vec<HeldSubmit>,
    /// This saga as of its last durable record: what reads show (`None`: its begin is not
    /// durable yet, so it is not shown at all).
    pub(super) shown: Option<Box<SagaEntry>>,
}

/// A submit of a known saga, answered once the saga's records are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HeldSubmit {
    pub(super) waiter: WaiterId,
    pub(super) wait: SagaWait,
    pub(super) digest: Digest,
}

impl SagaEntry {
    pub(super) fn new(begin: SagaBeginRecord) -> SagaEntry {
        let n = begin.request.steps.len();
        SagaEntry {
            begin,
            facts: vec![Fact::NotRun; n],
            progress: vec![StepProgress::default(); n],
            timed_out: false,
            successes: 0,
            ended: None,
            elapsed_ms: 0,
            running_since: None,
            busy: Busy::Idle,
            waiters: Vec::new(),
            failures: 0,
            unsynced: 0,
            held: Vec::new(),
            shown: None,
        }
    }

    /// Everything applied is durable now: reads show this state.
    pub(super) fn show_as_durable(&mut self) {
        let previous = self.shown.take();
        let held = std::mem::take(&mut self.held);
        let waiters = std::mem::take(&mut self.waiters);
        drop(previous);
        self.shown = Some(Box::new(self.clone()));
        self.held = held;
        self.waiters = waiters;
    }

    /// A checkpoint's saga, with nothing of a running process yet (nothing in flight, no
    /// waiters, no backoff).
    pub(super) fn from_snapshot(snapshot: SagaSnapshot) -> SagaEntry {
        SagaEntry {
            busy: Busy::Idle,
            waiters: Vec::new(),
            failures: 0,
            unsynced: 0,
            held: Vec::new(),
            shown: None,
            begin: snapshot.begin,
            facts: snapshot.facts,
            progress: snapshot.progress,
            timed_out: snapshot.timed_out,
            successes: snapshot.successes,
            ended: snapshot.ended,
            elapsed_ms: snapshot.elapsed_ms,
            running_since: None,
        }
    }

    /// This saga without what only a running process has (in flight, waiters, backoff).
    pub(super) fn durable(&self) -> SagaSnapshot {
        SagaSnapshot {
            begin: self.begin.clone(),
            facts: self.facts.clone(),
            progress: self.progress.clone(),
            timed_out: self.timed_out,
            successes: self.successes,
            ended: self.ended.clone(),
            elapsed_ms: self.elapsed_ms,
        }
    }

    /// How long the saga has run at `now_ms` (this run's clock): what the log says, plus this
    /// run's time since it began or resumed. Never less than the log says, even if `now_ms`
    /// went back (it does not, from a working shell).
    pub fn elapsed_at(&self, now_ms: u64) -> u64 {
        match self.running_since {
            Some(since) => since
                .elapsed_ms
                .saturating_add(now_ms.saturating_sub(since.now_ms))
                .max(self.elapsed_ms),
            None => self.elapsed_ms,
        }
    }

    /// How long until the deadline at `now_ms` (0: due).
    pub(super) fn remaining_at(&self, now_ms: u64) -> u64 {
        self.begin
            .request
            .timeout_ms()
            .saturating_sub(self.elapsed_at(now_ms))
    }

    /// Its clock runs on this run's from `now_ms`, starting from what the log says.
    pub(super) fn resume_clock(&mut self, now_ms: u64) {
        self.running_since = Some(RunningSince {
            now_ms,
            elapsed_ms: self.elapsed_ms,
        });
    }

    pub(super) fn plan_steps(&self) -> Vec<PlanStep> {
        self.begin
            .request
            .steps
            .iter()
            .map(|s| PlanStep {
                name: s.name.clone(),
                compensable: s.compensable(),
            })
            .collect()
    }

    pub fn state(&self) -> SagaState {
        match &self.ended {
            Some(end) => end.state,
            None if planner::is_backward(&self.plan_steps(), &self.facts, self.timed_out) => {
                SagaState::Compensating
            }
            None => SagaState::Running,
        }
    }

    /// Applies one logged record (live and in replay alike). Idempotent for what matters:
    /// success is sticky, attempts take the maximum.
    pub(super) fn absorb(&mut self, record: &SagaRecord) {
        self.elapsed_ms = self.elapsed_ms.max(record.elapsed_ms());
        match record {
            SagaRecord::Begin(_) => {}
            SagaRecord::StepStarted(started) => {
                let Some(i) = self.index(started.step) else {
                    return;
                };
                let progress = &mut self.progress[i];
                match started.kind {
                    OpKind::Action => {
                        progress.attempts = progress.attempts.max(started.attempt);
                        self.facts[i] =
                            facts::apply(self.facts[i], LogEvent::Started, &mut self.successes);
                    }
                    OpKind::Compensation => {
                        progress.compensation_attempts =
                            progress.compensation_attempts.max(started.attempt);
                    }
                }
            }
            SagaRecord::StepOutcome(outcome) => {
                let Some(i) = self.index(outcome.step) else {
                    return;
                };
                let event = match (outcome.kind, &outcome.outcome) {
                    (OpKind::Action, SagaOpOutcome::Done { .. }) => LogEvent::Succeeded,
                    (OpKind::Action, SagaOpOutcome::Failed { .. }) => LogEvent::Failed,
                    (OpKind::Action, SagaOpOutcome::Unknown { .. }) => LogEvent::Unknown,
                    (_, SagaOpOutcome::NotFound) => LogEvent::NotFound,
                    (OpKind::Compensation, SagaOpOutcome::Done { .. }) => LogEvent::Compensated,
                    (OpKind::Compensation, _) => LogEvent::CompensationFailed,
                };
                self.facts[i] = facts::apply(self.facts[i], event, &mut self.successes);
                let progress = &mut self.progress[i];
                match &outcome.outcome {
                    SagaOpOutcome::Done { result } => {
                        if outcome.kind == OpKind::Action && result.is_some() {
                            progress.result = result.clone();
                        }
                        progress.last_error = None;
                    }
                    SagaOpOutcome::Failed { reason } => progress.last_error = Some(reason.clone()),
                    SagaOpOutcome::Unknown { error } => progress.last_error = Some(error.clone()),
                    SagaOpOutcome::NotFound => {
                        progress.last_error =
                            Some("the participant has no record of the action".into())
                    }
                }
            }
            SagaRecord::TimedOut(_) => self.timed_out = true,
            SagaRecord::End(end) => self.ended = Some(end.clone()),
        }
    }

    pub(super) fn index(&self, step: u32) -> Option<usize> {
        let i = usize::try_from(step).ok()?;
        (i < self.facts.len()).then_some(i)
    }
}
