//! The saga branch barrier (issue 13; DTM's name for it): the three guards that make a saga
//! step safe under retries, reordering and crashes, as a pure part of the engine.
//!
//! - a compensation for an action that never arrived records that fact and succeeds (null
//!   compensation);
//! - an action arriving after its compensation is refused (hanging action);
//! - a duplicate action or compensation answers the first answer (idempotent), if it carries
//!   the payload the first one did; another payload under the same op id is refused
//!   (`op_id_conflict`), never handed the first op's answer.
//!
//! What the barrier remembers per step, and which entry an op reads and writes, is in
//! `crate::saga_barrier` (re-exported here), below the log's records.
//!
//! Each decision that changes anything leaves as one `Record::SagaOp` holding both the guard and
//! the effect's payload: replay re-applies exactly the effects whose record is in the log, so
//! the guard and the effect are durable together or not at all. The record names the
//! coordinator and holds the payload, so replay rebuilds keys and digests from it. The barrier
//! never decides anything about 2PC: a saga op on a key a prepared transaction locks is refused
//! for now (`Busy`, no record), and the coordinator asks again under the same op id.

use protocol::CoordinatorId;
use protocol::digest::Digest;
use protocol::saga::{OpKind, OpQuery, OpStatus, OpStatusResponse, SagaOpAnswer, SagaOpRequest};

use super::Engine;
use crate::record::Record;
use crate::resource::Resource;
use crate::saga_barrier::resolve;
pub use crate::saga_barrier::{
    Barrier, BarrierAnswer, BarrierEntry, StepKey, parse_legacy_key, parse_op_id,
};

/// What one saga op leaves for the shell.
#[derive(Debug, Clone, PartialEq)]
pub enum SagaStepped {
    /// Answer this (after `record` is durable, if there is one).
    Answer {
        answer: SagaOpAnswer,
        record: Option<Record>,
    },
    /// Not now (keys locked by a prepared transaction); nothing recorded.
    Busy(String),
    /// The op id was recorded with another payload from the same coordinator: 409
    /// `op_id_conflict` (behind a barrier, as a repeat: the refusal rests on that record);
    /// nothing recorded, nothing applied.
    Conflict(String),
}

/// Why `GET /saga/ops/{op_id}` gets no status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpQueryRefused {
    /// 422 `coordinator_id_required`.
    #[error(
        "op {op_id}: this participant holds a record of that step and cannot tell whether it is \
         the asking coordinator's (saga ids are unique only within one coordinator); ask with \
         ?coordinator_id="
    )]
    CoordinatorIdRequired { op_id: String },
    /// 409 `op_id_conflict`: the asker's payload is not the one recorded under this op id.
    #[error(
        "op {op_id} was recorded here with another payload from this coordinator: the payload \
         you sent under it was never applied here, and the recorded answer is not yours"
    )]
    Conflict { op_id: String },
}

fn conflict_message(op_id: &str, coordinator_id: &CoordinatorId) -> String {
    format!(
        "op_id {op_id:?} from coordinator {coordinator_id} was already used with another payload: \
         this payload is not applied, and the first op's answer is not this op's"
    )
}

