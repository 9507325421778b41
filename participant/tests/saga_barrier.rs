//! The saga branch barrier on the reference KV store, through the library's own calls and a
//! restart: null compensation, hanging action refused, duplicates answer the first answer,
//! and the guard durable together with the effect.

mod common;

use participant::kv::KvStore;
use participant::{Participant, ParticipantConfig};
use protocol::saga::{OpKind, OpQuery, OpStatus, SagaOpAnswer, SagaOpRequest, op_id};
use protocol::{CoordinatorId, Epoch, TxId};
use serde_json::{Value, json};

fn open(dir: &std::path::Path) -> Participant<KvStore> {
    Participant::open(ParticipantConfig::new(dir), || {
        KvStore::from_seed(br#"{"stock": 10}"#).unwrap()
    })
    .unwrap()
}

fn op(saga: &str, step: &str, kind: OpKind, payload: Value) -> SagaOpRequest {
    let saga_id = TxId::new(saga).unwrap();
    SagaOpRequest {
        op_id: op_id(&saga_id, step, kind),
        saga_id,
        step: step.to_string(),
        coordinator_id: CoordinatorId::new("c-1").unwrap(),
        epoch: Epoch(1),
        payload,
    }
}

/// The coordinator's question (as `op` sends its ops from c-1).
fn asked() -> OpQuery {
    OpQuery::from_coordinator(&CoordinatorId::new("c-1").unwrap(), None)
}

fn take(n: i64) -> Value {
    json!({"ops": [{"op": "add", "key": "stock", "delta": -n, "min": 0}]})
}

fn stock(p: &Participant<KvStore>) -> i64 {
    p.read(|s| s.get("stock").unwrap().value.as_i64().unwrap())
}

#[tokio::test]
async fn an_action_applies_once_and_its_compensation_undoes_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    let first = p
        .saga_op(OpKind::Action, op("s1", "reserve", OpKind::Action, take(3)))
        .await
        .unwrap();
    assert!(matches!(first, SagaOpAnswer::Done { .. }));
    let again = p
        .saga_op(OpKind::Action, op("s1", "reserve", OpKind::Action, take(3)))
        .await
        .unwrap();
    assert_eq!(again, first, "a duplicate answers the first answer");
    assert_eq!(stock(&p), 7, "and applies nothing again");
    assert_eq!(
        p.saga_op_status("s1:reserve:action", &asked())
            .await
            .unwrap()
            .status,
        OpStatus::Done
    );
    let undo = op("s1", "reserve", OpKind::Compensation, take(-3));
    p.saga_op(OpKind::Compensation, undo.clone()).await.unwrap();
    p.saga_op(OpKind::Compensation, undo).await.unwrap();
    assert_eq!(stock(&p), 10);
    assert_eq!(
        p.saga_op_status("s1:reserve:action", &asked())
            .await
            .unwrap()
            .status,
        OpStatus::Compensated
    );
    // After a restart (log replay), the same state and the same answers.
    p.close();
    drop(p);
    let p = open(dir.path());
    assert_eq!(stock(&p), 10);
    let replayed = p
        .saga_op(OpKind::Action, op("s1", "reserve", OpKind::Action, take(3)))
        .await
        .unwrap();
    assert_eq!(replayed, first);
    assert_eq!(stock(&p), 10, "nothing applied on a replayed duplicate");
}

#[tokio::test]
async fn a_compensation_before_its_action_is_null_and_the_late_action_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    let null = p
        .saga_op(
            OpKind::Compensation,
            op("s2", "charge", OpKind::Compensation, take(-5)),
        )
        .await
        .unwrap();
    assert!(
        matches!(null, SagaOpAnswer::Done { result: Some(r) } if r["null_compensation"] == true)
    );
    assert_eq!(stock(&p), 10, "a null compensation undoes nothing");
    let late = p
        .saga_op(OpKind::Action, op("s2", "charge", OpKind::Action, take(5)))
        .await
        .unwrap();
    assert!(
        matches!(late, SagaOpAnswer::Failed { ref reason } if reason.contains("hanging")),
        "{late:?}"
    );
    assert_eq!(stock(&p), 10, "the hanging action applied nothing");
    assert_eq!(
        p.saga_op_status("s2:charge:action", &asked())
            .await
            .unwrap()
            .status,
        OpStatus::Compensated
    );
    p.close();
    drop(p);
    let p = open(dir.path());
    let late = p
        .saga_op(OpKind::Action, op("s2", "charge", OpKind::Action, take(5)))
        .await
        .unwrap();
    assert!(
        matches!(late, SagaOpAnswer::Failed { .. }),
        "still refused after a restart"
    );
    assert_eq!(stock(&p), 10);
}

