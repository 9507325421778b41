//! Agreement with the coordinator's log: an order is applied at the participants exactly when
//! the coordinator's record says committed. No record at all reads as abort (presumed abort).

use protocol::Outcome;

use super::{Check, Observation, verdict};

pub fn check(observation: &Observation) -> Check {
    let mut disagreements = Vec::new();
    for o in &observation.orders {
        if !o.everywhere() && !o.nowhere() {
            // Torn: atomicity reports it; there is no single participant outcome to compare.
            continue;
        }
        let logged_commit =
            o.coordinator.as_ref().and_then(|s| s.outcome) == Some(Outcome::Committed);
        if logged_commit != o.everywhere() {
            disagreements.push(format!(
                "{}: coordinator says committed={logged_commit} (state {:?}), participants applied={}",
                o.order.id,
                o.coordinator.as_ref().map(|s| s.state),
                o.everywhere()
            ));
        }
    }
    verdict(
        "agreement: participants match the coordinator's log",
        &disagreements,
        "every order's coordinator outcome matches the participants".into(),
    )
}