impl<R: Resource> Engine<R> {
    /// Runs one action or compensation through the barrier. Applies the effect in memory when
    /// it records `Done`; the shell makes the record durable before answering.
    pub fn saga_op(&mut self, kind: OpKind, request: &SagaOpRequest, now_ms: u64) -> SagaStepped {
        let key = resolve(
            &self.saga_barrier,
            &request.coordinator_id,
            request.saga_id.as_str(),
            &request.step,
        );
        let digest = Digest::of_payload(&request.payload);
        let entry = self.saga_barrier.get(&key).cloned().unwrap_or_default();
        if entry.conflicts(kind, digest) {
            return SagaStepped::Conflict(conflict_message(
                &request.op_id,
                &request.coordinator_id,
            ));
        }
        if let Some(first) = entry.answer(kind) {
            return SagaStepped::Answer {
                answer: first.to_wire(),
                record: None,
            };
        }
        let answer = match kind {
            OpKind::Action if entry.compensation.is_some() => BarrierAnswer::RefusedHanging,
            OpKind::Compensation if !matches!(entry.action, Some(BarrierAnswer::Done { .. })) => {
                BarrierAnswer::NullCompensation
            }
            OpKind::Action | OpKind::Compensation => {
                match self.try_effect(kind, &request.payload, now_ms) {
                    Ok(()) => BarrierAnswer::Done { result: None },
                    Err(Attempted::Busy(why)) => return SagaStepped::Busy(why),
                    Err(Attempted::Failed(reason)) if kind == OpKind::Action => {
                        BarrierAnswer::Failed { reason }
                    }
                    // A compensation that cannot be applied now is not recorded: it is retried
                    // (and stays visible as compensation_failing at the coordinator).
                    Err(Attempted::Failed(reason)) => {
                        return SagaStepped::Answer {
                            answer: SagaOpAnswer::Failed { reason },
                            record: None,
                        };
                    }
                }
            }
        };
        let record = Record::SagaOp {
            saga_id: request.saga_id.clone(),
            step: request.step.clone(),
            op_id: request.op_id.clone(),
            kind,
            coordinator_id: request.coordinator_id.clone(),
            epoch: request.epoch,
            answer: answer.clone(),
            payload: request.payload.clone(),
            at_ms: now_ms,
        };
        self.saga_barrier
            .entry(key)
            .or_default()
            .record(kind, answer.clone(), digest);
        SagaStepped::Answer {
            answer: answer.to_wire(),
            record: Some(record),
        }
    }

    /// Checks and applies `payload` at once (no prepare), unless a key is locked.
    /// Checks and applies `payload` at once (no prepare), unless a key, or the fence of a
    /// resource it claims, is locked. A `fence` op in the payload goes through the same check
    /// as a fenced write or a 2PC fence op (proof or jump bound, then the highest token): a
    /// stale holder's step is a definite failure, never applied; applied, it raises the
    /// resource's highest token.
    fn try_effect(
        &mut self,
        kind: OpKind,
        payload: &serde_json::Value,
        now_ms: u64,
    ) -> Result<(), Attempted> {
        if kind == OpKind::Compensation && payload.is_null() {
            return Err(Attempted::Failed(
                "this step has no compensation and its action was applied: it cannot be undone"
                    .to_string(),
            ));
        }
        let staged = self
            .resource
            .parse(payload)
            .map_err(|e| Attempted::Failed(format!("invalid payload: {e}")))?;
        let claims = crate::fence::claims_in(payload)
            .map_err(|e| Attempted::Failed(format!("invalid payload: {}", e.0)))?;
        let keys = crate::locks::lock_keys(self.resource.lock_keys(&staged), &claims);
        if let Some(locked) = keys.iter().find(|k| self.locks.holder(k).is_some()) {
            return Err(Attempted::Busy(format!(
                "key {locked:?} is locked by a prepared transaction; ask again later"
            )));
        }
        self.fences
            .check_all(&claims, &self.config.fence)
            .map_err(|refusal| Attempted::Failed(refusal.to_string()))?;
        self.resource.check(&staged).map_err(Attempted::Failed)?;
        self.resource.apply(staged);
        for claim in &claims {
            self.fences.accept(claim, now_ms);
        }
        Ok(())
    }