#[tokio::test]
async fn a_failed_action_is_remembered_and_its_compensation_is_null() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    let failed = p
        .saga_op(
            OpKind::Action,
            op("s3", "reserve", OpKind::Action, take(11)),
        )
        .await
        .unwrap();
    assert!(matches!(failed, SagaOpAnswer::Failed { .. }), "{failed:?}");
    assert_eq!(
        p.saga_op_status("s3:reserve:action", &asked())
            .await
            .unwrap()
            .status,
        OpStatus::Failed
    );
    assert_eq!(
        p.saga_op_status("s3:nothing:action", &asked())
            .await
            .unwrap()
            .status,
        OpStatus::NotFound
    );
    assert_eq!(
        p.saga_op_status("garbage", &asked()).await.unwrap().status,
        OpStatus::NotFound
    );
    let null = p
        .saga_op(
            OpKind::Compensation,
            op("s3", "reserve", OpKind::Compensation, take(-11)),
        )
        .await
        .unwrap();
    assert!(matches!(null, SagaOpAnswer::Done { .. }));
    assert_eq!(stock(&p), 10, "nothing to undo for a failed action");
}

/// Issue 25 item 5: saga steps honour fences. A step carrying a `fence` op goes through the
/// check a fenced write gets: a stale holder's action fails and applies nothing (through
/// `/v1/transactions` the same payload votes no), a current one applies and raises the
/// resource's highest token (also after a restart), and a step whose fenced resource a
/// prepared transaction holds waits.
#[tokio::test]
async fn a_saga_step_with_a_stale_fence_fails_and_a_current_one_raises_the_fence() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    let fenced = |token: u64, n: i64| {
        json!({"ops": [
            {"op": "fence", "resource": "orders", "token": token},
            {"op": "add", "key": "stock", "delta": -n, "min": 0}
        ]})
    };
    let current = p
        .saga_op(
            OpKind::Action,
            op("s-f1", "take", OpKind::Action, fenced(5, 1)),
        )
        .await
        .unwrap();
    assert!(matches!(current, SagaOpAnswer::Done { .. }), "{current:?}");
    assert_eq!(p.with_engine(|e| e.fences().highest("orders")), Some(5));
    let stale = p
        .saga_op(
            OpKind::Action,
            op("s-f2", "take", OpKind::Action, fenced(4, 2)),
        )
        .await
        .unwrap();
    match &stale {
        SagaOpAnswer::Failed { reason } => {
            assert!(reason.starts_with("stale_token:"), "{reason}")
        }
        other => panic!("a stale holder's step must fail: {other:?}"),
    }
    assert_eq!(stock(&p), 9, "only the current holder's step applied");
    let forged = p
        .saga_op(
            OpKind::Action,
            op("s-f3", "take", OpKind::Action, fenced(u64::MAX, 1)),
        )
        .await
        .unwrap();
    assert!(
        matches!(&forged, SagaOpAnswer::Failed { reason } if reason.starts_with("token_too_high:")),
        "{forged:?}"
    );
    p.close();
    drop(p);
    let p = open(dir.path());
    assert_eq!(
        p.with_engine(|e| e.fences().highest("orders")),
        Some(5),
        "replay raises the fence again"
    );
    let stale_again = p
        .saga_op(
            OpKind::Action,
            op("s-f4", "take", OpKind::Action, fenced(4, 1)),
        )
        .await
        .unwrap();
    assert!(matches!(stale_again, SagaOpAnswer::Failed { .. }));
    assert_eq!(stock(&p), 9);
    // A prepared transaction fenced on the resource holds `fence:orders`: a saga step on it
    // waits (busy, nothing recorded) until the decision, as a fenced write does.
    let vote = p
        .prepare(common::prepare(
            "t-fenced",
            1,
            json!({"ops": [{"op": "fence", "resource": "orders", "token": 6}]}),
        ))
        .await
        .unwrap();
    assert_eq!(vote, protocol::Vote::Yes);
    let busy = p
        .saga_op(
            OpKind::Action,
            op("s-f5", "take", OpKind::Action, fenced(6, 1)),
        )
        .await;
    assert!(
        matches!(&busy, Err(participant::SagaOpError::Busy(why)) if why.contains("fence:orders")),
        "{busy:?}"
    );
    p.commit(common::decision("t-fenced", 1)).await.unwrap();
    let after = p
        .saga_op(
            OpKind::Action,
            op("s-f5", "take", OpKind::Action, fenced(6, 1)),
        )
        .await
        .unwrap();
    assert!(matches!(after, SagaOpAnswer::Done { .. }), "{after:?}");
    assert_eq!(p.with_engine(|e| e.fences().highest("orders")), Some(6));
}
