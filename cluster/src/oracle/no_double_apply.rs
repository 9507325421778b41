//! No double apply: the ledgers moved by exactly the orders applied, each once. A commit
//! applied twice (a resent commit that is not idempotent) shows up as units or money counted
//! twice.

use super::{Check, Observation, verdict};

pub fn check(observation: &Observation) -> Check {
    // `sold` lives at inventory and `spent` at payments: each moves with the order's marker
    // there (marker_keys order: inventory, payments, shipping), so an order applied at those two
    // and still in doubt at shipping is counted where it was applied.
    let (quantity, amount) = observation.orders.iter().fold((0, 0), |(q, a), o| {
        (
            q + if o.present[0] { o.order.quantity } else { 0 },
            a + if o.present[1] { o.order.amount } else { 0 },
        )
    });
    let (before, after) = (observation.before, observation.after);
    let mut doubles = Vec::new();
    if after.sold - before.sold != quantity {
        doubles.push(format!(
            "units sold rose by {} but applied orders hold {quantity}",
            after.sold - before.sold
        ));
    }
    if after.spent - before.spent != amount {
        doubles.push(format!(
            "money spent rose by {} but applied orders hold {amount}",
            after.spent - before.spent
        ));
    }
    verdict(
        "no double apply: ledgers moved by exactly the applied orders",
        &doubles,
        format!("{quantity} units and {amount} money, each once"),
    )
}