    /// Replays a logged saga op: the guard under the entry the live op used (the record names
    /// its coordinator; [`resolve`] picks the same entry it did), and the effect if it was
    /// applied.
    pub(crate) fn replay_saga_op(&mut self, logged: LoggedSagaOp<'_>) {
        let LoggedSagaOp {
            coordinator_id,
            saga_id,
            step,
            kind,
            answer,
            payload,
            at_ms,
        } = logged;
        let key = resolve(&self.saga_barrier, coordinator_id, saga_id, step);
        if self
            .saga_barrier
            .get(&key)
            .is_some_and(|entry| entry.answer(kind).is_some())
        {
            return;
        }
        if matches!(answer, BarrierAnswer::Done { .. }) {
            // It was checked and applied before this record was written; applying it again
            // in log order gives the same state, fences included.
            if let Ok(staged) = self.resource.parse(payload) {
                self.resource.apply(staged);
            }
            for claim in crate::fence::claims_in(payload).unwrap_or_default() {
                self.fences.accept(&claim, at_ms);
            }
        }
        self.saga_barrier
            .entry(key)
            .or_default()
            .record(kind, answer, Digest::of_payload(payload));
    }

    /// `GET /saga/ops/{op_id}`: what the barrier holds of that op for the asking coordinator.
    pub fn saga_op_status(
        &self,
        op_id: &str,
        query: &OpQuery,
    ) -> Result<OpStatusResponse, OpQueryRefused> {
        let mut status = OpStatusResponse {
            op_id: op_id.to_string(),
            status: OpStatus::NotFound,
            result: None,
            reason: None,
        };
        let Some((saga, step, kind)) = parse_op_id(op_id) else {
            return Ok(status);
        };
        let entry = match &query.coordinator_id {
            Some(coordinator_id) => {
                self.saga_barrier
                    .get(&resolve(&self.saga_barrier, coordinator_id, saga, step))
            }
            // An older coordinator's question. `not_found` is the truth for every asker only
            // when nobody's op on the step is recorded; any entry might be another
            // coordinator's, and answering from it (or `not_found` beside it, which makes the
            // asker resend or fence) could be wrong for this one: it gets no answer.
            None if self.step_entries(saga, step).next().is_some() => {
                return Err(OpQueryRefused::CoordinatorIdRequired {
                    op_id: op_id.to_string(),
                });
            }
            None => None,
        };
        let Some(entry) = entry else {
            return Ok(status);
        };
        if let Some(asked) = query.payload_digest
            && entry.conflicts(kind, asked)
        {
            return Err(OpQueryRefused::Conflict {
                op_id: op_id.to_string(),
            });
        }
        let compensated = entry.compensation.is_some();
        match (kind, &entry.action) {
            (OpKind::Compensation, _) | (OpKind::Action, _) if compensated => {
                status.status = OpStatus::Compensated
            }
            (OpKind::Action, Some(BarrierAnswer::Done { result })) => {
                status.status = OpStatus::Done;
                status.result = result.clone();
            }
            (OpKind::Action, Some(BarrierAnswer::Failed { reason })) => {
                status.status = OpStatus::Failed;
                status.reason = Some(reason.clone());
            }
            _ => {}
        }
        Ok(status)
    }

    /// Every coordinator's entry for one step (the legacy one first).
    fn step_entries<'a>(
        &'a self,
        saga: &'a str,
        step: &'a str,
    ) -> impl Iterator<Item = (&'a StepKey, &'a BarrierEntry)> + 'a {
        self.saga_barrier
            .range(StepKey::legacy(saga, step)..)
            .take_while(move |(key, _)| key.saga_id == saga && key.step == step)
    }

    pub fn saga_barrier_len(&self) -> usize {
        self.saga_barrier.len()
    }

    /// The barrier's entries (operators' and tests' view).
    pub fn saga_barrier(&self) -> &Barrier {
        &self.saga_barrier
    }
}

/// A logged saga op as replay needs it.
pub(crate) struct LoggedSagaOp<'a> {
    pub coordinator_id: &'a CoordinatorId,
    pub saga_id: &'a str,
    pub step: &'a str,
    pub kind: OpKind,
    pub answer: BarrierAnswer,
    pub payload: &'a serde_json::Value,
    pub at_ms: u64,
}

enum Attempted {
    Busy(String),
    Failed(String),
}

#[cfg(test)]
#[path = "saga_tests.rs"]
mod tests;
