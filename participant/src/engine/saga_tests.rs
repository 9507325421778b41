//! The saga barrier's tests, beside it: the guards, two coordinators reusing one saga id,
//! replay and snapshots (also of format 2).

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
    let json = serde_json::to_string(&live.snapshot().unwrap()).unwrap();
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
    let mut old = serde_json::to_value(before.snapshot().unwrap()).unwrap();
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
    let snapshot = serde_json::to_value(engine.snapshot().unwrap()).unwrap();
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
            let mut old = serde_json::to_value(before.snapshot().unwrap()).unwrap();
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
    let mut old = serde_json::to_value(engine().snapshot().unwrap()).unwrap();
    old["format"] = json!(2);
    old["saga_barrier"] = json!([["nocolon", {}]]);
    let refused = Engine::<KvStore>::restore(
        EngineConfig::default(),
        serde_json::from_value(old).unwrap(),
    )
    .unwrap_err();
    assert!(refused.to_string().contains("nocolon"), "{refused}");
}
