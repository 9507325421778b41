//! Durability: every outcome a client saw is the outcome at every participant. An order whose
//! answer the client never got (`Unknown`) promises nothing here; atomicity still covers it. A
//! committed order still prepared (in doubt) at a participant is not lost there, only not yet
//! applied: liveness reports that; what breaks durability is a participant that settled it
//! without applying it.

use super::{Check, ClientOutcome, Observation, verdict};

pub fn check(observation: &Observation) -> Check {
    let mut broken = Vec::new();
    for o in &observation.orders {
        match o.client {
            ClientOutcome::Committed if o.settled_absent_somewhere() => broken.push(format!(
                "{}: client saw committed, applied at {:?}, prepared at {:?}",
                o.order.id, o.present, o.prepared
            )),
            ClientOutcome::Aborted if !o.nowhere() => broken.push(format!(
                "{}: client saw aborted, applied at {:?}",
                o.order.id, o.present
            )),
            ClientOutcome::Committed | ClientOutcome::Aborted | ClientOutcome::Unknown => {}
        }
    }
    verdict(
        "durability: every outcome a client saw holds at every participant",
        &broken,
        "every committed answer is applied, every aborted answer is absent".into(),
    )
}
