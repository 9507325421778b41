//! The saga branch barrier (issue 13; DTM's name for it): the three guards that make a saga
//! step safe under retries, reordering and crashes, as a pure part of the engine.
//!
//! - a compensation for an action that never arrived records that fact and succeeds (null
//!   compensation);
//! - an action arriving after its compensation is refused (hanging action);
//! - a duplicate action or compensation answers the first answer (idempotent).
//!
//! Each decision that changes anything leaves as one `Record::SagaOp` holding both the guard and
//! the effect's payload: replay re-applies exactly the effects whose record is in the log, so
//! the guard and the effect are durable together or not at all. The barrier never decides
//! anything about 2PC: a saga op on a key a prepared transaction locks is refused for now
//! (`Busy`, no record), and the coordinator asks again under the same op id.

use std::collections::BTreeMap;

use protocol::saga::{OpKind, OpStatus, OpStatusResponse, SagaOpAnswer, SagaOpRequest};
use serde::{Deserialize, Serialize};

use super::Engine;
use crate::record::Record;
use crate::resource::Resource;

/// What the barrier recorded for one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum BarrierAnswer {
    /// The effect was applied.
    Done {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<serde_json::Value>,
    },
    /// A definite business failure: nothing was applied.
    Failed { reason: String },
    /// A compensation with nothing to undo (the action never arrived, or failed).
    NullCompensation,
    /// An action that arrived after its step's compensation: refused, nothing applied.
    RefusedHanging,
}

impl BarrierAnswer {
    fn to_wire(&self) -> SagaOpAnswer {
        match self {
            BarrierAnswer::Done { result } => SagaOpAnswer::Done {
                result: result.clone(),
            },
            BarrierAnswer::NullCompensation => SagaOpAnswer::Done {
                result: Some(serde_json::json!({"null_compensation": true})),
            },
            BarrierAnswer::Failed { reason } => SagaOpAnswer::Failed {
                reason: reason.clone(),
            },
            BarrierAnswer::RefusedHanging => SagaOpAnswer::Failed {
                reason: "hanging action refused: this step was compensated before the action \
                         arrived"
                    .to_string(),
            },
        }
    }
}

/// One saga step as this participant saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierEntry {
    pub action: Option<BarrierAnswer>,
    pub compensation: Option<BarrierAnswer>,
}

/// Every saga step seen, keyed by `saga id:step`.
pub type Barrier = BTreeMap<String, BarrierEntry>;

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
}

fn key(saga_id: &str, step: &str) -> String {
    format!("{saga_id}:{step}")
}

/// Splits `saga id:step:action|compensation` (step names hold no ':').
pub fn parse_op_id(op_id: &str) -> Option<(&str, &str, OpKind)> {
    let (rest, kind) = op_id.rsplit_once(':')?;
    let (saga, step) = rest.rsplit_once(':')?;
    let kind = match kind {
        "action" => OpKind::Action,
        "compensation" => OpKind::Compensation,
        _ => return None,
    };
    (!saga.is_empty() && !step.is_empty()).then_some((saga, step, kind))
}

impl<R: Resource> Engine<R> {
    /// Runs one action or compensation through the barrier. Applies the effect in memory when
    /// it records `Done`; the shell makes the record durable before answering.
    pub fn saga_op(&mut self, kind: OpKind, request: &SagaOpRequest, now_ms: u64) -> SagaStepped {
        let key = key(request.saga_id.as_str(), &request.step);
        let entry = self.saga_barrier.get(&key).cloned().unwrap_or_default();
        let earlier = match kind {
            OpKind::Action => &entry.action,
            OpKind::Compensation => &entry.compensation,
        };
        if let Some(first) = earlier {
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
                match self.try_effect(kind, &request.payload) {
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
        self.absorb_saga_op(&key, kind, answer.clone());
        SagaStepped::Answer {
            answer: answer.to_wire(),
            record: Some(record),
        }
    }

    /// Checks and applies `payload` at once (no prepare), unless a key is locked.
    fn try_effect(&mut self, kind: OpKind, payload: &serde_json::Value) -> Result<(), Attempted> {
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
        if let Some(locked) = self
            .resource
            .lock_keys(&staged)
            .into_iter()
            .find(|k| self.locks.holder(k).is_some())
        {
            return Err(Attempted::Busy(format!(
                "key {locked:?} is locked by a prepared transaction; ask again later"
            )));
        }
        self.resource.check(&staged).map_err(Attempted::Failed)?;
        self.resource.apply(staged);
        Ok(())
    }

    fn absorb_saga_op(&mut self, key: &str, kind: OpKind, answer: BarrierAnswer) {
        let entry = self.saga_barrier.entry(key.to_string()).or_default();
        let slot = match kind {
            OpKind::Action => &mut entry.action,
            OpKind::Compensation => &mut entry.compensation,
        };
        slot.get_or_insert(answer);
    }

    /// Replays a logged saga op: the guard, and the effect if it was applied.
    pub(crate) fn replay_saga_op(
        &mut self,
        saga_id: &str,
        step: &str,
        kind: OpKind,
        answer: BarrierAnswer,
        payload: &serde_json::Value,
    ) {
        let key = key(saga_id, step);
        let entry = self.saga_barrier.get(&key);
        let seen = match kind {
            OpKind::Action => entry.and_then(|e| e.action.as_ref()),
            OpKind::Compensation => entry.and_then(|e| e.compensation.as_ref()),
        };
        if seen.is_some() {
            return;
        }
        if matches!(answer, BarrierAnswer::Done { .. }) {
            // It was checked and applied before this record was written; applying it again
            // in log order gives the same state.
            if let Ok(staged) = self.resource.parse(payload) {
                self.resource.apply(staged);
            }
        }
        self.absorb_saga_op(&key, kind, answer);
    }

    /// `GET /saga/ops/{op_id}`.
    pub fn saga_op_status(&self, op_id: &str) -> OpStatusResponse {
        let mut status = OpStatusResponse {
            op_id: op_id.to_string(),
            status: OpStatus::NotFound,
            result: None,
            reason: None,
        };
        let Some((saga, step, kind)) = parse_op_id(op_id) else {
            return status;
        };
        let Some(entry) = self.saga_barrier.get(&key(saga, step)) else {
            return status;
        };
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
        status
    }

    pub fn saga_barrier_len(&self) -> usize {
        self.saga_barrier.len()
    }
}

enum Attempted {
    Busy(String),
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_ids_split_from_the_right() {
        assert_eq!(
            parse_op_id("order:7:charge:action"),
            Some(("order:7", "charge", OpKind::Action))
        );
        assert_eq!(
            parse_op_id("o:s:compensation"),
            Some(("o", "s", OpKind::Compensation))
        );
        assert_eq!(parse_op_id("o:s:other"), None);
        assert_eq!(parse_op_id("s:action"), None);
    }
}
