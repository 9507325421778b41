//! Answers coming back: an action's or compensation's outcome, and an op query's answer that
//! settles an unknown step. A late or duplicate answer changes nothing; an unknown one, or a
//! failing compensation, is retried after a backoff.

use protocol::TxId;
use protocol::saga::OpKind;

use crate::records::{SagaOpOutcome, SagaRecord, SagaStepOutcome};

use super::SagaEngine;
use super::entry::Busy;
use super::io::{ProbeAnswer, SagaCommand};

impl SagaEngine {
    /// An action or compensation came back (`SagaEvent::OpAnswered`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn op_answered(
        &mut self,
        id: TxId,
        step: usize,
        kind: OpKind,
        outcome: SagaOpOutcome,
        now_ms: u64,
        jitter: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        let Some(saga) = self.sagas.get(&id) else {
            return;
        };
        // A late or duplicate answer (the op was retried since) changes nothing.
        if saga.busy != Busy::Op(step, kind) {
            return;
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
            out,
        );
        self.after_answer(&id, retry, now_ms, jitter, out);
    }

    /// An op query came back (`SagaEvent::ProbeAnswered`).
    pub(super) fn probe_answered(
        &mut self,
        id: TxId,
        step: usize,
        answer: ProbeAnswer,
        now_ms: u64,
        jitter: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        let Some(saga) = self.sagas.get(&id) else {
            return;
        };
        if saga.busy != Busy::Probe(step) {
            return;
        }
        let learned = match answer {
            ProbeAnswer::Done(result) => Some((OpKind::Action, SagaOpOutcome::Done { result })),
            ProbeAnswer::Failed(reason) => Some((OpKind::Action, SagaOpOutcome::Failed { reason })),
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
                out,
            );
        }
        self.after_answer(&id, retry, now_ms, jitter, out);
    }
}
