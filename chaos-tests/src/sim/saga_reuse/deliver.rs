//! What each message does where it arrives: a life's start and its clients' submits, ops and
//! op queries answered by a participant's barrier as HTTP status and body, those answers read
//! back with the coordinator's own functions, timeouts, timers and restarts.

use coordinator::runtime::{op_outcome, probe_answer};
use coordinator::saga::engine::{ProbeAnswer, SagaEngine, SagaEvent, SagaWait};
use participant::engine::saga::SagaStepped;
use participant::snapshot::Snapshot;
use participant::{ApiError, Engine, EngineConfig};
use protocol::ErrorCode;
use protocol::digest::{Digest, Fnv128};
use protocol::saga::OpKind;

use super::{CONFIG, Msg, World, error_http, fresh_participant};

impl World {
    pub(super) fn deliver(&mut self, msg: Msg) {
        let now = self.now;
        let jitter = self.rng.u64(..);
        match msg {
            Msg::Start(life) => {
                self.lives[life].started = true;
                for saga in 0..self.lives[life].requests.len() {
                    let at = self.rng.u64(0..2_000);
                    self.schedule(at, Msg::Submit { life, saga });
                    if self.rng.u32(0..100) < 20 {
                        let again = self.rng.u64(0..5_000);
                        self.schedule(again, Msg::Submit { life, saga });
                    }
                }
            }
            Msg::Submit { life, saga } => {
                if self.lives[life].retired {
                    return;
                }
                if self.lives[life].engine.is_none() {
                    // The client retries until the coordinator is back.
                    self.schedule(100, Msg::Submit { life, saga });
                    return;
                }
                let (request, _) = self.lives[life].requests[saga].clone();
                let digest = Digest(
                    Fnv128::default()
                        .field(&serde_json::to_vec(&request).unwrap_or_default())
                        .finish(),
                );
                let event = SagaEvent::Submit {
                    waiter: saga as u64,
                    wait: SagaWait::Accepted,
                    request,
                    digest,
                    now_ms: now,
                    client: None,
                };
                self.step(life, event);
            }
            Msg::Op {
                call,
                to,
                kind,
                request,
            } => {
                if !self.parts[to].up {
                    return;
                }
                let part = &mut self.parts[to];
                let http = match part.engine.saga_op(kind, &request, now) {
                    SagaStepped::Answer { answer, record } => {
                        part.log.extend(record);
                        (200, serde_json::to_vec(&answer).unwrap_or_default())
                    }
                    SagaStepped::Busy(why) => error_http(ErrorCode::NotReady, why),
                    SagaStepped::Conflict(why) => error_http(ErrorCode::OpIdConflict, why),
                };
                self.send(Msg::OpAnswer { call, http });
            }
            Msg::OpAnswer { call, http } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let outcome = if self.conflict_is_unknown(&http) {
                    coordinator::records::SagaOpOutcome::Unknown {
                        error: "op_id_conflict read as unknown".into(),
                    }
                } else {
                    op_outcome(http.0, &http.1)
                };
                let event = SagaEvent::OpAnswered {
                    id: found.id,
                    step: found.step,
                    kind: found.kind.unwrap_or(OpKind::Action),
                    outcome,
                    now_ms: now,
                    jitter,
                };
                self.step(found.life, event);
            }
            Msg::Probe {
                call,
                to,
                op_id,
                query,
            } => {
                if !self.parts[to].up {
                    return;
                }
                let http = match self.parts[to].engine.saga_op_status(&op_id, &query) {
                    Ok(status) => (200, serde_json::to_vec(&status).unwrap_or_default()),
                    Err(refused) => {
                        let refused = ApiError::from(refused);
                        error_http(refused.code, refused.message)
                    }
                };
                self.send(Msg::ProbeAnswer { call, http });
            }
            Msg::ProbeAnswer { call, http } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let answer = if self.conflict_is_unknown(&http) {
                    ProbeAnswer::NoAnswer("op_id_conflict read as unknown".into())
                } else {
                    probe_answer(http.0, &http.1)
                };
                let event = SagaEvent::ProbeAnswered {
                    id: found.id,
                    step: found.step,
                    answer,
                    now_ms: now,
                    jitter,
                };
                self.step(found.life, event);
            }
            Msg::CallTimeout { call } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let event = match found.kind {
                    Some(kind) => SagaEvent::OpAnswered {
                        id: found.id,
                        step: found.step,
                        kind,
                        outcome: coordinator::records::SagaOpOutcome::Unknown {
                            error: "timeout".into(),
                        },
                        now_ms: now,
                        jitter,
                    },
                    None => SagaEvent::ProbeAnswered {
                        id: found.id,
                        step: found.step,
                        answer: ProbeAnswer::NoAnswer("timeout".into()),
                        now_ms: now,
                        jitter,
                    },
                };
                self.step(found.life, event);
            }
            Msg::Timer { life, run, event } => {
                if run != self.lives[life].run {
                    return;
                }
                let event = match event {
                    SagaEvent::RetryDue { id, .. } => SagaEvent::RetryDue { id, now_ms: now },
                    SagaEvent::DeadlineDue { id, .. } => SagaEvent::DeadlineDue { id, now_ms: now },
                    other => other,
                };
                self.step(life, event);
            }
            Msg::CoordinatorUp(life) => {
                if self.lives[life].retired {
                    return;
                }
                let engine = SagaEngine::replay(CONFIG, Vec::new(), &self.lives[life].log);
                self.lives[life].engine = Some(engine);
                self.step(life, SagaEvent::Recovered { now_ms: now });
            }
            Msg::ParticipantUp(i) => {
                let part = &mut self.parts[i];
                let mut engine = match &part.checkpoint {
                    Some(json) => {
                        let snapshot: Snapshot = match serde_json::from_str(json) {
                            Ok(snapshot) => snapshot,
                            Err(e) => panic!("participant {i}: its checkpoint does not parse: {e}"),
                        };
                        Engine::restore(EngineConfig::default(), snapshot).unwrap_or_else(|e| {
                            panic!("participant {i}: its checkpoint does not restore: {e}")
                        })
                    }
                    None => fresh_participant(),
                };
                for record in part.log.clone() {
                    let _ = engine.replay(record);
                }
                part.engine = engine;
                part.up = true;
            }
        }
    }
}
