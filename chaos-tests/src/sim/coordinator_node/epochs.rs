//! The epoch fence from this run's side: a participant's refusal stepped as evidence that
//! another run passed this one, the probe that asks every participant after a start or a
//! raise, and the behind mark that stops new work.

use coordinator::engine::{Event, Fenced};
use protocol::{Decision, DecisionRequest, Epoch, ErrorBody, ParticipantName, TxId};

use super::{Call, CoordinatorNode, PROBE_TXID};
use crate::sim::io::Io;
use crate::sim::net::{Body, Msg, Node, Timer};

impl CoordinatorNode {
    /// A participant refused a message this run sent at `sent_epoch`: stepped as evidence,
    /// as `Core::fenced` does (the engine decides what to log).
    pub(super) fn fenced(
        &mut self,
        io: &mut Io,
        participant: ParticipantName,
        what: &str,
        sent_epoch: Epoch,
        refusal: &ErrorBody,
    ) {
        io.note(|| {
            format!(
                "{participant} fences this run out ({what}): {}",
                refusal.message
            )
        });
        self.step(
            io,
            Event::Fenced(Fenced {
                participant,
                evidence: format!(
                    "refused {what} sent at epoch {sent_epoch}: {}: {}",
                    refusal.error, refusal.message
                ),
                sent_epoch,
                highest: refusal.highest_epoch,
                now_ms: io.now_ms,
            }),
        );
    }

    /// Asks participant `index` whether another run passed this one, as `Core::probe` does.
    pub(super) fn probe(&mut self, io: &mut Io, index: usize) {
        let (Some(engine), Some(identity)) = (&self.engine, &self.identity) else {
            return;
        };
        let Some(attempt) = engine.probe_attempt() else {
            return;
        };
        let rid = io.rid();
        self.calls.insert(rid, Call::Probe(index, identity.epoch));
        io.send(Msg {
            to: Some(Node::Participant(index)),
            body: Body::Decide {
                rid,
                from: self.incarnation,
                decision: Decision::Abort,
                request: DecisionRequest {
                    txid: TxId::new(PROBE_TXID).expect("a constant, valid id"),
                    gtid: attempt.gtid,
                    coordinator_id: identity.coordinator_id.clone(),
                    epoch: identity.epoch,
                    incarnation: identity.incarnation,
                },
            },
        });
        self.timer_after(io, self.delivery_timeout_ms, Timer::RequestTimeout(rid));
    }

    /// Whether this run refuses new work because its log is behind.
    pub fn is_behind(&self) -> bool {
        self.stopped_by_query || self.engine.as_ref().is_some_and(|e| e.behind().is_some())
    }

    /// The behind mark (not the mutation's stop), for the operator.
    pub fn is_marked_behind(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| e.behind().is_some())
    }
}
