//! The coordinator's batch sender (issue 28), modelled on `runtime::batches`: in a batching run
//! a prepare or a decision the engine commands for a participant that takes batches waits in
//! that participant's lane until the lane's flush runs (a timer armed by the lane's first
//! item, a few milliseconds on: everything queued before then goes together), then leaves as
//! one batch per route, at most `max_items` items each. Every item keeps its own request id
//! (its `Call`) and its own timeout, armed when the engine commanded it, so the engine hears of
//! each item exactly as of a lone message. A participant that takes no batches is sent its
//! messages one by one, in batching runs too.
//!
//! An answer line is paired with the item at its `index`, and credited only if the line names
//! that item's attempt: a line naming another is an error answer for the item (a prepare
//! counts it as a failed vote, a decision is retried), never a vote for anyone.
//! `Mutation::BatchAnswerByPosition` pairs the k-th line received with the k-th item instead.

use protocol::{Decision, DecisionRequest, ErrorBody, ErrorCode, GlobalTxId, PrepareRequest};

use super::{Call, CoordinatorNode};
use crate::sim::Mutation;
use crate::sim::io::Io;
use crate::sim::net::{Body, LineAnswer, Msg, Node, RequestId, Timer};

/// How a batching run's sender works.
#[derive(Debug, Clone, Copy)]
pub struct BatchTerms {
    /// Most items in one batch (the participant's `max_items`); more are split.
    pub max_items: usize,
    /// Most time between a lane's first item and its flush.
    pub linger_max_ms: u64,
    /// Which participants (by index) take batches.
    pub takes_batches: [bool; 3],
}

impl BatchTerms {
    fn lane(terms: Option<BatchTerms>, index: usize) -> Option<BatchTerms> {
        terms.filter(|t| t.takes_batches.get(index).copied().unwrap_or(false))
    }
}

/// What waits for one participant until the sender runs.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    prepares: Vec<(RequestId, PrepareRequest)>,
    decisions: Vec<(RequestId, Decision, DecisionRequest)>,
}

/// A batch call in flight: its items' request ids and attempts, by index.
#[derive(Debug)]
pub(super) struct SentBatch {
    items: Vec<(RequestId, GlobalTxId)>,
    /// Lines received so far (only the mutation pairs by it).
    lines: usize,
}

impl CoordinatorNode {
    /// Sends a prepare now, or queues it for the sender in a batching run.
    pub(super) fn send_prepare(
        &mut self,
        io: &mut Io,
        index: usize,
        rid: RequestId,
        request: PrepareRequest,
    ) {
        if BatchTerms::lane(self.batching, index).is_none() {
            io.send(Msg {
                to: Some(Node::Participant(index)),
                body: Body::Prepare {
                    rid,
                    from: self.incarnation,
                    request,
                },
            });
            return;
        }
        self.outbox
            .entry(index)
            .or_default()
            .prepares
            .push((rid, request));
        self.arm_flush(io, index);
    }

    /// Sends a decision now, or queues it for the sender in a batching run.
    pub(super) fn send_decision(
        &mut self,
        io: &mut Io,
        index: usize,
        rid: RequestId,
        decision: Decision,
        request: DecisionRequest,
    ) {
        if BatchTerms::lane(self.batching, index).is_none() {
            io.send(Msg {
                to: Some(Node::Participant(index)),
                body: Body::Decide {
                    rid,
                    from: self.incarnation,
                    decision,
                    request,
                },
            });
            return;
        }
        self.outbox
            .entry(index)
            .or_default()
            .decisions
            .push((rid, decision, request));
        self.arm_flush(io, index);
    }

    fn arm_flush(&mut self, io: &mut Io, index: usize) {
        let Some(terms) = self.batching else { return };
        if self.flush_armed.insert(index) {
            let after = io.rng.u64(0..=terms.linger_max_ms);
            self.timer_after(io, after, Timer::FlushBatches(index));
        }
    }

