//! The coordinator's runtime, modelled: it feeds events to the real pure engine
//! (`coordinator::engine::Engine`) and executes its commands against the simulated disk,
//! network and timers with the real runtime's contract: appends in command order; a decision
//! acted on (client answer, phase two) only after its forced append is durable; a prepare or a
//! delivery that gets no answer within its timeout counts as `Timeout` / a failed delivery.
//! Restart rebuilds the engine through `Engine::replay` from what the disk kept, logs the next
//! epoch (forced) and steps `RecoveryDone`, as `runtime::recover_on` does.

use std::collections::BTreeMap;

use coordinator::digest::Digest;
use coordinator::engine::{
    Command, DecisionLookup, Engine, EngineConfig, Event, WaitFor, WaiterId,
};
use coordinator::records::{EpochRecord, LogRecord, Snapshot};
use protocol::{
    CoordinatorId, Decision, DecisionRequest, Epoch, ParticipantName, PrepareRequest, TxId, Vote,
    VoteKind,
};

use super::Mutation;
use super::disk::Disk;
use super::io::Io;
use super::net::{Body, Ev, Incarnation, Msg, Node, RequestId, Timer};

/// An HTTP call the coordinator is waiting on.
#[derive(Debug, Clone)]
enum Call {
    Prepare(TxId, ParticipantName),
    Deliver(TxId, ParticipantName),
}

#[derive(Debug)]
pub struct CoordinatorNode {
    pub config: EngineConfig,
    pub delivery_timeout_ms: u64,
    pub participants: Vec<ParticipantName>,
    pub disk: Disk<LogRecord, Snapshot>,
    pub incarnation: Incarnation,
    /// `None` while crashed.
    pub engine: Option<Engine>,
    identity: Option<EpochRecord>,
    calls: BTreeMap<RequestId, Call>,
    waiters: BTreeMap<WaiterId, (usize, u32)>,
    /// Decision queries waiting for a presumed abort to be durable: (rid, from, txid).
    query_waiters: BTreeMap<WaiterId, (RequestId, (usize, Incarnation), TxId)>,
    next_waiter: WaiterId,
    /// Forced decision appends waiting for a sync: (sequence number, txid).
    decision_waits: Vec<(u64, TxId)>,
    sync_scheduled: bool,
    /// Ground truth for the checks: every decision that ever became durable (durable records
    /// are never lost, so this only grows), and any decision that flipped.
    pub durable_decisions: BTreeMap<TxId, Decision>,
    pub flipped: Option<String>,
}

impl CoordinatorNode {
    pub fn new(config: EngineConfig, participants: Vec<ParticipantName>) -> Self {
        Self {
            config,
            delivery_timeout_ms: 400,
            participants,
            disk: Disk::new(),
            incarnation: 0,
            engine: None,
            identity: None,
            calls: BTreeMap::new(),
            waiters: BTreeMap::new(),
            query_waiters: BTreeMap::new(),
            next_waiter: 1,
            decision_waits: Vec::new(),
            sync_scheduled: false,
            durable_decisions: BTreeMap::new(),
            flipped: None,
        }
    }

    pub fn is_up(&self) -> bool {
        self.engine.is_some()
    }

    fn node() -> Node {
        Node::Coordinator
    }

    fn part_index(&self, name: &ParticipantName) -> usize {
        self.participants
            .iter()
            .position(|p| p == name)
            .unwrap_or(usize::MAX)
    }

