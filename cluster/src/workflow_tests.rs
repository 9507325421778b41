use super::*;

fn pending(attempts: u32, error: Option<&str>) -> Evidence {
    Evidence::Pending {
        attempts,
        last_error: error.map(str::to_string),
    }
}

fn answered(status: &str) -> Evidence {
    Evidence::Answered {
        status: status.into(),
    }
}

fn moves_to(plan: Plan) -> State {
    match plan {
        Plan::Move(t) => t.to,
        other => panic!("expected a move, got {other:?}"),
    }
}

#[test]
fn the_happy_path_reserves_emits_once_and_confirms() {
    let Plan::Move(reserve) = plan(State::Created, &Evidence::Missing) else {
        panic!("created must move");
    };
    assert_eq!(reserve.to, State::StockReserved);
    assert_eq!(reserve.stock_delta, Some(-1));
    assert!(reserve.emits_payment);
    assert_eq!(
        moves_to(plan(State::StockReserved, &answered("authorized"))),
        State::PaymentAuthorized
    );
    assert_eq!(
        moves_to(plan(State::PaymentAuthorized, &answered("authorized"))),
        State::Confirmed
    );
    assert_eq!(plan(State::Confirmed, &Evidence::Missing), Plan::Done);
}

#[test]
fn a_decline_releases_the_stock_and_cancels() {
    assert_eq!(
        moves_to(plan(State::StockReserved, &answered("declined"))),
        State::PaymentDeclined
    );
    assert_eq!(
        moves_to(plan(State::PaymentDeclined, &Evidence::Missing)),
        State::StockReleasePending
    );
    let Plan::Move(release) = plan(State::StockReleasePending, &Evidence::Missing) else {
        panic!("release must move");
    };
    assert_eq!(release.to, State::Cancelled);
    assert_eq!(release.stock_delta, Some(1));
    assert!(!release.emits_payment);
    assert_eq!(plan(State::Cancelled, &Evidence::Missing), Plan::Done);
}

#[test]
fn an_unknown_outcome_is_a_state_resolved_from_the_original_answer() {
    let Plan::Move(unknown) = plan(State::StockReserved, &pending(1, Some("timeout"))) else {
        panic!("an attempt without an answer must move to payment_unknown");
    };
    assert_eq!(unknown.to, State::PaymentUnknown);
    assert_eq!(unknown.evidence.as_deref(), Some("unknown: timeout"));
    // Recorded first, whatever arrives meanwhile.
    assert_eq!(
        moves_to(plan(State::PaymentUnknown, &answered("authorized"))),
        State::ReconciliationPending
    );
    assert!(matches!(
        plan(State::ReconciliationPending, &pending(3, Some("timeout"))),
        Plan::Wait(_)
    ));
    assert_eq!(
        moves_to(plan(State::ReconciliationPending, &answered("authorized"))),
        State::PaymentAuthorized
    );
    assert_eq!(
        moves_to(plan(State::ReconciliationPending, &answered("declined"))),
        State::PaymentDeclined
    );
}

#[test]
fn no_state_but_created_ever_emits_a_payment_intent() {
    let states = [
        State::StockReserved,
        State::PaymentAuthorized,
        State::Confirmed,
        State::PaymentDeclined,
        State::StockReleasePending,
        State::Cancelled,
        State::PaymentUnknown,
        State::ReconciliationPending,
    ];
    let evidence = [
        Evidence::Missing,
        pending(0, None),
        pending(5, Some("timeout")),
        answered("authorized"),
        answered("declined"),
        answered("weird"),
        Evidence::Stuck { why: "x".into() },
    ];
    for state in states {
        for e in &evidence {
            if let Plan::Move(t) = plan(state, e) {
                assert!(!t.emits_payment, "{state:?} with {e:?} emits a payment");
                assert_eq!(t.from, state);
            }
        }
    }
}

#[test]
fn waiting_and_stuck_cases_are_named() {
    assert!(matches!(
        plan(State::StockReserved, &pending(0, None)),
        Plan::Wait(_)
    ));
    assert!(matches!(
        plan(State::StockReserved, &Evidence::Missing),
        Plan::Stuck(_)
    ));
    assert!(matches!(
        plan(State::StockReserved, &answered("maybe")),
        Plan::Stuck(_)
    ));
    let failed = Evidence::Stuck {
        why: "payment intent failed: 400".into(),
    };
    assert_eq!(
        plan(State::ReconciliationPending, &failed),
        Plan::Stuck("payment intent failed: 400".into())
    );
}

#[test]
fn the_write_checks_the_version_fences_and_carries_the_original_event_id() {
    let checkout = Checkout::new("sku-1", 40, "alice");
    let Plan::Move(t) = plan(State::Created, &Evidence::Missing) else {
        panic!()
    };
    let w = write("c-7", &checkout, 1, &t, FenceClaim::unproven(LEASE, 9));
    assert_eq!(
        w.ops[0],
        KvOp::Check {
            key: "checkout:c-7".into(),
            version: 1
        }
    );
    let KvOp::Put { value, .. } = &w.ops[1] else {
        panic!("second op must be the put")
    };
    let stored: Checkout = serde_json::from_value(value.clone()).unwrap();
    assert_eq!(stored.state, State::StockReserved);
    assert_eq!(stored.history.last().map(|s| s.token), Some(9));
    assert_eq!(
        w.ops[2],
        KvOp::Add {
            key: "stock:sku-1".into(),
            delta: -1,
            min: Some(0)
        }
    );
    assert_eq!(w.next.len(), 1);
    assert_eq!(w.next[0].event_id, "pay-c-7");
    assert_eq!(w.next[0].aggregate, "checkout:c-7");
    assert_eq!(w.fence.as_ref().map(|f| f.token), Some(9));
    assert_eq!(w.op_id, "wf-c-7-v1-t9");
    // A later step writes no intent and no stock op.
    let later = write(
        "c-7",
        &stored,
        2,
        &step(State::PaymentUnknown, State::ReconciliationPending),
        FenceClaim::unproven(LEASE, 10),
    );
    assert!(later.next.is_empty());
    assert_eq!(later.ops.len(), 2);
}

#[test]
fn evidence_reads_outbox_entries() {
    let mut entry = OutboxEntry {
        event_id: "pay-c-1".into(),
        aggregate: "checkout:c-1".into(),
        seq: 1,
        target: "payments".into(),
        kind: PAYMENT_INTENT.into(),
        body: Value::Null,
        state: IntentState::Pending,
        op_id: "o".into(),
        created_at_ms: 0,
        attempts: 2,
        last_error: Some("timeout".into()),
        last_attempt_at_ms: None,
        delivered_at_ms: None,
        answer: None,
        marks: Vec::new(),
        age_ms: None,
    };
    assert_eq!(Evidence::of(&entry), pending(2, Some("timeout")));
    entry.state = IntentState::Delivered;
    entry.answer = Some(json!({"status": "declined"}));
    assert_eq!(Evidence::of(&entry), answered("declined"));
    entry.state = IntentState::Failed;
    assert!(matches!(Evidence::of(&entry), Evidence::Stuck { .. }));
}
