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
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use crate::kv::KvStore;
    use protocol::saga::op_id;
    use protocol::{Epoch, TxId};
    use serde_json::{Value, json};

    fn engine() -> Engine<KvStore> {
        Engine::new(
            EngineConfig::default(),
            KvStore::from_seed(br#"{"stock": 10}"#).unwrap(),
        )
    }

    fn coordinator(id: &str) -> CoordinatorId {
        CoordinatorId::new(id).unwrap()
    }

    fn op(from: &str, saga: &str, step: &str, kind: OpKind, payload: Value) -> SagaOpRequest {
        let saga_id = TxId::new(saga).unwrap();
        SagaOpRequest {
            op_id: op_id(&saga_id, step, kind),
            saga_id,
            step: step.to_string(),
            coordinator_id: coordinator(from),
            epoch: Epoch(1),
            payload,
        }
    }

    fn take(n: i64) -> Value {
        json!({"ops": [{"op": "add", "key": "stock", "delta": -n, "min": 0}]})
    }

    fn stock(engine: &Engine<KvStore>) -> i64 {
        engine
            .resource()
            .get("stock")
            .unwrap()
            .value
            .as_i64()
            .unwrap()
    }

    /// Runs an op and returns its answer and record (`None` for a conflict or busy).
    fn run(
        engine: &mut Engine<KvStore>,
        request: &SagaOpRequest,
        kind: OpKind,
    ) -> (Option<SagaOpAnswer>, Option<Record>) {
        match engine.saga_op(kind, request, 1) {
            SagaStepped::Answer { answer, record } => (Some(answer), record),
            SagaStepped::Busy(_) | SagaStepped::Conflict(_) => (None, None),
        }
    }

    fn asked_by(from: &str, payload: Option<&Value>) -> OpQuery {
        OpQuery::from_coordinator(&coordinator(from), payload)
    }

    fn status(engine: &Engine<KvStore>, op: &str, query: &OpQuery) -> OpStatus {
        engine.saga_op_status(op, query).unwrap().status
    }

    /// Issue 25, item 5: a second coordinator (or one on a wiped data directory: a new
    /// coordinator id) reusing a saga id gets its own step, never the first one's answers.
    #[test]
    fn two_coordinators_with_the_same_saga_id_get_separate_answers() {
        let mut engine = engine();
        let first = op("c-a", "s1", "reserve", OpKind::Action, take(3));
        let (answer, record) = run(&mut engine, &first, OpKind::Action);
        assert!(matches!(answer, Some(SagaOpAnswer::Done { .. })));
        assert!(record.is_some());
        let a = asked_by("c-a", Some(&take(3)));
        let b = asked_by("c-b", Some(&take(5)));
        assert_eq!(status(&engine, "s1:reserve:action", &a), OpStatus::Done);
        assert_eq!(
            status(&engine, "s1:reserve:action", &b),
            OpStatus::NotFound,
            "c-b never sent this op: its question is not answered from c-a's step"
        );
        // c-b's action is its own op: applied, recorded, not c-a's answer handed back.
        let second = op("c-b", "s1", "reserve", OpKind::Action, take(5));
        let (answer, record) = run(&mut engine, &second, OpKind::Action);
        assert!(matches!(answer, Some(SagaOpAnswer::Done { .. })));
        assert!(record.is_some(), "a fresh op, recorded");
        assert_eq!(stock(&engine), 2);
        // c-a compensates its step; c-b's stays done.
        let undo = op("c-a", "s1", "reserve", OpKind::Compensation, take(-3));
        run(&mut engine, &undo, OpKind::Compensation);
        assert_eq!(stock(&engine), 5);
        assert_eq!(
            status(&engine, "s1:reserve:action", &a),
            OpStatus::Compensated
        );
        assert_eq!(status(&engine, "s1:reserve:action", &b), OpStatus::Done);
        // A compensation of c-b that arrived before its action would be null there, and would
        // not refuse c-a's action: each coordinator's guards are its own.
        let late = op("c-c", "s1", "reserve", OpKind::Compensation, take(-1));
        let (answer, _) = run(&mut engine, &late, OpKind::Compensation);
        assert_eq!(
            answer,
            Some(SagaOpAnswer::Done {
                result: Some(json!({"null_compensation": true}))
            })
        );
        assert_eq!(stock(&engine), 5, "a null compensation undoes nothing");
        assert_eq!(engine.saga_barrier_len(), 3);
    }

    /// A question that names no coordinator (an older coordinator's) is answered `not_found`
    /// only when nobody's op on the step is recorded; otherwise it is refused, never answered
    /// from an entry that may be another coordinator's.
    #[test]
    fn a_question_without_a_coordinator_id_is_answered_only_when_nothing_is_recorded() {
        let mut engine = engine();
        let anonymous = OpQuery::default();
        assert_eq!(
            status(&engine, "s1:reserve:action", &anonymous),
            OpStatus::NotFound
        );
        run(
            &mut engine,
            &op("c-a", "s1", "reserve", OpKind::Action, take(1)),
            OpKind::Action,
        );
        assert!(matches!(
            engine.saga_op_status("s1:reserve:action", &anonymous),
            Err(OpQueryRefused::CoordinatorIdRequired { .. })
        ));
        assert!(matches!(
            engine.saga_op_status("s1:reserve:compensation", &anonymous),
            Err(OpQueryRefused::CoordinatorIdRequired { .. })
        ));
        // Neighbouring steps and sagas are not mistaken for it.
        for other in ["s1:charge:action", "s:reserve:action", "s1:reserve2:action"] {
            assert_eq!(
                status(&engine, other, &anonymous),
                OpStatus::NotFound,
                "{other}"
            );
        }
    }

    /// The same op id from the same coordinator with another payload is a conflict, never the
    /// first op's answer; the same payload is a repeat.
    #[test]
    fn a_repeat_with_another_payload_is_an_op_id_conflict() {
        let mut engine = engine();
        let first = op("c-a", "s1", "reserve", OpKind::Action, take(3));
        let (done, _) = run(&mut engine, &first, OpKind::Action);
        let other = op("c-a", "s1", "reserve", OpKind::Action, take(4));
        match engine.saga_op(OpKind::Action, &other, 2) {
            SagaStepped::Conflict(message) => {
                assert!(message.contains("s1:reserve:action"), "{message}")
            }
            stepped => panic!("another payload under the same op id: {stepped:?}"),
        }
        assert_eq!(stock(&engine), 7, "nothing applied for the conflicting op");
        assert_eq!(run(&mut engine, &first, OpKind::Action), (done, None));
        // The question with the other payload's digest is refused too; with the recorded
        // one, or without a digest, it is answered.
        assert_eq!(
            engine.saga_op_status("s1:reserve:action", &asked_by("c-a", Some(&take(4)))),
            Err(OpQueryRefused::Conflict {
                op_id: "s1:reserve:action".into()
            })
        );
        for query in [asked_by("c-a", Some(&take(3))), asked_by("c-a", None)] {
            assert_eq!(status(&engine, "s1:reserve:action", &query), OpStatus::Done);
        }
        // Key order in the payload does not matter; compensations are checked the same way.
        let undo = op(
            "c-a",
            "s1",
            "reserve",
            OpKind::Compensation,
            json!({"ops": [{"delta": 3, "key": "stock", "op": "add"}]}),
        );
        let (undone, record) = run(&mut engine, &undo, OpKind::Compensation);
        assert!(record.is_some());
        let reordered = op(
            "c-a",
            "s1",
            "reserve",
            OpKind::Compensation,
            json!({"ops": [{"op": "add", "key": "stock", "delta": 3}]}),
        );
        assert_eq!(
            run(&mut engine, &reordered, OpKind::Compensation),
            (undone, None)
        );
        let bigger = op("c-a", "s1", "reserve", OpKind::Compensation, take(-30));
        assert!(matches!(
            engine.saga_op(OpKind::Compensation, &bigger, 3),
            SagaStepped::Conflict(_)
        ));
        assert_eq!(stock(&engine), 10);
    }

    fn records_of_two_coordinators(engine: &mut Engine<KvStore>) -> Vec<Record> {
        let ops = [
            (
                op("c-a", "s1", "reserve", OpKind::Action, take(3)),
                OpKind::Action,
            ),
            (
                op("c-b", "s1", "reserve", OpKind::Action, take(5)),
                OpKind::Action,
            ),
            (
                op("c-a", "s1", "reserve", OpKind::Compensation, take(-3)),
                OpKind::Compensation,
            ),
            (
                op("c-b", "s1", "charge", OpKind::Action, take(50)),
                OpKind::Action,
            ),
            (
                op("c-a", "s2", "reserve", OpKind::Compensation, take(-1)),
                OpKind::Compensation,
            ),
        ];
        ops.iter()
            .filter_map(|(request, kind)| run(engine, request, *kind).1)
            .collect()
    }

    /// Every question the tests ask, and its answer, for comparing two engines.
    fn answers(engine: &Engine<KvStore>) -> Vec<Result<OpStatusResponse, OpQueryRefused>> {
        let mut out = Vec::new();
        for from in ["c-a", "c-b", "c-c"] {
            for op in ["s1:reserve:action", "s1:charge:action", "s2:reserve:action"] {
                out.push(engine.saga_op_status(op, &asked_by(from, None)));
                out.push(engine.saga_op_status(op, &asked_by(from, Some(&take(3)))));
            }
        }
        out
    }

    #[test]
    fn replay_and_a_snapshot_keep_each_coordinators_steps_apart() {
        let mut live = engine();
        let records = records_of_two_coordinators(&mut live);
        assert_eq!(records.len(), 5, "a failed charge is recorded too");
        let mut replayed = engine();
        for record in &records {
            // Through the record's encoding, as the log holds it.
            let decoded = Record::decode(1, record.record_type(), &record.encode()).unwrap();
            replayed.replay(decoded).unwrap();
        }
        assert_eq!(replayed.saga_barrier(), live.saga_barrier());
        assert_eq!(stock(&replayed), stock(&live));
        assert_eq!(answers(&replayed), answers(&live));
        let json = serde_json::to_string(&live.snapshot()).unwrap();
        let restored = Engine::<KvStore>::restore(
            EngineConfig::default(),
            serde_json::from_str(&json).unwrap(),
        )
        .unwrap();
        assert_eq!(restored.saga_barrier(), live.saga_barrier());
        assert_eq!(answers(&restored), answers(&live));
        // The keys are in the snapshot as written, not rebuilt from anything else.
        let snapshot: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(snapshot["format"], 3);
        assert!(snapshot.get("saga_barrier").is_none());
        let rows = snapshot["saga_steps"].as_array().unwrap();
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r["coordinator_id"].is_string()
            && r["saga_id"].is_string()
            && r["step"].is_string()));
    }

    /// A saga op record as the build before issue 25 wrote it: the record already named the
    /// coordinator, so replay keys it properly.
    #[test]
    fn a_record_written_before_step_keys_replays_under_its_coordinator() {
        let old = br#"{"type":"saga_op","saga_id":"s1","step":"reserve","op_id":"s1:reserve:action","kind":"action","coordinator_id":"c-a","epoch":1,"answer":{"answer":"done"},"payload":{"ops":[{"op":"add","key":"stock","delta":-3,"min":0}]},"at_ms":5}"#;
        let record = Record::decode(1, wal::RecordType(10), old).unwrap();
        let mut engine = engine();
        engine.replay(record).unwrap();
        assert_eq!(stock(&engine), 7);
        assert_eq!(
            status(
                &engine,
                "s1:reserve:action",
                &asked_by("c-a", Some(&take(3)))
            ),
            OpStatus::Done
        );
        assert_eq!(
            status(&engine, "s1:reserve:action", &asked_by("c-b", None)),
            OpStatus::NotFound
        );
        assert!(matches!(
            engine.saga_op(
                OpKind::Action,
                &op("c-a", "s1", "reserve", OpKind::Action, take(4)),
                2
            ),
            SagaStepped::Conflict(_)
        ));
    }

    /// A format-2 snapshot's entries knew no coordinator: they keep answering every
    /// coordinator as that build did (an op already applied is never applied again), take
    /// later ops of the step, and survive the next snapshot as they are.
    #[test]
    fn a_format_2_snapshot_loads_its_steps_as_legacy_entries() {
        let mut before = engine();
        run(
            &mut before,
            &op("c-a", "s1", "reserve", OpKind::Action, take(3)),
            OpKind::Action,
        );
        let mut old = serde_json::to_value(before.snapshot()).unwrap();
        old["format"] = json!(2);
        old.as_object_mut().unwrap().remove("saga_steps");
        old["saga_barrier"] = json!([["s1:reserve", {"action": {"answer": "done"}}]]);
        let mut engine = Engine::<KvStore>::restore(
            EngineConfig::default(),
            serde_json::from_value(old).unwrap(),
        )
        .unwrap();
        assert_eq!(stock(&engine), 7);
        assert_eq!(
            engine.saga_barrier().keys().collect::<Vec<_>>(),
            vec![&StepKey::legacy("s1", "reserve")]
        );
        let repeat = op("c-a", "s1", "reserve", OpKind::Action, take(3));
        let (answer, record) = run(&mut engine, &repeat, OpKind::Action);
        assert!(matches!(answer, Some(SagaOpAnswer::Done { .. })));
        assert!(
            record.is_none(),
            "the first answer, not a second application"
        );
        assert_eq!(stock(&engine), 7);
        assert_eq!(
            status(
                &engine,
                "s1:reserve:action",
                &asked_by("c-a", Some(&take(9)))
            ),
            OpStatus::Done,
            "a legacy entry kept no digest to check"
        );
        assert!(matches!(
            engine.saga_op_status("s1:reserve:action", &OpQuery::default()),
            Err(OpQueryRefused::CoordinatorIdRequired { .. })
        ));
        // The compensation lands in the same entry, live and in replay.
        let undo = op("c-a", "s1", "reserve", OpKind::Compensation, take(-3));
        let (_, record) = run(&mut engine, &undo, OpKind::Compensation);
        assert_eq!(stock(&engine), 10);
        assert_eq!(engine.saga_barrier_len(), 1);
        let snapshot = serde_json::to_value(engine.snapshot()).unwrap();
        assert_eq!(snapshot["format"], 3);
        assert!(snapshot["saga_steps"][0].get("coordinator_id").is_none());
        let mut again = Engine::<KvStore>::restore(
            EngineConfig::default(),
            serde_json::from_value(snapshot).unwrap(),
        )
        .unwrap();
        assert_eq!(again.saga_barrier(), engine.saga_barrier());
        // Replaying the compensation's record on the format-2 state finds the same entry.
        let mut replayed = Engine::<KvStore>::restore(
            EngineConfig::default(),
            serde_json::from_value({
                let mut old = serde_json::to_value(before.snapshot()).unwrap();
                old["format"] = json!(2);
                old.as_object_mut().unwrap().remove("saga_steps");
                old["saga_barrier"] = json!([["s1:reserve", {"action": {"answer": "done"}}]]);
                old
            })
            .unwrap(),
        )
        .unwrap();
        replayed.replay(record.unwrap()).unwrap();
        assert_eq!(replayed.saga_barrier(), engine.saga_barrier());
        assert_eq!(stock(&replayed), 10);
        let (answer, _) = run(&mut again, &repeat, OpKind::Action);
        assert!(matches!(answer, Some(SagaOpAnswer::Done { .. })));
    }

    #[test]
    fn a_format_2_key_that_is_not_saga_and_step_is_refused_by_name() {
        let mut old = serde_json::to_value(engine().snapshot()).unwrap();
        old["format"] = json!(2);
        old["saga_barrier"] = json!([["nocolon", {}]]);
        let refused = Engine::<KvStore>::restore(
            EngineConfig::default(),
            serde_json::from_value(old).unwrap(),
        )
        .unwrap_err();
        assert!(refused.to_string().contains("nocolon"), "{refused}");
    }
}
