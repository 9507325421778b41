//! No double apply: the ledgers moved by exactly the orders applied, each once. A commit
//! applied twice (a resent commit that is not idempotent) shows up as units or money counted
//! twice.

use super::{Check, Observation, verdict};

pub fn check(observation: &Observation) -> Check {
    let applied = observation.orders.iter().filter(|o| o.everywhere());
    let (quantity, amount) = applied.fold((0, 0), |(q, a), o| {
        (q + o.order.quantity, a + o.order.amount)
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
