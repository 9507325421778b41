//! Liveness: after faults stop, every prepared transaction resolves within a bound.

use super::{Check, Observation};

pub fn check(observation: &Observation) -> Check {
    let settle = observation.settle;
    let left = &observation.prepared_left;
    Check {
        name: "liveness: no prepared transaction left",
        ok: left.is_empty(),
        detail: if left.is_empty() {
            format!("every participant resolved everything within {settle:?}")
        } else {
            format!("still prepared after {settle:?}: {left:?}")
        },
    }
}
