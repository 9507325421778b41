//! What reaches the coordinator: client submits (looked up in the outcome index first, with
//! the promise that a recorded outcome is never begun again), participants' votes and acks,
//! alone or as a batch's answer lines (a refusal that fences this run out stepped as evidence), decision queries answered and
//! checked, and its timers.

use coordinator::engine::{Command, Event};
use protocol::{
    DecisionQueryResponse, DecisionStatus, ErrorBody, ErrorCode, ParticipantName, TxId, Vote,
    VoteKind,
};

use super::{Call, CoordinatorNode, PROBE_RETRY_MS, SubmitTx};
use crate::sim::Mutation;
use crate::sim::io::Io;
use crate::sim::net::{Body, Incarnation, Msg, Node, RequestId, Timer};

impl CoordinatorNode {
    pub fn submit(&mut self, io: &mut Io, order: usize, attempt: u32, tx: &SubmitTx) {
        if self.is_behind() {
            // 503 log_behind: the client hears no outcome and tries again later.
            io.note(|| format!("coordinator refuses {} (log behind)", tx.txid));
            return;
        }
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.insert(waiter, (order, attempt));
        let Some(engine) = &self.engine else {
            return;
        };
        // What a retry must be answered from: staged in the engine, or in the index.
        let recorded = engine
            .status(&tx.txid)
            .filter(|s| s.ended_at_ms.is_some())
            .map(|s| s.gtid)
            .or_else(|| {
                self.index
                    .get(&tx.txid)
                    .map(|r| r.decision.attempt.gtid.clone())
            });
        let recorded_digest = self
            .index
            .get(&tx.txid)
            .map(|r| r.decision.digest)
            .filter(|_| recorded.is_some());
        let archived = self.index.get(&tx.txid).cloned();
        let archive_generation = engine.archive_generation();
        let commands = self.step_collect(
            io,
            Event::Submit {
                waiter,
                wait: tx.wait,
                txid: tx.txid.clone(),
                digest: tx.digest,
                participants: tx.participants.clone(),
                timeout_ms: tx.timeout_ms,
                now_ms: io.now_ms,
                archived,
                archive_generation,
                client: None,
            },
        );
        if let Some(gtid) = recorded {
            for command in &commands {
                let broken = match command {
                    Command::SendPrepare { attempt, .. } => Some(format!(
                        "a retry of {} started attempt {} though outcome {gtid} is recorded",
                        tx.txid, attempt.gtid
                    )),
                    Command::Reply {
                        reply: coordinator::engine::Reply::Outcome(response),
                        ..
                    } if response.gtid != gtid => Some(format!(
                        "a retry of {} was answered from {} though outcome {gtid} is recorded",
                        tx.txid, response.gtid
                    )),
                    Command::Reply {
                        reply: coordinator::engine::Reply::Conflict { .. },
                        ..
                    } if recorded_digest == Some(tx.digest) => Some(format!(
                        "a same-body retry of {} got a conflict; outcome {gtid} is recorded",
                        tx.txid
                    )),
                    _ => None,
                };
                if let Some(broken) = broken
                    && self.outcome_violation.is_none()
                {
                    self.outcome_violation = Some(broken);
                }
            }
        }
    }

    pub fn deliver(&mut self, io: &mut Io, body: Body) {
        if !self.is_up() {
            return;
        }
        match body {
            Body::PrepareAnswer { rid, to, answer } if to == self.incarnation => {
                self.prepare_answered(io, rid, answer);
            }
            Body::DecideAnswer { rid, to, answer } if to == self.incarnation => {
                self.decision_answered(io, rid, answer);
            }
            Body::BatchAnswer {
                batch,
                to,
                index,
                gtid,
                answer,
            } if to == self.incarnation => self.line_answered(io, batch, index, &gtid, answer),
            Body::Query {
                rid,
                from,
                txid,
                query,
            } => {
                let (Some(engine), Some(identity)) = (&self.engine, &self.identity) else {
                    return;
                };
                let mut answer = self.answer_query(engine, &txid, &query);
                let response_identity = identity.clone();
                // The mutation: presume abort where the log cannot prove it.
                if io.mutation == Mutation::AbortWhenUnknown
                    && answer.decision == DecisionStatus::Unknown
                {
                    answer.decision = DecisionStatus::Abort;
                }
                let broken = self.check_answer(engine, &txid, &query, answer.decision);
                if self.answer_violation.is_none() {
                    self.answer_violation = broken;
                }
                if answer.unknown_run {
                    // A claim, not evidence: counted.
                    self.unknown_run_queries += 1;
                    if io.mutation == Mutation::BehindFromQuery {
                        // The mutation: the old rule, a query's say-so stops new work.
                        self.stopped_by_query = true;
                    }
                }
                io.send(Msg {
                    to: Some(Node::Participant(from.0)),
                    body: Body::QueryAnswer {
                        rid,
                        to: from.1,
                        answer: DecisionQueryResponse {
                            decision: answer.decision,
                            coordinator_id: Some(response_identity.coordinator_id),
                            epoch: Some(response_identity.epoch),
                            incarnation: Some(response_identity.incarnation),
                            reason: answer.reason,
                        },
                    },
                });
            }
            // Answers for a previous incarnation, and messages that are not for us.
            Body::PrepareAnswer { .. }
            | Body::DecideAnswer { .. }
            | Body::BatchAnswer { .. }
            | Body::Submit { .. }
            | Body::ClientAnswer { .. }
            | Body::Prepare { .. }
            | Body::Decide { .. }
            | Body::PrepareBatch { .. }
            | Body::DecideBatch { .. }
            | Body::QueryAnswer { .. } => {}
        }
    }

