//! Refused fences: a participant that refuses the compensation of a step it has no record of
//! (while its window lasts), and the check that, once healed, such a fence shows as
//! `compensation_failing` and holds no other compensation up.

use protocol::saga::{OpKind, OpStatus, SagaOpAnswer, SagaOpRequest, SagaState, StepStatus, op_id};

use super::{FENCE_HOLD_MS, HEAL_AT_MS, Msg, World};

impl World {
    /// Once healed, a fence refused for `FENCE_HOLD_MS` shows as `compensation_failing`, is
    /// counted, and holds no other compensation up.
    pub(super) fn check_fences(&mut self) {
        let Some(engine) = &self.coordinator else {
            return;
        };
        let now = self.coordinator_now();
        let mut found = None;
        let mut held = 0;
        for ((id, step), first) in &self.fence_refusals {
            if self.now < (*first).max(HEAL_AT_MS) + FENCE_HOLD_MS {
                continue;
            }
            let Some(view) = engine.get(id).map(|saga| saga.view(now)) else {
                continue;
            };
            let refused = |name: &String| {
                self.fence_refusals
                    .contains_key(&(id.clone(), name.clone()))
            };
            let wrong = match view.state {
                SagaState::Compensated => {
                    Some("compensated while its fence is refused".to_string())
                }
                SagaState::Compensating => view.steps.iter().find_map(|s| {
                    let failing = s.status == StepStatus::CompensationFailing;
                    // Done with, never to be done, or a refused fence of its own.
                    let settled = matches!(
                        s.status,
                        StepStatus::Compensated | StepStatus::Failed | StepStatus::Pending
                    ) || (failing && refused(&s.name));
                    if &s.name == step && !failing {
                        Some(format!(
                            "step {} shows {:?}, not compensation_failing, while its fence is \
                             refused",
                            s.name, s.status
                        ))
                    } else if !settled {
                        Some(format!(
                            "step {} is {:?}: held up behind a refused fence",
                            s.name, s.status
                        ))
                    } else {
                        None
                    }
                }),
                _ => None,
            };
            if view.state == SagaState::Compensating {
                held += 1;
            }
            if let Some(why) = wrong {
                found = Some(format!(
                    "saga {id}, fence of {step} refused since {first} ms: {why}: {}",
                    serde_json::to_string(&view).unwrap_or_default()
                ));
                break;
            }
        }
        if found.is_none() && engine.compensations_failing() < held {
            found = Some(format!(
                "compensations_failing is {} with {held} refused fences holding",
                engine.compensations_failing()
            ));
        }
        if let Some(why) = found {
            self.violated(why);
        }
    }

    /// A fence (a compensation of a step participant `to` has no record of) refused while
    /// its window lasts: `failed` or 503, nothing recorded. Any compensation the participant
    /// takes for the step ends its refusal.
    pub(super) fn refuses_fence(&mut self, to: usize, call: u64, request: &SagaOpRequest) -> bool {
        let key = (request.saga_id.clone(), request.step.clone());
        let action = op_id(&request.saga_id, &request.step, OpKind::Action);
        let asked = protocol::saga::OpQuery::from_coordinator(&request.coordinator_id, None);
        let fence = self.parts[to]
            .engine
            .saga_op_status(&action, &asked)
            .is_ok_and(|status| status.status == OpStatus::NotFound);
        if !fence || self.now >= self.fences_refused_until[to] {
            self.fence_refusals.remove(&key);
            return false;
        }
        self.stats.fences_refused += 1;
        self.fence_refusals.entry(key).or_insert(self.now);
        let answer = if self.rng.bool() {
            Some(SagaOpAnswer::Failed {
                reason: "the fence cannot be recorded now".into(),
            })
        } else {
            None
        };
        self.send(Msg::OpAnswer { call, answer });
        true
    }
}
