//! The async shell around the saga engine: it steps the engine under its lock, submits the
//! records it returns to the log (forced), and only once they are durable tells the engine so
//! (`SagaEvent::Durable`) and executes the rest (sends to participants, op queries, timers,
//! replies), feeding answers back as events.
//!
//! Time: every event carries `now_ms` from the saga clock, which cannot step within a run
//! (the wall clock read once at start, advanced by the monotonic clock, as leases measure
//! expiry), so a wall clock stepped or slewed neither loses a saga's deadline nor brings it
//! early; across restarts the engine resumes each deadline from the elapsed time the log holds.
//!
//! Lock order: the 2PC engine's lock before the saga table's (the checkpoint takes both);
//! nothing here takes the 2PC engine's lock.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};

use protocol::TxId;
use protocol::limits::REASON_LEN_MAX;
use protocol::routes;
use protocol::saga::{
    OpKind, OpStatus, OpStatusResponse, SagaOpAnswer, SagaOpRequest, SagaRequest, SagaResponse,
    SagaState,
};
use wal::{Durability, RecordType};

use crate::digest::Digest;
use crate::engine::WaiterId;
use crate::leases::LeaseClock;
use crate::records::{LogRecord, SagaOpOutcome, SagaRecord};
use crate::runtime::participants::truncate;
use crate::runtime::{Core, now_ms};
use crate::saga::engine::{ProbeAnswer, SagaCommand, SagaEngine, SagaEvent, SagaReply, SagaWait};

/// What a saga submitter hears: the engine's reply, or that its record could not be logged.
pub type SagaOutcome = Result<SagaReply, String>;

/// The saga table and what the shell keeps beside it.
#[derive(Debug)]
pub struct SagaShell {
    engine: Mutex<SagaEngine>,
    /// Unix ms that never jump within a run (the same kind of clock the lease service uses):
    /// the only time the saga engine hears.
    clock: LeaseClock,
    waiters: Mutex<HashMap<WaiterId, oneshot::Sender<SagaOutcome>>>,
    next_waiter: AtomicU64,
    /// Actions and compensations sent again (attempt > 1), for `twopc_saga_step_retries_total`.
    step_retries: AtomicU64,
}

impl SagaShell {
    pub fn new(engine: SagaEngine) -> SagaShell {
        SagaShell {
            engine: Mutex::new(engine),
            clock: LeaseClock::starting_at(now_ms()),
            waiters: Mutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(1),
            step_retries: AtomicU64::new(0),
        }
    }

    /// Now on the saga clock (never steps back within a run).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SagaEngine> {
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_waiters(&self) -> MutexGuard<'_, HashMap<WaiterId, oneshot::Sender<SagaOutcome>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Core {
    /// Starts (or joins) a saga and waits for the answer the request asked for. `None` means
    /// the process is shutting down before an answer came.
    ///
    /// A wait for the terminal state is bounded: compensations are retried for ever, so a
    /// saga whose compensation keeps failing may never end, and its client must not hang with
    /// it. Past the saga's deadline plus two delivery timeouts (room for one compensation
    /// round), the answer is the saga as it stands, `Accepted` (202: poll `GET`).
    pub async fn submit_saga(
        self: &Arc<Self>,
        request: SagaRequest,
        digest: Digest,
        wait: SagaWait,
        client: Option<String>,
    ) -> Option<SagaOutcome> {
        let waiter = self.sagas.next_waiter.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        self.sagas.lock_waiters().insert(waiter, sender);
        let id = request.id.clone();
        let bound = Duration::from_millis(
            request
                .timeout_ms()
                .saturating_add(self.config.delivery_timeout_ms.saturating_mul(2)),
        );
        self.apply_saga(SagaEvent::Submit {
            waiter,
            wait,
            request,
            digest,
            now_ms: self.sagas.now_ms(),
            client,
        });
        match tokio::time::timeout(bound, receiver).await {
            Ok(answer) => answer.ok(),
            Err(_) => {
                // The engine's later reply to this waiter finds no sender and is dropped.
                self.sagas.lock_waiters().remove(&waiter);
                let view = self.saga_status(&id)?;
                Some(Ok(SagaReply::Accepted(view)))
            }
        }
    }

