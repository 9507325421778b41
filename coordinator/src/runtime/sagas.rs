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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};

use protocol::TxId;
use protocol::limits::REASON_LEN_MAX;
use protocol::routes;
use protocol::saga::{
    OpKind, OpQuery, OpStatus, OpStatusResponse, SagaOpAnswer, SagaOpRequest, SagaRequest,
    SagaResponse, SagaState,
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
    /// Ops and op queries a participant refused 409 `op_id_conflict`, for
    /// `twopc_saga_op_id_conflicts_total`.
    op_id_conflicts: AtomicU64,
}

impl SagaShell {
    pub fn new(engine: SagaEngine) -> SagaShell {
        SagaShell {
            engine: Mutex::new(engine),
            clock: LeaseClock::starting_at(now_ms()),
            waiters: Mutex::new(HashMap::new()),
            next_waiter: AtomicU64::new(1),
            step_retries: AtomicU64::new(0),
            op_id_conflicts: AtomicU64::new(0),
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

    /// The saga table's numbers for `/metrics` (`twopc_sagas{state=...}` and the rest).
    pub fn saga_numbers(&self) -> crate::metrics::SagaNumbers {
        let (by_state, compensations_failing) = {
            let engine = self.sagas.lock();
            (engine.counts(), engine.compensations_failing())
        };
        crate::metrics::SagaNumbers {
            by_state,
            compensations_failing,
            resolved_by_hand: self.lock_engine().hand_resolved_count(),
            step_retries: self.sagas.step_retries.load(Ordering::Relaxed),
            op_id_conflicts: self.sagas.op_id_conflicts.load(Ordering::Relaxed),
        }
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
                    // The action's payload, whose digest the participant checks against the
                    // op it recorded under this op id.
                    let action =
                        core.sagas.lock().get(&id).and_then(|s| {
                            s.begin.request.steps.get(step).map(|s| s.action.clone())
                        });
                    let answer = core
                        .probe_op(&participant, &op_id, action.as_ref(), timeout_ms)
                        .await;
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

    /// One action or compensation, its answer read by [`op_outcome`].
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
        match answer {
            Err(e) => SagaOpOutcome::Unknown {
                error: truncate(e.to_string(), REASON_LEN_MAX),
            },
            Ok(answer) => {
                if let Some(conflict) = op_id_conflict(answer.status, &answer.body) {
                    self.sagas.op_id_conflicts.fetch_add(1, Ordering::Relaxed);
                    warn!(saga = %request.saga_id, op_id = %request.op_id, %participant, %conflict,
                          "a participant holds this op id from this coordinator with another \
                           payload: the op fails; an operator should find out how the saga id \
                           came to be used twice");
                }
                op_outcome(answer.status, &answer.body)
            }
        }
    }

    /// `GET {base}/saga/ops/{op_id}?coordinator_id=..&payload_digest=..`, its answer read by
    /// [`probe_answer`]: only this coordinator's record of the op, and only if it was recorded
    /// with `action` as its payload.
    async fn probe_op(
        &self,
        participant: &protocol::ParticipantName,
        op_id: &str,
        action: Option<&serde_json::Value>,
        timeout_ms: u64,
    ) -> ProbeAnswer {
        let Some(endpoint) = self.participants.get(participant) else {
            return ProbeAnswer::NoAnswer(format!("{participant} is not configured"));
        };
        let query = OpQuery::from_coordinator(&self.identity.coordinator_id, action);
        let path = routes::saga_op_query_path(op_id, &query);
        match endpoint.get(&path, Duration::from_millis(timeout_ms)).await {
            Err(e) => ProbeAnswer::NoAnswer(e.to_string()),
            Ok(answer) => {
                if let Some(conflict) = op_id_conflict(answer.status, &answer.body) {
                    self.sagas.op_id_conflicts.fetch_add(1, Ordering::Relaxed);
                    warn!(%op_id, %participant, %conflict,
                          "a participant holds this op id from this coordinator with another \
                           payload: the action was never applied there");
                }
                let read = probe_answer(answer.status, &answer.body);
                if let ProbeAnswer::NoAnswer(why) = &read
                    && answer.status == 200
                {
                    warn!(%participant, error = %why, "malformed op query answer");
                }
                read
            }
        }
    }
}

/// The participant's message when an answer is 409 `op_id_conflict`.
fn op_id_conflict(status: u16, body: &[u8]) -> Option<String> {
    let body: protocol::ErrorBody = serde_json::from_slice(body).ok()?;
    (status == 409 && body.error == protocol::ErrorCode::OpIdConflict).then_some(body.message)
}

/// The reason a step shows for an op refused `op_id_conflict`.
fn conflict_reason(message: &str) -> String {
    truncate(format!("op_id_conflict: {message}"), REASON_LEN_MAX)
}

/// How the shell reads an action's or a compensation's HTTP answer. A 200 with
/// `{"status":"done"|"failed"}` is the answer. A 409 `op_id_conflict` is a definite failure of
/// this op (`failed`): the participant recorded the op id from this coordinator id with another
/// payload (the saga id was used before, and this coordinator's log lost it: a restored
/// backup, a copied data directory), so this payload was not applied and, under this op id,
/// never will be; asking again would only hear the same refusal. A failed action is not
/// compensated and the saga goes backward; a failed compensation is retried and shows as
/// `compensation_failing` (counted in `twopc_saga_compensations_failing`) until an operator
/// looks. Anything else (5xx, `not_ready`, malformed) is unknown.
pub fn op_outcome(status: u16, body: &[u8]) -> SagaOpOutcome {
    if let Some(message) = op_id_conflict(status, body) {
        return SagaOpOutcome::Failed {
            reason: conflict_reason(&message),
        };
    }
    let unknown = |error: String| SagaOpOutcome::Unknown {
        error: truncate(error, REASON_LEN_MAX),
    };
    if status != 200 {
        return unknown(format!("HTTP {status}: {}", String::from_utf8_lossy(body)));
    }
    match serde_json::from_slice::<SagaOpAnswer>(body) {
        Ok(SagaOpAnswer::Done { result }) => SagaOpOutcome::Done { result },
        Ok(SagaOpAnswer::Failed { reason }) => SagaOpOutcome::Failed {
            reason: truncate(reason, REASON_LEN_MAX),
        },
        Err(e) => unknown(format!("malformed answer: {e}")),
    }
}

/// How the shell reads an op query's HTTP answer. A 409 `op_id_conflict` proves the action,
/// with this saga's payload, was never applied there (the op id holds another payload from
/// this coordinator id, and refuses this one for good): `failed`. A 422
/// `coordinator_id_required` (a participant's answer to a query without a coordinator id; this
/// shell always sends one), a 5xx or anything malformed is no answer: the op stays unknown and
/// is asked about again.
pub fn probe_answer(status: u16, body: &[u8]) -> ProbeAnswer {
    if let Some(message) = op_id_conflict(status, body) {
        return ProbeAnswer::Failed(conflict_reason(&message));
    }
    if status != 200 {
        return ProbeAnswer::NoAnswer(format!("op query: HTTP {status}"));
    }
    match serde_json::from_slice::<OpStatusResponse>(body) {
        Ok(status) => match status.status {
            OpStatus::Done => ProbeAnswer::Done(status.result),
            OpStatus::Failed => {
                ProbeAnswer::Failed(truncate(status.reason.unwrap_or_default(), REASON_LEN_MAX))
            }
            OpStatus::Compensated => ProbeAnswer::Compensated,
            OpStatus::NotFound => ProbeAnswer::NotFound,
        },
        Err(e) => ProbeAnswer::NoAnswer(format!("malformed op query answer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"error": code, "message": "why"})).unwrap()
    }

    #[test]
    fn only_an_op_id_conflict_among_the_refusals_is_a_definite_failure() {
        assert_eq!(
            op_outcome(409, &error("op_id_conflict")),
            SagaOpOutcome::Failed {
                reason: "op_id_conflict: why".into()
            }
        );
        assert_eq!(
            probe_answer(409, &error("op_id_conflict")),
            ProbeAnswer::Failed("op_id_conflict: why".into())
        );
        // Another 409, a 422 for want of a coordinator id, a 503: nothing is known.
        for (status, code) in [
            (409, "stale_epoch"),
            (422, "coordinator_id_required"),
            (503, "not_ready"),
        ] {
            assert!(
                matches!(
                    op_outcome(status, &error(code)),
                    SagaOpOutcome::Unknown { .. }
                ),
                "{code}"
            );
            assert!(
                matches!(probe_answer(status, &error(code)), ProbeAnswer::NoAnswer(_)),
                "{code}"
            );
        }
        // A 200 is read as before.
        assert_eq!(
            op_outcome(200, br#"{"status":"failed","reason":"no stock"}"#),
            SagaOpOutcome::Failed {
                reason: "no stock".into()
            }
        );
        assert_eq!(
            probe_answer(200, br#"{"op_id":"s:a:action","status":"not_found"}"#),
            ProbeAnswer::NotFound
        );
        assert!(matches!(probe_answer(200, b"{}"), ProbeAnswer::NoAnswer(_)));
    }
}
