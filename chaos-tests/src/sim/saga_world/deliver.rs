//! What each message does where it arrives: submits and answers stepped into the saga engine,
//! ops and probes taken by a participant's barrier, whose answer leaves only once what it
//! wrote before it is durable, and restarts back to the durable logs.

use coordinator::saga::engine::{ProbeAnswer, SagaEngine, SagaEvent};
use participant::record::Record;
use protocol::digest::{Digest, Fnv128};
use protocol::saga::{OpKind, OpStatus, SagaOpAnswer};

use super::{CONFIG, Msg, SagaMutation, World, fresh_participant};

impl World {
    pub(super) fn deliver(&mut self, msg: Msg) {
        let now = self.now;
        // What the coordinator's shell reads; participants stamp their records with true time.
        let clock = self.coordinator_now();
        let jitter = self.rng.u64(..);
        match msg {
            Msg::Submit(i, wait) => {
                let (request, _) = self.requests[i].clone();
                let digest = Digest(
                    Fnv128::default()
                        .field(&serde_json::to_vec(&request).unwrap_or_default())
                        .finish(),
                );
                let event = SagaEvent::Submit {
                    waiter: i as u64,
                    wait,
                    request,
                    digest,
                    now_ms: clock,
                    client: None,
                };
                self.step_coordinator(event);
            }
            Msg::Op {
                call,
                to,
                kind,
                request,
            } => {
                if !self.reachable(to) {
                    return;
                }
                if kind == OpKind::Compensation && self.refuses_fence(to, call, &request) {
                    return;
                }
                let part = &mut self.parts[to];
                let (answer, record) = match part.engine.saga_op(kind, &request, now) {
                    // One coordinator id and one payload per op id here: never a conflict
                    // (the saga_reuse world has them).
                    participant::engine::saga::SagaStepped::Busy(_)
                    | participant::engine::saga::SagaStepped::Conflict(_) => (None, None),
                    participant::engine::saga::SagaStepped::Answer { answer, record } => {
                        (Some(answer), record)
                    }
                };
                let from_memory = record.is_none() && answer.is_some();
                self.participant_answers(to, record, Msg::OpAnswer { call, answer }, from_memory);
            }
            Msg::OpAnswer { call, answer } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let outcome = match answer {
                    Some(SagaOpAnswer::Done { result }) => {
                        coordinator::records::SagaOpOutcome::Done { result }
                    }
                    Some(SagaOpAnswer::Failed { reason }) => {
                        coordinator::records::SagaOpOutcome::Failed { reason }
                    }
                    None => coordinator::records::SagaOpOutcome::Unknown {
                        error: "busy".into(),
                    },
                };
                let kind = found.kind.unwrap_or(OpKind::Action);
                let event = SagaEvent::OpAnswered {
                    id: found.id,
                    step: found.step,
                    kind,
                    outcome,
                    now_ms: clock,
                    jitter,
                };
                self.step_coordinator(event);
            }
            Msg::Probe { call, to, op_id } => {
                if !self.reachable(to) {
                    return;
                }
                let asked = protocol::saga::OpQuery::from_coordinator(&self.coordinator_id, None);
                let Ok(status) = self.parts[to].engine.saga_op_status(&op_id, &asked) else {
                    return; // never refused here: it names its coordinator, sends no digest
                };
                let from_memory = status.status != OpStatus::NotFound;
                let answer = match status.status {
                    OpStatus::Done => ProbeAnswer::Done(status.result),
                    OpStatus::Failed => ProbeAnswer::Failed(status.reason.unwrap_or_default()),
                    OpStatus::Compensated => ProbeAnswer::Compensated,
                    OpStatus::NotFound => ProbeAnswer::NotFound,
                };
                self.participant_answers(to, None, Msg::ProbeAnswer { call, answer }, from_memory);
            }
            Msg::CoordinatorSynced { run } => {
                if run == self.run && self.coordinator.is_some() {
                    if self.power_cut() {
                        self.crash_coordinator();
                        return;
                    }
                    self.coordinator_synced();
                }
            }
            Msg::ParticipantSynced { to, life } => {
                if life != self.parts[to].life || !self.parts[to].up {
                    return;
                }
                if self.power_cut() {
                    self.crash_participant(to);
                    return;
                }
                let Some((record, answer)) = self.parts[to].unsynced.pop_front() else {
                    return;
                };
                if let Some(record) = record {
                    self.parts[to].log.push(record);
                }
                // A crash after the record is durable, before the answer leaves.
                if self.faulty() && self.rng.u32(0..100) < 3 {
                    self.crash_participant(to);
                    return;
                }
                self.send(answer);
            }
            Msg::ProbeAnswer { call, answer } => {
                let Some(found) = self.settle(call) else {
                    return;
                };
                let event = SagaEvent::ProbeAnswered {
                    id: found.id,
                    step: found.step,
                    answer,
                    now_ms: clock,
                    jitter,
                };
                self.step_coordinator(event);
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
                        now_ms: clock,
                        jitter,
                    },
                    None => SagaEvent::ProbeAnswered {
                        id: found.id,
                        step: found.step,
                        answer: ProbeAnswer::NoAnswer("timeout".into()),
                        now_ms: clock,
                        jitter,
                    },
                };
                self.step_coordinator(event);
            }
            Msg::Timer { run, event } => {
                if run != self.run {
                    return;
                }
                let event = match event {
                    SagaEvent::RetryDue { id, .. } => SagaEvent::RetryDue { id, now_ms: clock },
                    SagaEvent::DeadlineDue { id, .. } => {
                        SagaEvent::DeadlineDue { id, now_ms: clock }
                    }
                    other => other,
                };
                self.step_coordinator(event);
            }
            Msg::CoordinatorUp => {
                // The machine's clock may have been reset while it was down.
                if self.rng.u32(0..3) == 0 {
                    let delta = self.rng.i64(-3_600_000..=3_600_000);
                    self.wall.step(now, delta);
                    self.stats.clock_jumps += 1;
                }
                self.run_base = self.wall.read(now);
                self.run_started = now;
                for c in self.counted.values_mut() {
                    c.since = now;
                }
                let engine = SagaEngine::replay(CONFIG, self.checkpoint.clone(), &self.log);
                self.coordinator = Some(engine);
                let now_ms = self.coordinator_now();
                self.step_coordinator(SagaEvent::Recovered { now_ms });
            }
            Msg::ParticipantUp(i) => {
                let mut engine = fresh_participant();
                for record in self.parts[i].log.clone() {
                    let _ = engine.replay(record);
                }
                self.parts[i].engine = engine;
                self.parts[i].up = true;
            }
        }
    }

    /// Participant `to` answers once everything it wrote before is durable (its record, or
    /// the forced barrier a repeat or a probe writes); the mutation answers what the barrier
    /// holds in memory at once.
    fn participant_answers(
        &mut self,
        to: usize,
        record: Option<Record>,
        answer: Msg,
        from_memory: bool,
    ) {
        if from_memory && self.mutation == Some(SagaMutation::ParticipantAnswersFromMemory) {
            self.send(answer);
            return;
        }
        let (at, after) = self.sync_delay(self.parts[to].synced_at);
        let part = &mut self.parts[to];
        part.synced_at = at;
        part.unsynced.push_back((record, answer));
        let life = part.life;
        self.schedule(after, Msg::ParticipantSynced { to, life });
    }

    /// Whether a message reaches participant `to`: it is up and not cut off.
    fn reachable(&self, to: usize) -> bool {
        self.parts[to].up && self.now >= self.parts[to].cut_until
    }
}