    pub fn saga_status(&self, id: &TxId) -> Option<SagaResponse> {
        let mut view = self
            .sagas
            .lock()
            .get(id)
            .map(|saga| saga.view(self.sagas.now_ms()))?;
        view.resolved_by_hand = self.lock_engine().hand_resolution(id);
        Some(view)
    }

    /// Stuck first, as the engine orders them, except that a `needs_attention` saga settled
    /// by hand goes after the ones still waiting for an operator.
    pub fn list_sagas(&self, state: Option<SagaState>, limit: usize) -> Vec<SagaResponse> {
        let mut views = self.sagas.lock().list(state, limit, self.sagas.now_ms());
        {
            let engine = self.lock_engine();
            for view in &mut views {
                view.resolved_by_hand = engine.hand_resolution(&view.id);
            }
        }
        let (waiting, rest): (Vec<_>, Vec<_>) = views
            .into_iter()
            .partition(|v| v.state == SagaState::NeedsAttention && v.resolved_by_hand.is_none());
        let (settled, rest): (Vec<_>, Vec<_>) = rest
            .into_iter()
            .partition(|v| v.state == SagaState::NeedsAttention);
        let (live, ended): (Vec<_>, Vec<_>) =
            rest.into_iter().partition(|v| !v.state.is_terminal());
        waiting
            .into_iter()
            .chain(live)
            .chain(settled)
            .chain(ended)
            .collect()
    }

