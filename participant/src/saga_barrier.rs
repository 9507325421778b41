//! What the saga barrier remembers, one floor below the engine and its log: the answer each
//! op got (logged in `Record::SagaOp`, so the record stands on this and not on the engine),
//! the entry per step (kept in snapshots), and which entry an op reads and writes.
//!
//! Entries are keyed by coordinator id, saga id and step (issue 25): a saga id is unique only
//! within one coordinator, and a second coordinator, or one on a wiped data directory (a new
//! coordinator id), may use it again. An entry restored from a snapshot written before keys
//! carried the coordinator id has none (a legacy entry); see [`resolve`] for whom it answers.

use std::collections::BTreeMap;

use protocol::CoordinatorId;
use protocol::digest::Digest;
use protocol::saga::{OpKind, SagaOpAnswer};
use serde::{Deserialize, Serialize};

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
    pub(crate) fn to_wire(&self) -> SagaOpAnswer {
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

/// Which step an entry is about. The field order is the map's order: every coordinator's entry
/// for one step sits together, the legacy one first (`None` sorts first), so a question that
/// names no coordinator reads them all in one short range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepKey {
    pub saga_id: String,
    pub step: String,
    /// The coordinator whose ops these are; `None` only for an entry restored from a format-2
    /// snapshot, written before keys carried it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_id: Option<CoordinatorId>,
}

impl StepKey {
    pub(crate) fn own(coordinator_id: &CoordinatorId, saga_id: &str, step: &str) -> StepKey {
        StepKey {
            saga_id: saga_id.to_string(),
            step: step.to_string(),
            coordinator_id: Some(coordinator_id.clone()),
        }
    }

    pub fn legacy(saga_id: &str, step: &str) -> StepKey {
        StepKey {
            saga_id: saga_id.to_string(),
            step: step.to_string(),
            coordinator_id: None,
        }
    }
}

/// One saga step as this participant saw it from one coordinator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierEntry {
    pub action: Option<BarrierAnswer>,
    pub compensation: Option<BarrierAnswer>,
    /// The digest of the payload each op was first recorded with (`Digest::of_payload`):
    /// another payload under the same op id is a conflict. Absent in legacy entries, which
    /// are not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_digest: Option<Digest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation_digest: Option<Digest>,
}

impl BarrierEntry {
    pub(crate) fn answer(&self, kind: OpKind) -> Option<&BarrierAnswer> {
        match kind {
            OpKind::Action => self.action.as_ref(),
            OpKind::Compensation => self.compensation.as_ref(),
        }
    }

    fn digest(&self, kind: OpKind) -> Option<Digest> {
        match kind {
            OpKind::Action => self.action_digest,
            OpKind::Compensation => self.compensation_digest,
        }
    }

    /// Whether `digest` differs from the one the op was recorded with (never for a legacy
    /// entry, which kept none).
    pub(crate) fn conflicts(&self, kind: OpKind, digest: Digest) -> bool {
        self.answer(kind).is_some() && self.digest(kind).is_some_and(|first| first != digest)
    }

    /// Records the op's first answer and its payload's digest; a later one changes nothing.
    pub(crate) fn record(&mut self, kind: OpKind, answer: BarrierAnswer, digest: Digest) {
        let (slot, digest_slot) = match kind {
            OpKind::Action => (&mut self.action, &mut self.action_digest),
            OpKind::Compensation => (&mut self.compensation, &mut self.compensation_digest),
        };
        if slot.is_none() {
            *slot = Some(answer);
            *digest_slot = Some(digest);
        }
    }
}

/// Every saga step seen, keyed by saga id, step and coordinator id.
pub type Barrier = BTreeMap<StepKey, BarrierEntry>;

/// The entry a coordinator's op on `saga_id:step` reads and writes, live and in replay alike:
///
/// - its own, if there is one;
/// - else a legacy entry for that step, if there is one. The build that wrote it shared one
///   entry among every coordinator and kept no coordinator id, so it may well be this
///   coordinator's own op, already applied: answering from it as that build did is the only
///   choice that never applies an op twice (a fresh entry would apply it again, or fence an
///   applied action with a null compensation). The price is that a second coordinator reusing
///   the saga id still meets that one old entry (docs/participants.md, "Sagas");
/// - else a new one of its own.
pub(crate) fn resolve(
    barrier: &Barrier,
    coordinator_id: &CoordinatorId,
    saga_id: &str,
    step: &str,
) -> StepKey {
    let own = StepKey::own(coordinator_id, saga_id, step);
    if barrier.contains_key(&own) {
        return own;
    }
    let legacy = StepKey::legacy(saga_id, step);
    if barrier.contains_key(&legacy) {
        legacy
    } else {
        own
    }
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

/// Splits a format-2 snapshot's barrier key, `saga id:step` (step names hold no ':').
pub fn parse_legacy_key(key: &str) -> Option<StepKey> {
    let (saga, step) = key.rsplit_once(':')?;
    (!saga.is_empty() && !step.is_empty()).then(|| StepKey::legacy(saga, step))
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
        assert_eq!(
            parse_legacy_key("order:7:charge"),
            Some(StepKey::legacy("order:7", "charge"))
        );
        assert_eq!(parse_legacy_key("charge"), None);
    }
}
