//! Agreement with the coordinator's log: an order is applied at the participants exactly when
//! the coordinator's record says committed. No record at all reads as abort (presumed abort).
//! Only orders every participant has settled are compared: a torn one is atomicity's to report,
//! and one still prepared somewhere has no final outcome there yet (liveness reports it). That
//! includes an order whose coordinator lost its record with a restored log: its participants
//! still in doubt stay so (the coordinator answers `unknown`), and its absent record is no abort.

use protocol::Outcome;

use super::{Check, Observation, verdict};

pub fn check(observation: &Observation) -> Check {
    let mut disagreements = Vec::new();
    for o in &observation.orders {
        if (!o.everywhere() && !o.nowhere()) || o.in_doubt() {
            // Torn (atomicity reports it) or not settled everywhere yet (liveness does): there is
            // no single final participant outcome to compare.
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