    /// `twopc_sagas{state=...}` and `twopc_saga_step_retries_total`, Prometheus text.
    pub fn saga_metrics_text(&self) -> String {
        let (counts, failing) = {
            let engine = self.sagas.lock();
            (engine.counts(), engine.compensations_failing())
        };
        let hand_resolved = self.lock_engine().hand_resolved_count();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP twopc_saga_compensations_failing Steps whose compensation (or fence) keeps failing \
             (retried with capped backoff for ever).\n# TYPE twopc_saga_compensations_failing \
             gauge\ntwopc_saga_compensations_failing {failing}"
        );
        let _ = writeln!(
            out,
            "# HELP twopc_sagas_resolved_by_hand needs_attention sagas an operator settled by \
             hand.\n# TYPE twopc_sagas_resolved_by_hand gauge\ntwopc_sagas_resolved_by_hand \
             {hand_resolved}"
        );
        let _ = writeln!(
            out,
            "# HELP twopc_sagas Sagas in this coordinator's table by state (needs_attention and \
             compensating ones want an operator's eye).\n# TYPE twopc_sagas gauge"
        );
        for (state, count) in counts {
            let _ = writeln!(out, "twopc_sagas{{state=\"{}\"}} {count}", state.as_str());
        }
        let _ = writeln!(
            out,
            "# HELP twopc_saga_step_retries_total Saga actions and compensations sent again \
             under the same op id (after an unknown outcome or a failing compensation).\n\
             # TYPE twopc_saga_step_retries_total counter\ntwopc_saga_step_retries_total {}",
            self.sagas.step_retries.load(Ordering::Relaxed)
        );
        out
    }

    /// Steps the saga engine; its records are submitted under the lock (the log's order is
    /// the engine's), and everything else runs once they are durable.
    pub(crate) fn apply_saga(self: &Arc<Self>, event: SagaEvent) {
        let mut tickets = Vec::new();
        let mut actions = Vec::new();
        let mut outcome_logged = false;
        let mut logged = Vec::new();
        {
            let mut engine = self.sagas.lock();
            for command in engine.step(event) {
                match command {
                    SagaCommand::Append(record) => {
                        outcome_logged |=
                            matches!(record, LogRecord::Saga(SagaRecord::StepOutcome(_)));
                        if let LogRecord::Saga(saga) = &record {
                            logged.push(saga.saga_id().clone());
                        }
                        tickets.push(self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        ));
                    }
                    other => actions.push(other),
                }
            }
        }
        if tickets.is_empty() && actions.is_empty() {
            return;
        }
        let core = Arc::clone(self);
        tokio::spawn(async move {
            for ticket in tickets {
                if let Err(e) = ticket.wait().await {
                    error!(error = %e, "LOG FAILED: a saga record could not be made durable; \
                           nothing that depends on it is sent (the next start resumes the saga)");
                    for action in actions {
                        if let SagaCommand::Reply { waiter, .. } = action
                            && let Some(sender) = core.sagas.lock_waiters().remove(&waiter)
                        {
                            let _ = sender.send(Err(e.to_string()));
                        }
                    }
                    return;
                }
            }
            if outcome_logged {
                crash_point!("coordinator::saga_after_outcome_logged");
            }
            // Durability is an event for the engine: reads show these records, and the
            // submits held for them are answered, only from now on (before this step's own
            // replies, so a client told 202 finds its saga with GET).
            if !logged.is_empty() {
                core.apply_saga(SagaEvent::Durable {
                    ids: logged,
                    now_ms: core.sagas.now_ms(),
                });
            }
            for action in actions {
                core.execute_saga(action);
            }
        });
    }

    fn execute_saga(self: &Arc<Self>, command: SagaCommand) {
        match command {
            SagaCommand::Append(_) => {}
            SagaCommand::Reply { waiter, reply } => {
                if let Some(sender) = self.sagas.lock_waiters().remove(&waiter) {
                    let _ = sender.send(Ok(reply));
                }
            }
            SagaCommand::ArmRetry { id, after_ms } => {
                // Weak: a long saga deadline must not keep a stopped coordinator alive.
                let core = Arc::downgrade(self);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    let Some(core) = core.upgrade() else {
                        return;
                    };
                    core.apply_saga(SagaEvent::RetryDue {
                        id,
                        now_ms: core.sagas.now_ms(),
                    });
                });
            }
            SagaCommand::ArmDeadline { id, after_ms } => {
                // Weak: a long saga deadline must not keep a stopped coordinator alive.
                let core = Arc::downgrade(self);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    let Some(core) = core.upgrade() else {
                        return;
                    };
                    core.apply_saga(SagaEvent::DeadlineDue {
                        id,
                        now_ms: core.sagas.now_ms(),
                    });
                });
            }
            SagaCommand::Send {
                id,
                step,
                kind,
                participant,
                op_id,
                payload,
                attempt,
                timeout_ms,
            } => {
                if attempt > 1 {
                    self.sagas.step_retries.fetch_add(1, Ordering::Relaxed);
                }
                let core = Arc::clone(self);
                tokio::spawn(async move {
                    let step_name = core
                        .sagas
                        .lock()
                        .get(&id)
                        .and_then(|s| s.begin.request.steps.get(step).map(|s| s.name.clone()))
                        .unwrap_or_default();
                    let request = SagaOpRequest {
                        saga_id: id.clone(),
                        step: step_name,
                        op_id,
                        coordinator_id: core.identity.coordinator_id.clone(),
                        epoch: core.epoch(),
                        payload,
                    };
                    let outcome = core.send_op(&participant, kind, &request, timeout_ms).await;
                    match kind {
                        OpKind::Action => crash_point!("coordinator::saga_before_outcome_logged"),
                        OpKind::Compensation => {
                            crash_point!("coordinator::saga_during_compensation")
                        }
                    }
                    debug!(saga = %id, step, ?kind, attempt, ?outcome, "saga op answered");
                    core.apply_saga(SagaEvent::OpAnswered {
                        id,
                        step,
                        kind,
                        outcome,
                        now_ms: core.sagas.now_ms(),
                        jitter: fastrand::u64(..),
                    });
                });
            }
            SagaCommand::Probe {
                id,
                step,
                participant,
                op_id,
                timeout_ms,
            } => {
                let core = Arc::clone(self);
                tokio::spawn(async move {
                    let answer = core.probe_op(&participant, &op_id, timeout_ms).await;
                    info!(saga = %id, step, %op_id, ?answer, "asked a participant about an unknown op");
                    core.apply_saga(SagaEvent::ProbeAnswered {
                        id,
                        step,
                        answer,
                        now_ms: core.sagas.now_ms(),
                        jitter: fastrand::u64(..),
                    });
                });
            }
        }
    }

    /// One action or compensation. Only a 200 with `{"status":"done"|"failed"}` is an answer;
    /// anything else (timeout, 5xx, malformed) is unknown.
    async fn send_op(
        &self,
        participant: &protocol::ParticipantName,
        kind: OpKind,
        request: &SagaOpRequest,
        timeout_ms: u64,
    ) -> SagaOpOutcome {
        let Some(endpoint) = self.participants.get(participant) else {
            return SagaOpOutcome::Unknown {
                error: format!("{participant} is not in this coordinator's configuration"),
            };
        };
        let path = match kind {
            OpKind::Action => routes::SAGA_ACTION,
            OpKind::Compensation => routes::SAGA_COMPENSATE,
        };
        let body = serde_json::to_vec(request).unwrap_or_default();
        let answer = endpoint
            .post_json(path, body, Duration::from_millis(timeout_ms))
            .await;
        let unknown = |error: String| SagaOpOutcome::Unknown {
            error: truncate(error, REASON_LEN_MAX),
        };
        match answer {
            Err(e) => unknown(e.to_string()),
            Ok(answer) if answer.status != 200 => unknown(format!(
                "HTTP {}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )),
            Ok(answer) => match serde_json::from_slice::<SagaOpAnswer>(&answer.body) {
                Ok(SagaOpAnswer::Done { result }) => SagaOpOutcome::Done { result },
                Ok(SagaOpAnswer::Failed { reason }) => SagaOpOutcome::Failed {
                    reason: truncate(reason, REASON_LEN_MAX),
                },
                Err(e) => unknown(format!("malformed answer: {e}")),
            },
        }
    }

    /// `GET {base}/saga/ops/{op_id}`.
    async fn probe_op(
        &self,
        participant: &protocol::ParticipantName,
        op_id: &str,
        timeout_ms: u64,
    ) -> ProbeAnswer {
        let Some(endpoint) = self.participants.get(participant) else {
            return ProbeAnswer::NoAnswer(format!("{participant} is not configured"));
        };
        let path = routes::SAGA_OP.replace("{op_id}", op_id);
        match endpoint.get(&path, Duration::from_millis(timeout_ms)).await {
            Err(e) => ProbeAnswer::NoAnswer(e.to_string()),
            Ok(answer) if answer.status != 200 => {
                ProbeAnswer::NoAnswer(format!("op query: HTTP {}", answer.status))
            }
            Ok(answer) => match serde_json::from_slice::<OpStatusResponse>(&answer.body) {
                Ok(status) => match status.status {
                    OpStatus::Done => ProbeAnswer::Done(status.result),
                    OpStatus::Failed => ProbeAnswer::Failed(truncate(
                        status.reason.unwrap_or_default(),
                        REASON_LEN_MAX,
                    )),
                    OpStatus::Compensated => ProbeAnswer::Compensated,
                    OpStatus::NotFound => ProbeAnswer::NotFound,
                },
                Err(e) => {
                    warn!(%participant, error = %e, "malformed op query answer");
                    ProbeAnswer::NoAnswer(format!("malformed op query answer: {e}"))
                }
            },
        }
    }
}
