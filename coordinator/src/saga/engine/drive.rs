//! Driving a saga: a new one begins and its deadline is armed; then, whenever nothing is in
//! flight, the planner says what comes next (the next action, a reconciling op query, a
//! fence, a compensation, or the end) and it is started here.

use protocol::TxId;
use protocol::saga::{OpKind, SagaRequest, SagaState, op_id};

use crate::digest::Digest;
use crate::engine::{WaiterId, retry_delay_ms};
use crate::records::{SagaBeginRecord, SagaEndRecord, SagaIdRecord, SagaRecord, SagaStepStarted};
use crate::saga::planner::{self, Decision};

use super::SagaEngine;
use super::entry::{Busy, HeldSubmit};
use super::io::{SagaCommand, SagaReply, SagaWait};

impl SagaEngine {
    pub(super) fn submit(
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
    pub(super) fn deadline(&mut self, id: &TxId, now_ms: u64, out: &mut Vec<SagaCommand>) {
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

    pub(super) fn after_answer(
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
    pub(super) fn drive(&mut self, id: &TxId, now_ms: u64, out: &mut Vec<SagaCommand>) {
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

    pub(super) fn start_op(
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