    /// The answer to the prepare call `rid` (a lone message's, or an item's line).
    pub(super) fn prepare_answered(
        &mut self,
        io: &mut Io,
        rid: RequestId,
        answer: Result<Vote, ErrorBody>,
    ) {
        if let Some(Call::Prepare(txid, participant, sent)) = self.calls.remove(&rid) {
            let (vote, reason) = match answer {
                Ok(Vote::Yes) => (VoteKind::Yes, None),
                Ok(Vote::No { reason }) => (VoteKind::No, Some(reason)),
                Err(refusal) => {
                    if fences_out(refusal.error) {
                        self.fenced(io, participant.clone(), "a prepare", sent, &refusal);
                    }
                    (VoteKind::Error, Some(refusal.message))
                }
            };
            self.vote(io, txid, participant, vote, reason);
        }
    }

    /// The answer to the decision call `rid` (a lone message's, an item's line, or the
    /// epoch probe's).
    pub(super) fn decision_answered(
        &mut self,
        io: &mut Io,
        rid: RequestId,
        answer: Result<(), ErrorBody>,
    ) {
        match self.calls.remove(&rid) {
            Some(Call::Deliver(txid, participant, sent)) => {
                let event = match answer {
                    Ok(()) => Event::Acked {
                        txid,
                        participant,
                        now_ms: io.now_ms,
                    },
                    Err(refusal) => {
                        // As the runtime: the failure first, then the evidence (a raise
                        // restarts the delivery waiting for its timer).
                        let failed = Event::DeliveryFailed {
                            txid,
                            participant: participant.clone(),
                            error: refusal.message.clone(),
                            jitter: io.rng.u64(..),
                        };
                        self.step(io, failed);
                        if fences_out(refusal.error) {
                            self.fenced(io, participant, "a decision", sent, &refusal);
                        }
                        return;
                    }
                };
                self.step(io, event);
            }
            Some(Call::Probe(index, sent)) => match answer {
                Ok(()) => io.note(|| format!("participant {index} acknowledges the probe")),
                Err(refusal) if fences_out(refusal.error) => {
                    let participant = self.participants[index].clone();
                    self.fenced(io, participant, "the epoch probe", sent, &refusal);
                }
                Err(_) => self.timer_after(io, PROBE_RETRY_MS, Timer::ProbeDue(index)),
            },
            Some(Call::Prepare(..)) | None => {}
        }
    }

    fn vote(
        &mut self,
        io: &mut Io,
        txid: TxId,
        participant: ParticipantName,
        vote: VoteKind,
        reason: Option<String>,
    ) {
        self.step(
            io,
            Event::VoteReceived {
                txid,
                participant,
                vote,
                reason,
                now_ms: io.now_ms,
            },
        );
    }

    pub fn timer(&mut self, io: &mut Io, incarnation: Incarnation, timer: Timer) {
        if !self.is_up() || incarnation != self.incarnation {
            return;
        }
        match timer {
            Timer::PrepareDeadline(txid) => self.step(
                io,
                Event::PrepareDeadline {
                    txid,
                    now_ms: io.now_ms,
                },
            ),
            Timer::RetryDue(txid, participant) => {
                self.step(io, Event::RetryDue { txid, participant })
            }
            Timer::ProbeDue(index) => self.probe(io, index),
            Timer::FlushBatches(index) => self.flush_batches(io, index),
            Timer::RequestTimeout(rid) => match self.calls.remove(&rid) {
                Some(Call::Probe(index, _)) => self.probe(io, index),
                Some(Call::Prepare(txid, participant, _)) => {
                    // The mutation: a prepare that got no answer counts as a yes.
                    let vote = match io.mutation {
                        Mutation::TimeoutCountsAsYes => VoteKind::Yes,
                        Mutation::None
                        | Mutation::PhaseTwoBeforeDurable
                        | Mutation::VoteBeforePreparedDurable
                        | Mutation::AbortWhenUnknown
                        | Mutation::ResolveWithoutEvidence
                        | Mutation::NoEpochBound
                        | Mutation::BehindFromQuery
                        | Mutation::UncheckedClaim
                        | Mutation::NoEpochRaise
                        | Mutation::BatchAnswerByPosition => VoteKind::Timeout,
                    };
                    self.vote(io, txid, participant, vote, None);
                }
                Some(Call::Deliver(txid, participant, _)) => {
                    let jitter = io.rng.u64(..);
                    self.step(
                        io,
                        Event::DeliveryFailed {
                            txid,
                            participant,
                            error: "timed out".into(),
                            jitter,
                        },
                    );
                }
                None => {}
            },
            Timer::Tick => {}
        }
    }
}

/// Whether a participant's error answer proves this run's log is behind what it saw.
fn fences_out(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::StaleEpoch | ErrorCode::IncarnationConflict)
}
