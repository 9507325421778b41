//! How a saga is shown: each step's status as the facts and what is in flight say, and the
//! answer clients and operators read.

use protocol::saga::{OpKind, SagaResponse, SagaStepStatus, StepStatus, op_id};

use crate::saga_facts::Fact;

use super::entry::{Busy, SagaEntry};

impl SagaEntry {
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
