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

use std::collections::BTreeMap;

use protocol::TxId;
use protocol::saga::{
    OpKind, SagaRequest, SagaResponse, SagaState, SagaStepStatus, StepStatus, op_id,
};

use crate::digest::Digest;
use crate::engine::WaiterId;
use crate::engine::retry_delay_ms;
use crate::records::{
    LogRecord, SagaBeginRecord, SagaEndRecord, SagaIdRecord, SagaOpOutcome, SagaRecord,
    SagaSnapshot, SagaStepOutcome, SagaStepStarted, StepProgress,
};
use crate::saga::planner::{self, Decision, Fact, LogEvent, PlanStep};

/// A saga as a checkpoint keeps it, by the name the checkpoint's users (the simulation) know
/// it under here; the log's types live in `records`.
pub use crate::records::SagaSnapshot as Saga;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SagaConfig {
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// How long one action, compensation or op query may take before it counts as unknown.
    pub step_timeout_ms: u64,
}

/// What a client waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SagaWait {
    /// A terminal state (the default).
    Terminal,
    /// Only the durable acceptance (`?wait=none`, 202).
    Accepted,
}

/// What `GET {base}/saga/ops/{op_id}` said, or that it said nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    Done(Option<serde_json::Value>),
    Failed(String),
    Compensated,
    NotFound,
    NoAnswer(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum SagaEvent {
    /// A valid request (shape checked, participants configured).
    Submit {
        waiter: WaiterId,
        wait: SagaWait,
        request: SagaRequest,
        digest: Digest,
        now_ms: u64,
        /// The client's name from its token (`None` with authentication off).
        client: Option<String>,
    },
    /// An action or compensation came back; the shell classified the answer.
    OpAnswered {
        id: TxId,
        step: usize,
        kind: OpKind,
        outcome: SagaOpOutcome,
        now_ms: u64,
        jitter: u64,
    },
    /// An op query came back.
    ProbeAnswered {
        id: TxId,
        step: usize,
        answer: ProbeAnswer,
        now_ms: u64,
        jitter: u64,
    },
    RetryDue {
        id: TxId,
        now_ms: u64,
    },
    DeadlineDue {
        id: TxId,
        now_ms: u64,
    },
    /// The log is replayed and this run's epoch is durable: resume every live saga.
    Recovered {
        now_ms: u64,
    },
    /// The records of one step are durable: one id per record, as appended.
    Durable {
        ids: Vec<TxId>,
        now_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum SagaCommand {
    /// Forced append; later commands of the same step wait until it is durable.
    Append(LogRecord),
    Send {
        id: TxId,
        step: usize,
        kind: OpKind,
        participant: protocol::ParticipantName,
        op_id: String,
        payload: serde_json::Value,
        attempt: u32,
        timeout_ms: u64,
    },
    Probe {
        id: TxId,
        step: usize,
        participant: protocol::ParticipantName,
        op_id: String,
        timeout_ms: u64,
    },
    ArmRetry {
        id: TxId,
        after_ms: u64,
    },
    ArmDeadline {
        id: TxId,
        after_ms: u64,
    },
    Reply {
        waiter: WaiterId,
        reply: SagaReply,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum SagaReply {
    /// 200: the saga as it stands (terminal unless the client asked for less).
    Saga(SagaResponse),
    /// 202 (`?wait=none`): accepted durably, running.
    Accepted(SagaResponse),
    /// 409: the id is known with another body.
    Conflict(TxId),
}

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
    held: Vec<HeldSubmit>,
    /// This saga as of its last durable record: what reads show (`None`: its begin is not
    /// durable yet, so it is not shown at all).
    shown: Option<Box<SagaEntry>>,
}

/// A submit of a known saga, answered once the saga's records are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeldSubmit {
    waiter: WaiterId,
    wait: SagaWait,
    digest: Digest,
}

impl SagaEntry {
    fn new(begin: SagaBeginRecord) -> SagaEntry {
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
    fn show_as_durable(&mut self) {
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
    fn from_snapshot(snapshot: SagaSnapshot) -> SagaEntry {
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
    fn durable(&self) -> SagaSnapshot {
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
    fn remaining_at(&self, now_ms: u64) -> u64 {
        self.begin
            .request
            .timeout_ms()
            .saturating_sub(self.elapsed_at(now_ms))
    }

    /// Its clock runs on this run's from `now_ms`, starting from what the log says.
    fn resume_clock(&mut self, now_ms: u64) {
        self.running_since = Some(RunningSince {
            now_ms,
            elapsed_ms: self.elapsed_ms,
        });
    }

    fn plan_steps(&self) -> Vec<PlanStep> {
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
    fn absorb(&mut self, record: &SagaRecord) {
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
                            planner::apply(self.facts[i], LogEvent::Started, &mut self.successes);
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
                self.facts[i] = planner::apply(self.facts[i], event, &mut self.successes);
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

    fn index(&self, step: u32) -> Option<usize> {
        let i = usize::try_from(step).ok()?;
        (i < self.facts.len()).then_some(i)
    }

    fn step_status(&self, i: usize) -> StepStatus {
        let compensating = self.busy == Busy::Op(i, OpKind::Compensation);
        match self.facts[i] {
            _ if self.busy == Busy::Op(i, OpKind::Action) => StepStatus::Running,
            Fact::NotRun => StepStatus::Pending,
            Fact::Unknown => StepStatus::Unknown,
            Fact::Failed | Fact::NotApplied => StepStatus::Failed,
            Fact::NotFound if compensating => StepStatus::Compensating,
            Fact::NotFound => StepStatus::Unknown,
            Fact::Succeeded { .. } if compensating => StepStatus::Compensating,
            Fact::Succeeded { .. } => StepStatus::Succeeded,
            Fact::CompensationFailing { .. } | Fact::FenceFailing { .. } => {
                StepStatus::CompensationFailing
            }
            Fact::Compensated { .. } => StepStatus::Compensated,
        }
    }

    /// The answer's shape.
    pub fn view(&self, now_ms: u64) -> SagaResponse {
        let id = &self.begin.id;
        let steps = self
            .begin
            .request
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| {
                let progress = &self.progress[i];
                let backward = progress.compensation_attempts > 0;
                SagaStepStatus {
                    name: step.name.clone(),
                    participant: step.participant.clone(),
                    status: self.step_status(i),
                    attempts: if backward {
                        progress.compensation_attempts
                    } else {
                        progress.attempts
                    },
                    last_error: progress.last_error.clone(),
                    op_id: op_id(
                        id,
                        &step.name,
                        if backward {
                            OpKind::Compensation
                        } else {
                            OpKind::Action
                        },
                    ),
                    result: progress.result.clone(),
                }
            })
            .collect();
        let until = self.ended.as_ref().map_or(now_ms, |e| e.ended_at_ms);
        SagaResponse {
            id: id.clone(),
            state: self.state(),
            reason: self.ended.as_ref().and_then(|e| e.reason.clone()),
            steps,
            created_at_ms: self.begin.created_at_ms,
            age_ms: until.saturating_sub(self.begin.created_at_ms),
            // The runtime adds an operator's hand resolution, which the engine does not keep.
            resolved_by_hand: None,
            client: self.begin.client.clone(),
        }
    }
}

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

    /// Rebuilds the table from a checkpoint's sagas and the records after it.
    pub fn replay<'a>(
        config: SagaConfig,
        snapshot: Vec<SagaSnapshot>,
        records: impl IntoIterator<Item = &'a LogRecord>,
    ) -> SagaEngine {
        let mut engine = SagaEngine::new(config);
        for saga in snapshot {
            engine
                .sagas
                .insert(saga.begin.id.clone(), SagaEntry::from_snapshot(saga));
        }
        for record in records {
            if let LogRecord::Saga(record) = record {
                engine.absorb(record);
            }
        }
        // Everything replayed is durable.
        for saga in engine.sagas.values_mut() {
            saga.show_as_durable();
        }
        engine
    }

    fn absorb(&mut self, record: &SagaRecord) {
        if let SagaRecord::Begin(begin) = record {
            self.sagas
                .entry(begin.id.clone())
                .or_insert_with(|| SagaEntry::new(begin.clone()));
            return;
        }
        if let Some(saga) = self.sagas.get_mut(record.saga_id()) {
            saga.absorb(record);
        }
    }

    /// Stamps `record` with its saga's elapsed time at `now_ms`, absorbs it and emits its
    /// append; the saga counts it unsynced until the shell reports it durable
    /// (`SagaEvent::Durable`).
    fn log(&mut self, mut record: SagaRecord, now_ms: u64, out: &mut Vec<SagaCommand>) {
        if let Some(saga) = self.sagas.get(record.saga_id()) {
            record.set_elapsed_ms(saga.elapsed_at(now_ms));
        }
        self.absorb(&record);
        if let Some(saga) = self.sagas.get_mut(record.saga_id()) {
            saga.unsynced += 1;
        }
        out.push(SagaCommand::Append(LogRecord::Saga(record)));
    }

    /// Records of `ids` are durable: a saga with nothing left unsynced is shown as it stands,
    /// and the submits held for it are answered.
    fn records_durable(&mut self, ids: Vec<TxId>, now_ms: u64, out: &mut Vec<SagaCommand>) {
        let mut settled = Vec::new();
        for id in ids {
            let Some(saga) = self.sagas.get_mut(&id) else {
                continue;
            };
            assert!(
                saga.unsynced > 0,
                "saga {id}: a durable record it never logged"
            );
            saga.unsynced -= 1;
            if saga.unsynced == 0 {
                saga.show_as_durable();
                settled.push(id);
            }
        }
        for id in settled {
            let held = self
                .sagas
                .get_mut(&id)
                .map(|saga| std::mem::take(&mut saga.held))
                .unwrap_or_default();
            for submit in held {
                self.answer_repeat(&id, submit, now_ms, out);
            }
        }
    }

    /// A submit of a saga the table holds, all of whose records are durable.
    fn answer_repeat(
        &mut self,
        id: &TxId,
        submit: HeldSubmit,
        now_ms: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        let Some(saga) = self.sagas.get_mut(id) else {
            return;
        };
        let reply = if saga.begin.digest != submit.digest {
            SagaReply::Conflict(id.clone())
        } else if submit.wait == SagaWait::Accepted {
            SagaReply::Accepted(saga.view(now_ms))
        } else if saga.ended.is_some() {
            SagaReply::Saga(saga.view(now_ms))
        } else {
            saga.waiters.push(submit.waiter);
            return;
        };
        out.push(SagaCommand::Reply {
            waiter: submit.waiter,
            reply,
        });
    }

    /// The checkpoint's copy at `now_ms`: only what the log holds (nothing in flight, no
    /// waiters), and each live saga's elapsed time as of now, so that a restart after it
    /// loses at most the time since (besides its downtime).
    pub fn snapshot(&self, now_ms: u64) -> Vec<SagaSnapshot> {
        self.sagas
            .values()
            .map(|saga| {
                let mut copy = saga.durable();
                if saga.ended.is_none() {
                    copy.elapsed_ms = saga.elapsed_at(now_ms);
                }
                copy
            })
            .collect()
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

    /// How many sagas are in each state (metrics).
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
            } => {
                let Some(saga) = self.sagas.get(&id) else {
                    return out;
                };
                // A late or duplicate answer (the op was retried since) changes nothing.
                if saga.busy != Busy::Op(step, kind) {
                    return out;
                }
                // Unknown is asked about (or resent) later; a failing compensation is retried.
                let retry = matches!(
                    (&outcome, kind),
                    (SagaOpOutcome::Unknown { .. }, _)
                        | (SagaOpOutcome::Failed { .. }, OpKind::Compensation)
                );
                self.log(
                    SagaRecord::StepOutcome(SagaStepOutcome {
                        id: id.clone(),
                        step: step as u32,
                        kind,
                        outcome,
                        elapsed_ms: 0,
                    }),
                    now_ms,
                    &mut out,
                );
                self.after_answer(&id, retry, now_ms, jitter, &mut out);
            }
            SagaEvent::ProbeAnswered {
                id,
                step,
                answer,
                now_ms,
                jitter,
            } => {
                let Some(saga) = self.sagas.get(&id) else {
                    return out;
                };
                if saga.busy != Busy::Probe(step) {
                    return out;
                }
                let learned = match answer {
                    ProbeAnswer::Done(result) => {
                        Some((OpKind::Action, SagaOpOutcome::Done { result }))
                    }
                    ProbeAnswer::Failed(reason) => {
                        Some((OpKind::Action, SagaOpOutcome::Failed { reason }))
                    }
                    ProbeAnswer::NotFound => Some((OpKind::Action, SagaOpOutcome::NotFound)),
                    ProbeAnswer::Compensated => {
                        Some((OpKind::Compensation, SagaOpOutcome::Done { result: None }))
                    }
                    ProbeAnswer::NoAnswer(error) => {
                        if let Some(saga) = self.sagas.get_mut(&id) {
                            saga.progress[step].last_error = Some(error);
                        }
                        None
                    }
                };
                let retry = learned.is_none();
                if let Some((kind, outcome)) = learned {
                    self.log(
                        SagaRecord::StepOutcome(SagaStepOutcome {
                            id: id.clone(),
                            step: step as u32,
                            kind,
                            outcome,
                            elapsed_ms: 0,
                        }),
                        now_ms,
                        &mut out,
                    );
                }
                self.after_answer(&id, retry, now_ms, jitter, &mut out);
            }
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

    fn submit(
        &mut self,
        waiter: WaiterId,
        wait: SagaWait,
        (request, client): (SagaRequest, Option<String>),
        digest: Digest,
        now_ms: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        if let Some(saga) = self.sagas.get_mut(&request.id) {
            let submit = HeldSubmit {
                waiter,
                wait,
                digest,
            };
            // Answered from the table only once what the answer rests on is durable (even a
            // conflict: the begin it conflicts with may still be lost).
            if saga.unsynced > 0 {
                saga.held.push(submit);
            } else {
                self.answer_repeat(&request.id, submit, now_ms, out);
            }
            return;
        }
        let id = request.id.clone();
        let timeout_ms = request.timeout_ms();
        let begin = SagaBeginRecord {
            id: id.clone(),
            digest,
            request,
            created_at_ms: now_ms,
            deadline_ms: now_ms.saturating_add(timeout_ms),
            client,
        };
        self.log(SagaRecord::Begin(begin), now_ms, out);
        if let Some(saga) = self.sagas.get_mut(&id) {
            saga.resume_clock(now_ms);
        }
        out.push(SagaCommand::ArmDeadline {
            id: id.clone(),
            after_ms: timeout_ms,
        });
        if wait == SagaWait::Terminal
            && let Some(saga) = self.sagas.get_mut(&id)
        {
            saga.waiters.push(waiter);
        }
        self.drive(&id, now_ms, out);
        if wait == SagaWait::Accepted
            && let Some(saga) = self.sagas.get(&id)
        {
            out.push(SagaCommand::Reply {
                waiter,
                reply: SagaReply::Accepted(saga.view(now_ms)),
            });
        }
    }

    /// Times the saga out if its elapsed time reached its timeout, and otherwise arms the
    /// timer for what is left (a timer that fired early, or a restart, re-arms it).
    fn deadline(&mut self, id: &TxId, now_ms: u64, out: &mut Vec<SagaCommand>) {
        let Some(saga) = self.sagas.get(id) else {
            return;
        };
        if saga.ended.is_some() || saga.timed_out {
            return;
        }
        let remaining = saga.remaining_at(now_ms);
        if remaining > 0 {
            out.push(SagaCommand::ArmDeadline {
                id: id.clone(),
                after_ms: remaining,
            });
            return;
        }
        self.log(
            SagaRecord::TimedOut(SagaIdRecord {
                id: id.clone(),
                elapsed_ms: 0,
            }),
            now_ms,
            out,
        );
        self.drive(id, now_ms, out);
    }

    fn after_answer(
        &mut self,
        id: &TxId,
        retry: bool,
        now_ms: u64,
        jitter: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        let Some(saga) = self.sagas.get_mut(id) else {
            return;
        };
        if retry {
            saga.failures = saga.failures.saturating_add(1);
            saga.busy = Busy::Waiting;
            out.push(SagaCommand::ArmRetry {
                id: id.clone(),
                after_ms: retry_delay_ms(
                    saga.failures,
                    self.config.retry_base_ms,
                    self.config.retry_max_ms,
                    jitter,
                ),
            });
        } else {
            saga.failures = 0;
            saga.busy = Busy::Idle;
            self.drive(id, now_ms, out);
        }
    }

    /// Asks the planner what comes next and starts it, unless something is in flight.
    fn drive(&mut self, id: &TxId, now_ms: u64, out: &mut Vec<SagaCommand>) {
        let Some(saga) = self.sagas.get(id) else {
            return;
        };
        if saga.ended.is_some() || saga.busy != Busy::Idle {
            return;
        }
        let plan = planner::plan(&saga.plan_steps(), &saga.facts, saga.timed_out);
        let end = |state| (state, Some(plan.reason.clone()));
        let ending = match plan.decision {
            Decision::Complete => Some((SagaState::Completed, None)),
            Decision::Compensated => Some(end(SagaState::Compensated)),
            Decision::NeedsAttention => Some(end(SagaState::NeedsAttention)),
            Decision::Continue => {
                let i = plan.next_index.unwrap_or_default();
                self.start_op(id, i, OpKind::Action, now_ms, out);
                None
            }
            Decision::Fence => {
                let i = plan.fence_index.first().copied().unwrap_or_default();
                self.start_op(id, i, OpKind::Compensation, now_ms, out);
                None
            }
            Decision::Compensate => {
                let i = plan.compensate_index.first().copied().unwrap_or_default();
                self.start_op(id, i, OpKind::Compensation, now_ms, out);
                None
            }
            Decision::ReconcileFirst => {
                let i = plan.reconcile_index.first().copied().unwrap_or_default();
                let timeout_ms = self.config.step_timeout_ms;
                if let Some(saga) = self.sagas.get_mut(id) {
                    saga.busy = Busy::Probe(i);
                    let step = &saga.begin.request.steps[i];
                    out.push(SagaCommand::Probe {
                        id: id.clone(),
                        step: i,
                        participant: step.participant.clone(),
                        op_id: op_id(id, &step.name, OpKind::Action),
                        timeout_ms,
                    });
                }
                None
            }
        };
        if let Some((state, reason)) = ending {
            self.log(
                SagaRecord::End(SagaEndRecord {
                    id: id.clone(),
                    state,
                    reason,
                    ended_at_ms: now_ms,
                    elapsed_ms: 0,
                }),
                now_ms,
                out,
            );
            if let Some(saga) = self.sagas.get_mut(id) {
                let view = saga.view(now_ms);
                for waiter in std::mem::take(&mut saga.waiters) {
                    out.push(SagaCommand::Reply {
                        waiter,
                        reply: SagaReply::Saga(view.clone()),
                    });
                }
            }
        }
    }

    fn start_op(
        &mut self,
        id: &TxId,
        i: usize,
        kind: OpKind,
        now_ms: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        let Some(saga) = self.sagas.get(id) else {
            return;
        };
        let attempt = match kind {
            OpKind::Action => saga.progress[i].attempts,
            OpKind::Compensation => saga.progress[i].compensation_attempts,
        }
        .saturating_add(1);
        self.log(
            SagaRecord::StepStarted(SagaStepStarted {
                id: id.clone(),
                step: i as u32,
                kind,
                attempt,
                elapsed_ms: 0,
            }),
            now_ms,
            out,
        );
        let timeout_ms = self.config.step_timeout_ms;
        let Some(saga) = self.sagas.get_mut(id) else {
            return;
        };
        saga.busy = Busy::Op(i, kind);
        let step = &saga.begin.request.steps[i];
        let payload = match kind {
            OpKind::Action => step.action.clone(),
            OpKind::Compensation => step.compensation.clone().unwrap_or(serde_json::Value::Null),
        };
        out.push(SagaCommand::Send {
            id: id.clone(),
            step: i,
            kind,
            participant: step.participant.clone(),
            op_id: op_id(id, &step.name, kind),
            payload,
            attempt,
            timeout_ms,
        });
    }
}
