//! Atomicity: no order is applied at one participant and absent at another.

use super::{Check, Observation, verdict};

pub fn check(observation: &Observation) -> Check {
    let torn: Vec<String> = observation
        .orders
        .iter()
        .filter(|o| !o.everywhere() && !o.nowhere())
        .map(|o| {
            format!(
                "{} applied at [inventory, payments, shipping] = {:?}",
                o.order.id, o.present
            )
        })
        .collect();
    let applied = observation.orders.iter().filter(|o| o.everywhere()).count();
    let absent = observation.orders.iter().filter(|o| o.nowhere()).count();
    verdict(
        "atomicity: every order applied everywhere or nowhere",
        &torn,
        format!("{applied} applied everywhere, {absent} nowhere"),
    )
}
