//! The runtime's contract around the engine's commands: appends in command order, a decision
//! acted on only once its forced append is durable (the mutation acts at once), sends (through
//! the batcher in a batching run) and timers for each call, and what completes at once fed straight back to the engine.

use coordinator::engine::{Command, Event};
use coordinator::records::LogRecord;
use protocol::{DecisionRequest, PrepareRequest, TxId};

use super::{Call, CoordinatorNode};
use crate::sim::Mutation;
use crate::sim::io::Io;
use crate::sim::net::{Body, Msg, Timer};

impl CoordinatorNode {
    /// Steps the engine and executes its commands in order, feeding back what completes at
    /// once.
    pub(super) fn step(&mut self, io: &mut Io, event: Event) {
        self.step_collect(io, event);
    }

    /// `step`, returning the commands it executed (for the submit checks).
    pub(super) fn step_collect(&mut self, io: &mut Io, event: Event) -> Vec<Command> {
        let Some(engine) = &mut self.engine else {
            return Vec::new();
        };
        let commands = engine.step(event);
        let mut durable_now = Vec::new();
        for command in commands.clone() {
            self.execute(io, command, &mut durable_now);
        }
        self.check_outcomes_held();
        for txid in durable_now {
            self.step(io, Event::DecisionDurable { txid });
        }
        commands
    }

    fn execute(&mut self, io: &mut Io, command: Command, durable_now: &mut Vec<TxId>) {
        let Some(identity) = self.identity.clone() else {
            return;
        };
        match command {
            Command::AppendForced(record) => {
                io.note(|| format!("coordinator logs (forced) {record:?}"));
                self.disk.append(record);
                self.schedule_sync(io);
            }
            Command::AppendEpoch(_) if io.mutation == Mutation::NoEpochRaise => {
                // The mutation: the evidence is marked, the epoch stays where it was.
                io.note(|| "coordinator does not raise its epoch (mutation)".to_string());
            }
            Command::AppendEpoch(raised) => {
                io.note(|| format!("coordinator raises its epoch to {}", raised.epoch));
                let seq = self.disk.append(LogRecord::Epoch(raised.clone()));
                self.epoch_waits.push((seq, raised));
                self.schedule_sync(io);
            }
            Command::AppendLazy(record) => {
                if let LogRecord::Begin(begin) = &record {
                    self.attempts.insert(
                        begin.attempt.gtid.clone(),
                        (begin.txid.clone(), begin.digest),
                    );
                }
                self.disk.append(record);
            }
            Command::AppendDecision(decision) => {
                let txid = decision.txid.clone();
                io.note(|| format!("coordinator logs {:?} {txid}", decision.decision));
                let seq = self.disk.append(LogRecord::Decision(decision));
                match io.mutation {
                    // The mutation: act on the decision before it is durable.
                    Mutation::PhaseTwoBeforeDurable => durable_now.push(txid),
                    Mutation::None
                    | Mutation::TimeoutCountsAsYes
                    | Mutation::VoteBeforePreparedDurable
                    | Mutation::AbortWhenUnknown
                    | Mutation::ResolveWithoutEvidence
                    | Mutation::NoEpochBound
                    | Mutation::BehindFromQuery
                    | Mutation::UncheckedClaim
                    | Mutation::NoEpochRaise
                    | Mutation::BatchAnswerByPosition => {
                        self.decision_waits.push((seq, txid));
                        self.schedule_sync(io);
                    }
                }
            }
            Command::SendPrepare {
                txid,
                attempt,
                participant,
                payload,
                timeout_ms,
                started_at_ms,
                named,
            } => {
                let rid = io.rid();
                let index = self.part_index(&participant);
                self.calls.insert(
                    rid,
                    Call::Prepare(txid.clone(), participant, identity.epoch),
                );
                let request = PrepareRequest {
                    txid,
                    gtid: attempt.gtid,
                    coordinator_id: identity.coordinator_id,
                    epoch: identity.epoch,
                    incarnation: identity.incarnation,
                    position: attempt.position,
                    payload,
                    started_at_ms: Some(started_at_ms),
                    // As the real runtime does: the no arrives before the deadline.
                    lock_wait_ms: Some(timeout_ms.saturating_mul(3) / 4),
                    participants: Some(named),
                };
                self.send_prepare(io, index, rid, request);
                self.timer_after(io, timeout_ms, Timer::RequestTimeout(rid));
            }
            Command::ArmPrepareDeadline { txid, after_ms } => {
                self.timer_after(io, after_ms, Timer::PrepareDeadline(txid));
            }
            Command::SendDecision {
                txid,
                gtid,
                participant,
                decision,
                attempt: _,
                // An untracked abort's answer is ignored by the engine, like the runtime's.
                tracked: _,
            } => {
                let rid = io.rid();
                let index = self.part_index(&participant);
                self.calls.insert(
                    rid,
                    Call::Deliver(txid.clone(), participant, identity.epoch),
                );
                let request = DecisionRequest {
                    txid,
                    gtid,
                    coordinator_id: identity.coordinator_id,
                    epoch: identity.epoch,
                    incarnation: identity.incarnation,
                };
                self.send_decision(io, index, rid, decision, request);
                self.timer_after(io, self.delivery_timeout_ms, Timer::RequestTimeout(rid));
            }
            Command::ArmRetry {
                txid,
                participant,
                after_ms,
            } => {
                self.timer_after(io, after_ms, Timer::RetryDue(txid, participant));
            }
            Command::Archive(retained) => {
                self.must_hold.insert(
                    retained.decision.txid.clone(),
                    retained.decision.attempt.gtid.clone(),
                );
                self.archive_batch.push(retained);
                self.schedule_sync(io);
            }
            Command::Reply { waiter, reply } => {
                if let Some((order, attempt)) = self.waiters.remove(&waiter) {
                    io.send(Msg {
                        to: None,
                        body: Body::ClientAnswer {
                            order,
                            attempt,
                            reply,
                        },
                    });
                }
            }
        }
    }
}