    /// Participant `index`'s lane flushes: its waiting prepares leave as batches, then its
    /// decisions. An item whose call already ended (its timeout fired first) is left out.
    pub(super) fn flush_batches(&mut self, io: &mut Io, index: usize) {
        self.flush_armed.remove(&index);
        let Some(terms) = self.batching else { return };
        let max = terms.max_items.max(1);
        if let Some(waiting) = self.outbox.remove(&index) {
            let prepares: Vec<_> = waiting
                .prepares
                .into_iter()
                .filter(|(rid, _)| self.calls.contains_key(rid))
                .collect();
            for chunk in prepares.chunks(max) {
                let batch = io.rid();
                self.sent_batches.insert(
                    batch,
                    SentBatch {
                        items: chunk.iter().map(|(r, p)| (*r, p.gtid.clone())).collect(),
                        lines: 0,
                    },
                );
                io.send(Msg {
                    to: Some(Node::Participant(index)),
                    body: Body::PrepareBatch {
                        batch,
                        from: self.incarnation,
                        items: chunk.iter().map(|(_, p)| p.clone()).enumerate().collect(),
                    },
                });
            }
            let decisions: Vec<_> = waiting
                .decisions
                .into_iter()
                .filter(|(rid, ..)| self.calls.contains_key(rid))
                .collect();
            for chunk in decisions.chunks(max) {
                let batch = io.rid();
                self.sent_batches.insert(
                    batch,
                    SentBatch {
                        items: chunk.iter().map(|(r, _, d)| (*r, d.gtid.clone())).collect(),
                        lines: 0,
                    },
                );
                io.send(Msg {
                    to: Some(Node::Participant(index)),
                    body: Body::DecideBatch {
                        batch,
                        from: self.incarnation,
                        items: chunk
                            .iter()
                            .enumerate()
                            .map(|(i, (_, decision, request))| (i, *decision, request.clone()))
                            .collect(),
                    },
                });
            }
        }
        // Batches all of whose items ended (answered or timed out) are done.
        let calls = &self.calls;
        self.sent_batches
            .retain(|_, sent| sent.items.iter().any(|(rid, _)| calls.contains_key(rid)));
    }

    /// One answer line of a batch call of this run.
    pub(super) fn line_answered(
        &mut self,
        io: &mut Io,
        batch: RequestId,
        index: usize,
        gtid: &GlobalTxId,
        answer: LineAnswer,
    ) {
        let by_position = io.mutation == Mutation::BatchAnswerByPosition;
        let Some(sent) = self.sent_batches.get_mut(&batch) else {
            return;
        };
        let position = if by_position {
            sent.lines += 1;
            sent.lines - 1
        } else {
            index
        };
        // A line for no item of the call: nothing to credit.
        let Some((rid, expected)) = sent.items.get(position).cloned() else {
            return;
        };
        let answer = if by_position || expected == *gtid {
            answer
        } else {
            self.lines_refused += 1;
            io.note(|| {
                format!("coordinator refuses a line for item {index} of batch {batch}: it names {gtid}, the item is {expected}")
            });
            mismatch(answer, gtid, &expected)
        };
        match (self.calls.get(&rid), answer) {
            (Some(Call::Prepare(..)), LineAnswer::Vote(vote)) => {
                self.prepare_answered(io, rid, vote)
            }
            (Some(Call::Deliver(..)), LineAnswer::Ack(ack)) => self.decision_answered(io, rid, ack),
            // An answer of the other kind: an error answer for the item.
            (Some(Call::Prepare(..)), LineAnswer::Ack(_)) => self.prepare_answered(
                io,
                rid,
                Err(ErrorBody::new(ErrorCode::Internal, "an ack to a prepare")),
            ),
            (Some(Call::Deliver(..)), LineAnswer::Vote(_)) => self.decision_answered(
                io,
                rid,
                Err(ErrorBody::new(ErrorCode::Internal, "a vote to a decision")),
            ),
            (Some(Call::Probe(..)) | None, _) => {}
        }
    }

    /// The attempts of a batch call's items by index, while it is in flight: what an
    /// adversary on the wire saw of it (`forger::forge_line`).
    pub fn batch_items(&self, batch: RequestId) -> Vec<GlobalTxId> {
        self.sent_batches
            .get(&batch)
            .map(|sent| sent.items.iter().map(|(_, g)| g.clone()).collect())
            .unwrap_or_default()
    }
}

/// The error answer a line that names another attempt counts as, of the item's kind.
fn mismatch(answer: LineAnswer, named: &GlobalTxId, expected: &GlobalTxId) -> LineAnswer {
    let body = ErrorBody::new(
        ErrorCode::Internal,
        format!("the answer line names {named}, the item is {expected}"),
    );
    match answer {
        LineAnswer::Vote(_) => LineAnswer::Vote(Err(body)),
        LineAnswer::Ack(_) => LineAnswer::Ack(Err(body)),
    }
}