    fn note_durable(&mut self, records: &[LogRecord]) {
        for record in records {
            if let LogRecord::Decision(d) = record {
                match self.durable_decisions.get(&d.txid) {
                    Some(old) if *old != d.decision => {
                        self.flipped = Some(format!(
                            "durable decision for {} flipped from {old:?} to {:?}",
                            d.txid, d.decision
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.durable_decisions.insert(d.txid.clone(), d.decision);
                    }
                }
            }
        }
    }

    /// (Re)starts: replay what the disk holds, log the next epoch durably, finish recovery.
    pub fn start(&mut self, io: &mut Io) {
        self.incarnation += 1;
        let replayed = Engine::replay(
            self.config,
            self.disk.snapshot().cloned(),
            self.disk.records().to_vec(),
        );
        let identity = match replayed.identity {
            Some(last) => EpochRecord {
                coordinator_id: last.coordinator_id,
                epoch: last.epoch.next(),
            },
            None => EpochRecord {
                coordinator_id: CoordinatorId::new("c-sim").expect("a constant, valid id"),
                epoch: Epoch(1),
            },
        };
        // Opening the log fsyncs what survived; the epoch append is forced and awaited.
        self.disk.append(LogRecord::Epoch(identity.clone()));
        let newly = self.disk.sync();
        self.note_durable(&newly);
        io.note(|| format!("coordinator up, epoch {}", identity.epoch));
        self.identity = Some(identity);
        self.engine = Some(replayed.engine);
        self.step(io, Event::RecoveryDone { now_ms: io.now_ms });
        // Ticks are the participants' business; the coordinator needs no timer to start.
    }

    /// Crashes, keeping the durable records and `extra` of the unsynced ones.
    pub fn crash(&mut self, extra: usize) {
        self.disk.crash(extra);
        self.engine = None;
        self.calls.clear();
        self.waiters.clear();
        self.query_waiters.clear();
        self.decision_waits.clear();
        self.sync_scheduled = false;
    }

    pub fn checkpoint(&mut self, io: &mut Io) {
        let (Some(engine), Some(identity)) = (&self.engine, &self.identity) else {
            return;
        };
        let snapshot = engine.snapshot(identity.clone());
        let newly = self.disk.checkpoint(snapshot);
        self.note_durable(&newly);
        io.note(|| "coordinator checkpoint".into());
        self.resolve_durable(io);
    }

    pub fn disk_synced(&mut self, io: &mut Io) {
        self.sync_scheduled = false;
        if !self.is_up() {
            return;
        }
        let newly = self.disk.sync();
        self.note_durable(&newly);
        self.resolve_durable(io);
    }

    fn resolve_durable(&mut self, io: &mut Io) {
        let durable = self.disk.durable_seq();
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .decision_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.decision_waits = waiting;
        for (_, txid) in ready {
            self.step(io, Event::DecisionDurable { txid });
        }
    }

    pub fn submit(&mut self, io: &mut Io, order: usize, attempt: u32, tx: &SubmitTx) {
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.insert(waiter, (order, attempt));
        self.step(
            io,
            Event::Submit {
                waiter,
                wait: tx.wait,
                txid: tx.txid.clone(),
                digest: tx.digest,
                participants: tx.participants.clone(),
                timeout_ms: tx.timeout_ms,
                now_ms: io.now_ms,
            },
        );
    }

    pub fn deliver(&mut self, io: &mut Io, body: Body) {
        if !self.is_up() {
            return;
        }
        match body {
            Body::PrepareAnswer { rid, to, answer } if to == self.incarnation => {
                if let Some(Call::Prepare(txid, participant)) = self.calls.remove(&rid) {
                    let (vote, reason) = match answer {
                        Ok(Vote::Yes) => (VoteKind::Yes, None),
                        Ok(Vote::No { reason }) => (VoteKind::No, Some(reason)),
                        Err(e) => (VoteKind::Error, Some(e)),
                    };
                    self.vote(io, txid, participant, vote, reason);
                }
            }
            Body::DecideAnswer { rid, to, answer } if to == self.incarnation => {
                if let Some(Call::Deliver(txid, participant)) = self.calls.remove(&rid) {
                    let event = match answer {
                        Ok(()) => Event::Acked {
                            txid,
                            participant,
                            now_ms: io.now_ms,
                        },
                        Err(error) => Event::DeliveryFailed {
                            txid,
                            participant,
                            error,
                            jitter: io.rng.u64(..),
                        },
                    };
                    self.step(io, event);
                }
            }
            Body::Query { rid, from, txid } => {
                let Some(engine) = &self.engine else { return };
                match engine.decision_lookup(&txid) {
                    DecisionLookup::Known(answer) => io.send(Msg {
                        to: Some(Node::Participant(from.0)),
                        body: Body::QueryAnswer {
                            rid,
                            to: from.1,
                            txid,
                            answer,
                        },
                    }),
                    DecisionLookup::Unknown | DecisionLookup::PresumingAbort => {
                        let waiter = self.next_waiter;
                        self.next_waiter += 1;
                        self.query_waiters.insert(waiter, (rid, from, txid.clone()));
                        self.step(
                            io,
                            Event::UnknownIdQueried {
                                waiter,
                                txid,
                                now_ms: io.now_ms,
                            },
                        );
                    }
                }
            }
            // Answers for a previous incarnation, and messages that are not for us.
            Body::PrepareAnswer { .. }
            | Body::DecideAnswer { .. }
            | Body::Submit { .. }
            | Body::ClientAnswer { .. }
            | Body::Prepare { .. }
            | Body::Decide { .. }
            | Body::QueryAnswer { .. } => {}
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
            Timer::RequestTimeout(rid) => match self.calls.remove(&rid) {
                Some(Call::Prepare(txid, participant)) => {
                    // The mutation: a prepare that got no answer counts as a yes.
                    let vote = match io.mutation {
                        Mutation::TimeoutCountsAsYes => VoteKind::Yes,
                        Mutation::None
                        | Mutation::PhaseTwoBeforeDurable
                        | Mutation::VoteBeforePreparedDurable => VoteKind::Timeout,
                    };
                    self.vote(io, txid, participant, vote, None);
                }
                Some(Call::Deliver(txid, participant)) => {
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

    /// Steps the engine and executes its commands in order, feeding back what completes at
    /// once.
    fn step(&mut self, io: &mut Io, event: Event) {
        let Some(engine) = &mut self.engine else {
            return;
        };
        let commands = engine.step(event);
        let mut durable_now = Vec::new();
        for command in commands {
            self.execute(io, command, &mut durable_now);
        }
        for txid in durable_now {
            self.step(io, Event::DecisionDurable { txid });
        }
    }

    fn execute(&mut self, io: &mut Io, command: Command, durable_now: &mut Vec<TxId>) {
        let Some(identity) = self.identity.clone() else {
            return;
        };
        match command {
            Command::AppendLazy(record) => {
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
                    | Mutation::VoteBeforePreparedDurable => {
                        self.decision_waits.push((seq, txid));
                        self.schedule_sync(io);
                    }
                }
            }
            Command::SendPrepare {
                txid,
                participant,
                payload,
                timeout_ms,
            } => {
                let rid = io.rid();
                let index = self.part_index(&participant);
                self.calls
                    .insert(rid, Call::Prepare(txid.clone(), participant));
                io.send(Msg {
                    to: Some(Node::Participant(index)),
                    body: Body::Prepare {
                        rid,
                        from: self.incarnation,
                        request: PrepareRequest {
                            txid,
                            coordinator_id: identity.coordinator_id,
                            epoch: identity.epoch,
                            payload,
                        },
                    },
                });
                self.timer_after(io, timeout_ms, Timer::RequestTimeout(rid));
            }
            Command::ArmPrepareDeadline { txid, after_ms } => {
                self.timer_after(io, after_ms, Timer::PrepareDeadline(txid));
            }
            Command::SendDecision {
                txid,
                participant,
                decision,
                attempt: _,
            } => {
                let rid = io.rid();
                let index = self.part_index(&participant);
                self.calls
                    .insert(rid, Call::Deliver(txid.clone(), participant));
                io.send(Msg {
                    to: Some(Node::Participant(index)),
                    body: Body::Decide {
                        rid,
                        from: self.incarnation,
                        decision,
                        request: DecisionRequest {
                            txid,
                            coordinator_id: identity.coordinator_id,
                            epoch: identity.epoch,
                        },
                    },
                });
                self.timer_after(io, self.delivery_timeout_ms, Timer::RequestTimeout(rid));
            }
            Command::ArmRetry {
                txid,
                participant,
                after_ms,
            } => {
                self.timer_after(io, after_ms, Timer::RetryDue(txid, participant));
            }
            Command::Reply { waiter, reply } if self.query_waiters.contains_key(&waiter) => {
                let Some((rid, from, txid)) = self.query_waiters.remove(&waiter) else {
                    return;
                };
                let answer = match reply {
                    coordinator::engine::Reply::Outcome(r) => match r.outcome {
                        protocol::Outcome::Committed => protocol::DecisionStatus::Commit,
                        protocol::Outcome::Aborted => protocol::DecisionStatus::Abort,
                    },
                    coordinator::engine::Reply::Conflict { .. }
                    | coordinator::engine::Reply::LogFailed { .. } => return,
                };
                io.send(Msg {
                    to: Some(Node::Participant(from.0)),
                    body: Body::QueryAnswer {
                        rid,
                        to: from.1,
                        txid,
                        answer,
                    },
                });
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

    fn timer_after(&self, io: &mut Io, after_ms: u64, timer: Timer) {
        io.after(
            after_ms,
            Ev::Timer {
                node: Self::node(),
                incarnation: self.incarnation,
                timer,
            },
        );
    }

    fn schedule_sync(&mut self, io: &mut Io) {
        if !self.sync_scheduled {
            self.sync_scheduled = true;
            let delay = io.rng.u64(0..=io.sync_max_ms);
            io.after(
                delay,
                Ev::DiskSync {
                    node: Self::node(),
                    incarnation: self.incarnation,
                },
            );
        }
    }
}

/// A client transaction as the coordinator's API hands it to the engine.
#[derive(Debug, Clone)]
pub struct SubmitTx {
    pub txid: TxId,
    pub digest: Digest,
    pub participants: Vec<(ParticipantName, serde_json::Value)>,
    pub timeout_ms: u64,
    pub wait: WaitFor,
}
