//! Each life's coordinator shell: a step's records durable at once (durability timing is the
//! `saga_world`'s subject), then its commands: timers, ops and op queries (naming this
//! coordinator and the action's digest, unless a mutation drops them), each call settled by
//! the first of its answer and its timeout.

use coordinator::records::LogRecord;
use coordinator::saga::engine::{SagaCommand, SagaEvent};
use protocol::saga::{OpKind, OpQuery, SagaOpRequest};
use protocol::{Epoch, ErrorBody, ErrorCode, TxId};

use super::{Call, Http, Msg, SagaReuseMutation, World, part_index};

impl World {
    /// Steps one life's engine as its shell does: the step's records durable first (here, at
    /// once), the engine told so, then the rest.
    pub(super) fn step(&mut self, life: usize, event: SagaEvent) {
        let Some(engine) = self.lives[life].engine.as_mut() else {
            return;
        };
        let mut durable = Vec::new();
        let mut rest = Vec::new();
        for command in engine.step(event) {
            match command {
                SagaCommand::Append(record) => {
                    if let LogRecord::Saga(saga) = &record {
                        durable.push(saga.saga_id().clone());
                    }
                    self.lives[life].log.push(record);
                }
                other => rest.push(other),
            }
        }
        if !durable.is_empty() {
            let now_ms = self.now;
            self.step(
                life,
                SagaEvent::Durable {
                    ids: durable,
                    now_ms,
                },
            );
        }
        for command in rest {
            self.execute(life, command);
        }
    }

    fn execute(&mut self, life: usize, command: SagaCommand) {
        let run = self.lives[life].run;
        match command {
            SagaCommand::Append(_) | SagaCommand::Reply { .. } => {}
            SagaCommand::ArmRetry { id, after_ms } => {
                let event = SagaEvent::RetryDue { id, now_ms: 0 };
                self.schedule(after_ms, Msg::Timer { life, run, event });
            }
            SagaCommand::ArmDeadline { id, after_ms } => {
                let event = SagaEvent::DeadlineDue { id, now_ms: 0 };
                self.schedule(after_ms, Msg::Timer { life, run, event });
            }
            SagaCommand::Send {
                id,
                step,
                kind,
                participant,
                op_id,
                payload,
                timeout_ms,
                ..
            } => {
                let call = self.new_call(life, &id, step, Some(kind));
                let to = part_index(participant.as_str());
                let step_name = self.step_of(life, &id, step).0;
                let request = SagaOpRequest {
                    saga_id: id,
                    step: step_name,
                    op_id,
                    coordinator_id: self.lives[life].coordinator_id.clone(),
                    epoch: Epoch(run),
                    payload,
                };
                self.schedule(timeout_ms, Msg::CallTimeout { call });
                self.send(Msg::Op {
                    call,
                    to,
                    kind,
                    request,
                });
            }
            SagaCommand::Probe {
                id,
                step,
                participant,
                op_id,
                timeout_ms,
            } => {
                let call = self.new_call(life, &id, step, None);
                let to = part_index(participant.as_str());
                let action = self.step_of(life, &id, step).1;
                let mut query =
                    OpQuery::from_coordinator(&self.lives[life].coordinator_id, Some(&action));
                match self.mutation {
                    Some(SagaReuseMutation::ProbeWithoutCoordinatorId) => {
                        query = OpQuery::default();
                    }
                    Some(SagaReuseMutation::ProbeWithoutDigest) => query.payload_digest = None,
                    Some(SagaReuseMutation::ConflictIsUnknown) | None => {}
                }
                self.schedule(timeout_ms, Msg::CallTimeout { call });
                self.send(Msg::Probe {
                    call,
                    to,
                    op_id,
                    query,
                });
            }
        }
    }

    /// The name and action of step `step` of saga `id` as life `life` defined it.
    fn step_of(&self, life: usize, id: &TxId, step: usize) -> (String, serde_json::Value) {
        self.lives[life]
            .requests
            .iter()
            .find(|(r, _)| r.id == *id)
            .and_then(|(r, _)| r.steps.get(step))
            .map(|s| (s.name.clone(), s.action.clone()))
            .unwrap_or_default()
    }

    fn new_call(&mut self, life: usize, id: &TxId, step: usize, kind: Option<OpKind>) -> u64 {
        self.next_call += 1;
        let call = Call {
            life,
            run: self.lives[life].run,
            id: id.clone(),
            step,
            kind,
        };
        self.calls.insert(self.next_call, call);
        self.next_call
    }

    /// The first of answer and timeout settles a call; later ones, and those of a run that
    /// crashed since, are ignored.
    pub(super) fn settle(&mut self, call: u64) -> Option<Call> {
        let found = self.calls.remove(&call)?;
        let life = &self.lives[found.life];
        (found.run == life.run && life.engine.is_some()).then_some(found)
    }

    pub(super) fn conflict_is_unknown(&self, http: &Http) -> bool {
        self.mutation == Some(SagaReuseMutation::ConflictIsUnknown)
            && serde_json::from_slice::<ErrorBody>(&http.1)
                .is_ok_and(|body| body.error == ErrorCode::OpIdConflict)
    }
}
