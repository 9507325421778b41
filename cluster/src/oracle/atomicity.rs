//! Atomicity: no order is applied at one participant and aborted at another. A participant that
//! still holds the order prepared has not settled it: an order applied at some participants and
//! in doubt at the rest can still end committed everywhere (liveness reports that it has not;
//! after a restore from a backup only an operator may settle it).

use super::{Check, Observation, verdict};

pub fn check(observation: &Observation) -> Check {
    let torn: Vec<String> = observation
        .orders
        .iter()
        .filter(|o| !o.nowhere() && o.settled_absent_somewhere())
        .map(|o| {
            format!(
                "{} applied at [inventory, payments, shipping] = {:?}, prepared at {:?}",
                o.order.id, o.present, o.prepared
            )
        })
        .collect();
    let applied = observation.orders.iter().filter(|o| o.everywhere()).count();
    let absent = observation.orders.iter().filter(|o| o.nowhere()).count();
    let open = observation
        .orders
        .iter()
        .filter(|o| !o.everywhere() && !o.nowhere() && !o.settled_absent_somewhere())
        .count();
    verdict(
        "atomicity: every order applied everywhere or nowhere",
        &torn,
        format!(
            "{applied} applied everywhere, {absent} nowhere, {open} applied and still in doubt at \
             the rest"
        ),
    )
}
