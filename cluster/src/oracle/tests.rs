//! Each check on hand-made observations: it passes on a consistent run and fails on exactly the
//! broken promise it owns.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

fn order(id: &str, quantity: i64, amount: i64) -> Order {
    Order {
        id: id.into(),
        sku: 0,
        customer: 0,
        quantity,
        amount,
    }
}

fn seen(id: &str, client: ClientOutcome, present: [bool; 3]) -> OrderObservation {
    OrderObservation {
        order: order(id, 2, 10),
        client,
        present,
        prepared: [false; 3],
        coordinator: None,
    }
}

fn observation(orders: Vec<OrderObservation>, sold: i64, spent: i64) -> Observation {
    Observation {
        settle: Duration::from_secs(1),
        prepared_left: BTreeMap::new(),
        orders,
        stock: vec![Ledger {
            id: 0,
            left: 10 - sold,
            moved: sold,
        }],
        money: vec![Ledger {
            id: 0,
            left: 100 - spent,
            moved: spent,
        }],
        before: Totals::default(),
        after: Totals { sold, spent },
    }
}

fn config() -> CheckoutConfig {
    CheckoutConfig {
        skus: 1,
        stock_per_sku: 10,
        customers: 1,
        balance_per_customer: 100,
        ..CheckoutConfig::default()
    }
}

fn failed(report: &AuditReport) -> Vec<&'static str> {
    report
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.split(':').next().unwrap_or(""))
        .collect()
}

#[test]
fn a_consistent_run_passes_every_check() {
    let orders = vec![
        seen("a", ClientOutcome::Aborted, [false; 3]),
        seen("u", ClientOutcome::Unknown, [false; 3]),
    ];
    let report = judge(&config(), &observation(orders, 0, 0));
    assert!(report.all_ok(), "{}", report.failures());
    assert_eq!((report.applied, report.absent), (0, 2));
}

#[test]
fn each_broken_promise_fails_its_own_check() {
    // Applied at inventory only (its units sold moved there, its money nowhere).
    let torn = vec![seen("t", ClientOutcome::Unknown, [true, false, false])];
    assert_eq!(
        failed(&judge(&config(), &observation(torn, 2, 0))),
        ["atomicity"]
    );

    let lost = vec![seen("c", ClientOutcome::Committed, [false; 3])];
    assert_eq!(
        failed(&judge(&config(), &observation(lost, 0, 0))),
        ["durability"]
    );

    // Applied everywhere but the coordinator has no commit: agreement, and the ledgers moved.
    let unlogged = vec![seen("x", ClientOutcome::Unknown, [true; 3])];
    assert_eq!(
        failed(&judge(&config(), &observation(unlogged, 2, 10))),
        ["agreement"]
    );

    let doubled = vec![seen("a", ClientOutcome::Aborted, [false; 3])];
    assert_eq!(
        failed(&judge(&config(), &observation(doubled, 2, 10))),
        ["no double apply"]
    );

    let mut leaking = observation(Vec::new(), 0, 0);
    leaking.stock[0].left = 9;
    leaking.prepared_left.insert("inventory", 1);
    assert_eq!(
        failed(&judge(&config(), &leaking)),
        ["liveness", "conservation"]
    );
}

#[test]
fn an_order_still_in_doubt_at_one_participant_is_open_not_torn() {
    // Committed at inventory and payments, still prepared at shipping (a coordinator restored
    // from a backup answers it `unknown`, and it has no record): nothing is broken yet, but
    // nothing has resolved it either, which is liveness's to report. The ledgers moved with the
    // two participants that applied it.
    let mut open = seen("x", ClientOutcome::Committed, [true, true, false]);
    open.prepared = [false, false, true];
    let mut observed = observation(vec![open.clone()], 2, 10);
    observed.prepared_left.insert("shipping", 1);
    assert_eq!(failed(&judge(&config(), &observed)), ["liveness"]);

    // The same order once shipping dropped it without applying (a presumed abort over a
    // restored log): torn, and the committed answer the client heard is broken.
    open.prepared = [false; 3];
    assert_eq!(
        failed(&judge(&config(), &observation(vec![open], 2, 10))),
        ["atomicity", "durability"]
    );

    // In doubt everywhere with nothing applied and a logged commit: open, not a disagreement.
    let mut pending = seen("p", ClientOutcome::Unknown, [false; 3]);
    pending.prepared = [true; 3];
    pending.coordinator = Some(committed_status("p"));
    let mut observed = observation(vec![pending], 0, 0);
    observed.prepared_left.insert("inventory", 1);
    assert_eq!(failed(&judge(&config(), &observed)), ["liveness"]);
}

#[test]
fn ledgers_are_counted_where_each_order_was_applied() {
    // Applied at inventory only, yet the money moved too: spent rose with nothing applied at
    // payments to explain it.
    let torn = vec![seen("t", ClientOutcome::Unknown, [true, false, false])];
    assert_eq!(
        failed(&judge(&config(), &observation(torn, 2, 10))),
        ["atomicity", "no double apply"]
    );
    // Units sold without the order applied anywhere: unexplained.
    let absent = vec![seen("t", ClientOutcome::Unknown, [false; 3])];
    assert_eq!(
        failed(&judge(&config(), &observation(absent, 2, 0))),
        ["no double apply"]
    );
}

fn committed_status(id: &str) -> protocol::TransactionStatus {
    serde_json::from_value(serde_json::json!({
        "id": id, "gtid": "c-1:0000000000000001:1", "state": "committing",
        "outcome": "committed", "reason": null, "participants": [],
        "created_at_ms": 1, "decided_at_ms": 2, "ended_at_ms": null
    }))
    .expect("a transaction status")
}
