//! A participant's runtime, modelled: it feeds events to the real pure engine
//! (`participant::Engine` over the real `KvStore`) and executes its commands with the real
//! shell's contract: records appended in command order; a reply that follows a forced record
//! leaves only once that record is durable (a yes only after its Prepared record, an ack only
//! after its Committed/Aborted record); periodic ticks ask the coordinator about transactions in
//! doubt. Restart rebuilds the engine from the checkpoint (`Engine::restore`) or the seed, then
//! `Engine::replay` of every record the disk kept, as `Participant::open` does.
//!
//! A prepare that queues for locks is answered by a later step's `Deliver` (after the forced
//! records before it, as any reply). A crash drops the queue with the engine: the coordinator
//! hears nothing and its request times out, as with a real participant.
//!
//! A batch (issue 28) is its items in the order they arrive, each handled exactly as the lone
//! message ([`ParticipantNode::deliver_item`]); each answer is a line of its own, sent once
//! that item's records are durable (the items' forced records share the disk's next sync, the
//! one forced write per batch), so an item waiting for a lock holds back no other. The
//! scheduler hands the items over one by one, with a crash point after each.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use participant::Rejection;
use participant::kv::KvStore;
use participant::record::Record;
use participant::snapshot::Snapshot;
use participant::{Command, Engine, EngineConfig, Event, Reply};
use protocol::{Decision, ErrorBody, ErrorCode, GlobalTxId, Vote};

use super::Mutation;
use super::disk::Disk;
use super::io::Io;
use super::net::{Body, Ev, Incarnation, Msg, Node, RequestId, Timer};
pub use super::phase_items::{Item, ReplyTo, batch_items};

/// How an attempt ended at a participant, as its log says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Committed,
    Aborted,
    /// Voted no (a `Refused` record).
    Refused,
}

/// What a checkpoint keeps: the engine's snapshot, and (for the checks) the outcomes of the
/// records it replaces.
#[derive(Debug, Clone)]
pub struct PartSnapshot {
    pub engine: Snapshot,
    pub ended: BTreeMap<GlobalTxId, Ended>,
}

#[derive(Debug)]
pub struct ParticipantNode {
    pub index: usize,
    pub config: EngineConfig,
    pub tick_ms: u64,
    pub query_timeout_ms: u64,
    seed: KvStore,
    pub disk: Disk<Record, PartSnapshot>,
    pub incarnation: Incarnation,
    pub engine: Option<Engine<KvStore>>,
    /// Outcomes in the current log (snapshot included); rebuilt from what a crash kept.
    pub ended: BTreeMap<GlobalTxId, Ended>,
    /// An attempt that ended two ways in this participant's log.
    pub conflict: Option<String>,
    /// Ground truth for the checks, kept across crashes: every attempt whose Prepared record
    /// was ever durable here (what a yes vote must rest on).
    pub durably_prepared: BTreeSet<GlobalTxId>,
    /// Replies waiting for their forced record: (sequence number, message).
    reply_waits: Vec<(u64, Msg)>,
    queries: BTreeMap<RequestId, GlobalTxId>,
    /// Prepares queued in the engine, by waiter id: whom to answer.
    waiters: BTreeMap<u64, ReplyTo>,
    next_waiter: u64,
    /// Prepares that queued for a lock, and those of them later granted (a deferred yes).
    pub lock_waits: u64,
    pub lock_grants: u64,
    sync_scheduled: bool,
    /// Bumped whenever the log or the engine's store may have changed; `checked` is the value
    /// the last store check saw.
    pub changes: Cell<u64>,
    pub checked: Cell<u64>,
}

impl ParticipantNode {
    pub fn new(index: usize, config: EngineConfig, seed: KvStore) -> Self {
        Self {
            index,
            config,
            tick_ms: 250,
            query_timeout_ms: 300,
            seed,
            disk: Disk::new(),
            incarnation: 0,
            engine: None,
            ended: BTreeMap::new(),
            conflict: None,
            durably_prepared: BTreeSet::new(),
            reply_waits: Vec::new(),
            queries: BTreeMap::new(),
            waiters: BTreeMap::new(),
            next_waiter: 0,
            lock_waits: 0,
            lock_grants: 0,
            sync_scheduled: false,
            changes: Cell::new(1),
            checked: Cell::new(0),
        }
    }

    fn changed(&self) {
        self.changes.set(self.changes.get() + 1);
    }

    pub fn is_up(&self) -> bool {
        self.engine.is_some()
    }

    fn node(&self) -> Node {
        Node::Participant(self.index)
    }

    fn note_ended(&mut self, gtid: &GlobalTxId, ended: Ended) {
        match self.ended.get(gtid) {
            // Refused, then aborted: a late abort met a forgotten no vote and left a tombstone.
            // Both say "not committed"; only committed against not committed breaks a promise.
            Some(old) if (*old == Ended::Committed) != (ended == Ended::Committed) => {
                self.conflict.get_or_insert_with(|| {
                    format!(
                        "participant {} logged {gtid} as {old:?} and then as {ended:?}",
                        self.index
                    )
                });
            }
            Some(_) => {}
            None => {
                self.ended.insert(gtid.clone(), ended);
            }
        }
    }

    fn note_record(&mut self, record: &Record) {
        match record {
            Record::Committed { gtid, .. } => self.note_ended(&gtid.clone(), Ended::Committed),
            Record::Aborted { gtid, .. } => self.note_ended(&gtid.clone(), Ended::Aborted),
            Record::Refused { gtid, .. } => self.note_ended(&gtid.clone(), Ended::Refused),
            Record::Prepared { .. }
            | Record::Fence { .. }
            | Record::SagaOp { .. }
            | Record::FencedWrite { .. }
            | Record::FencedRepeat { .. }
            | Record::FenceReset(_)
            | Record::FencedStale { .. }
            | Record::Intent { .. } => {}
        }
    }

    fn note_durable(&mut self, records: &[Record]) {
        for record in records {
            if let Record::Prepared { gtid, .. } = record {
                self.durably_prepared.insert(gtid.clone());
            }
        }
    }

    /// The outcomes the log holds now (after a crash cut it back).
    fn rebuild_ended(&mut self) {
        self.ended = self
            .disk
            .snapshot()
            .map(|snap| snap.ended.clone())
            .unwrap_or_default();
        for record in self.disk.records().to_vec() {
            self.note_record(&record);
        }
    }

    /// (Re)starts from what the disk holds.
    pub fn start(&mut self, io: &mut Io) -> Result<(), String> {
        self.incarnation += 1;
        let mut engine = match self.disk.snapshot() {
            Some(snap) => Engine::restore(self.config.clone(), snap.engine.clone())
                .map_err(|e| format!("participant {} restore: {e}", self.index))?,
            None => Engine::new(self.config.clone(), self.seed.clone()),
        };
        for record in self.disk.records() {
            engine
                .replay(record.clone())
                .map_err(|e| format!("participant {} replay: {e}", self.index))?;
        }
        self.rebuild_ended();
        self.changed();
        // Opening the log fsyncs what survived.
        let newly = self.disk.sync();
        self.note_durable(&newly);
        self.engine = Some(engine);
        io.note(|| format!("participant {} up", self.index));
        self.arm_tick(io);
        Ok(())
    }

    /// Attempts this participant holds prepared whose last answer from the coordinator was
    /// `unknown` (its log cannot prove the outcome) or was ignored (another coordinator id, a
    /// lower epoch): in doubt until an operator resolves them, which is correct, not stuck.
    pub fn undecidable(
        &self,
    ) -> Vec<(
        protocol::TxId,
        protocol::CoordinatorId,
        protocol::DecisionQuery,
    )> {
        let Some(engine) = &self.engine else {
            return Vec::new();
        };
        engine
            .prepared_list()
            .into_iter()
            .filter(|p| {
                p.last_answer
                    .as_deref()
                    .is_some_and(|a| a.starts_with("unknown") || a.starts_with("ignored"))
            })
            .map(|p| {
                (
                    p.txid,
                    p.coordinator_id,
                    protocol::DecisionQuery {
                        gtid: p.gtid,
                        incarnation: p.incarnation,
                        epoch: p.epoch,
                        position: p.position,
                    },
                )
            })
            .collect()
    }

    pub fn crash(&mut self, extra: usize) {
        self.disk.crash(extra);
        self.rebuild_ended();
        self.changed();
        self.engine = None;
        self.reply_waits.clear();
        self.queries.clear();
        // Never logged: gone with the process; their coordinator requests time out.
        self.waiters.clear();
        self.sync_scheduled = false;
    }

    pub fn checkpoint(&mut self, io: &mut Io) {
        let Some(engine) = &self.engine else { return };
        let snapshot = PartSnapshot {
            engine: engine.snapshot().expect("a sim store always encodes"),
            ended: self.ended.clone(),
        };
        let newly = self.disk.checkpoint(snapshot);
        self.note_durable(&newly);
        io.note(|| format!("participant {} checkpoint", self.index));
        self.release_replies(io);
    }

    pub fn disk_synced(&mut self, io: &mut Io) {
        self.sync_scheduled = false;
        if !self.is_up() {
            return;
        }
        let newly = self.disk.sync();
        self.note_durable(&newly);
        self.release_replies(io);
    }

    fn release_replies(&mut self, io: &mut Io) {
        let durable = self.disk.durable_seq();
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .reply_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.reply_waits = waiting;
        for (_, msg) in ready {
            io.send(msg);
        }
    }

    fn arm_tick(&self, io: &mut Io) {
        io.after(
            self.tick_ms,
            Ev::Timer {
                node: self.node(),
                incarnation: self.incarnation,
                timer: Timer::Tick,
            },
        );
    }

    pub fn deliver(&mut self, io: &mut Io, body: Body) {
        if !self.is_up() {
            return;
        }
        match body {
            Body::Prepare { rid, from, request } => {
                self.deliver_item(io, Item::Prepare(ReplyTo::Call(rid, from), request));
            }
            Body::Decide {
                rid,
                from,
                decision,
                request,
            } => self.deliver_item(
                io,
                Item::Decide(ReplyTo::Call(rid, from), decision, request),
            ),
            body @ (Body::PrepareBatch { .. } | Body::DecideBatch { .. }) => {
                for item in batch_items(body) {
                    self.deliver_item(io, item);
                }
            }
            Body::QueryAnswer { rid, to, answer } if to == self.incarnation => {
                if let Some(gtid) = self.queries.remove(&rid) {
                    let entropy = io.rng.u64(..);
                    self.step(
                        io,
                        Event::DecisionAnswer {
                            gtid,
                            answer: Some(answer),
                            now_ms: io.now_ms,
                            entropy,
                        },
                    );
                }
            }
            Body::QueryAnswer { .. }
            | Body::Submit { .. }
            | Body::ClientAnswer { .. }
            | Body::PrepareAnswer { .. }
            | Body::DecideAnswer { .. }
            | Body::BatchAnswer { .. }
            | Body::Query { .. } => {}
        }
    }

    /// One phase message, handled as the lone message whatever carried it: stepped now,
    /// answered once the records it rests on are durable.
    pub fn deliver_item(&mut self, io: &mut Io, item: Item) {
        if !self.is_up() {
            return;
        }
        match item {
            Item::Prepare(to, request) => {
                let waiter = self.next_waiter;
                self.next_waiter += 1;
                // Registered before the step: a grant in this very step delivers to it.
                self.waiters.insert(waiter, to.clone());
                let reply = self.step(
                    io,
                    Event::Prepare {
                        request,
                        now_ms: io.now_ms,
                        waiter,
                    },
                );
                match reply {
                    Some((reply, wait)) => {
                        self.waiters.remove(&waiter);
                        self.answer_prepare(io, to, reply, wait);
                    }
                    None if self.waiters.contains_key(&waiter) => self.lock_waits += 1,
                    None => {}
                }
            }
            Item::Decide(to, decision, request) => {
                let now_ms = io.now_ms;
                let event = match decision {
                    Decision::Commit => Event::Commit { request, now_ms },
                    Decision::Abort => Event::Abort { request, now_ms },
                };
                let (answer, wait) = match self.step(io, event) {
                    Some((Reply::Ack, wait)) => (Ok(()), wait),
                    Some((Reply::Reject(r), wait)) => (Err(refusal(&r)), wait),
                    Some((
                        Reply::Vote(_) | Reply::Fenced(_) | Reply::FenceReset(_) | Reply::Intent(_),
                        wait,
                    )) => (
                        Err(ErrorBody::new(ErrorCode::Internal, "vote to a decision")),
                        wait,
                    ),
                    None => return,
                };
                self.reply(io, to.ack(answer), wait);
            }
        }
    }

    /// Sends a vote (now or deferred) once the forced record at `wait` is durable.
    fn answer_prepare(&mut self, io: &mut Io, to: ReplyTo, reply: Reply, wait: Option<u64>) {
        let is_yes = matches!(reply, Reply::Vote(Vote::Yes));
        let answer = match reply {
            Reply::Vote(vote) => Ok(vote),
            Reply::Reject(r) => Err(refusal(&r)),
            Reply::Ack | Reply::Fenced(_) | Reply::FenceReset(_) | Reply::Intent(_) => {
                Err(ErrorBody::new(ErrorCode::Internal, "ack to a prepare"))
            }
        };
        let msg = to.vote(answer);
        // The mutation: a yes leaves before its Prepared record is durable.
        let early = is_yes && io.mutation == Mutation::VoteBeforePreparedDurable;
        self.reply(io, msg, if early { None } else { wait });
    }

    fn reply(&mut self, io: &mut Io, msg: Msg, wait: Option<u64>) {
        match wait {
            Some(seq) if seq > self.disk.durable_seq() => self.reply_waits.push((seq, msg)),
            Some(_) | None => io.send(msg),
        }
    }

    pub fn timer(&mut self, io: &mut Io, incarnation: Incarnation, timer: Timer) {
        if !self.is_up() || incarnation != self.incarnation {
            return;
        }
        match timer {
            Timer::Tick => {
                self.step(io, Event::Tick { now_ms: io.now_ms });
                self.arm_tick(io);
            }
            Timer::RequestTimeout(rid) => {
                if let Some(gtid) = self.queries.remove(&rid) {
                    let entropy = io.rng.u64(..);
                    self.step(
                        io,
                        Event::DecisionAnswer {
                            gtid,
                            answer: None,
                            now_ms: io.now_ms,
                            entropy,
                        },
                    );
                }
            }
            Timer::PrepareDeadline(_)
            | Timer::RetryDue(..)
            | Timer::ProbeDue(_)
            | Timer::FlushBatches(_) => {}
        }
    }

    /// Steps the engine; executes logs and asks; returns the reply with the sequence number of
    /// the last forced record it must wait for.
    fn step(&mut self, io: &mut Io, event: Event) -> Option<(Reply, Option<u64>)> {
        let engine = self.engine.as_mut()?;
        let commands = engine.step(event);
        let mut wait = None;
        let mut reply = None;
        for command in commands {
            match command {
                Command::Log { record, forced } => {
                    self.changed();
                    self.note_record(&record);
                    let seq = self.disk.append(record);
                    if forced {
                        wait = Some(seq);
                        self.schedule_sync(io);
                    }
                }
                Command::Reply(r) => reply = Some(r),
                Command::Deliver { waiter, reply } => {
                    if let Some(to) = self.waiters.remove(&waiter) {
                        if matches!(reply, Reply::Vote(Vote::Yes)) {
                            self.lock_grants += 1;
                        }
                        // Its forced records precede it; the last forced one so far covers
                        // them (the log syncs in order).
                        self.answer_prepare(io, to, reply, wait);
                    }
                }
                Command::AskDecision { txid, query } => {
                    let rid = io.rid();
                    self.queries.insert(rid, query.gtid.clone());
                    io.send(Msg {
                        to: Some(Node::Coordinator),
                        body: Body::Query {
                            rid,
                            from: (self.index, self.incarnation),
                            txid,
                            query,
                        },
                    });
                    io.after(
                        self.query_timeout_ms,
                        Ev::Timer {
                            node: self.node(),
                            incarnation: self.incarnation,
                            timer: Timer::RequestTimeout(rid),
                        },
                    );
                }
            }
        }
        reply.map(|r| (r, wait))
    }

    fn schedule_sync(&mut self, io: &mut Io) {
        if !self.sync_scheduled {
            self.sync_scheduled = true;
            let delay = io.rng.u64(0..=io.sync_max_ms);
            io.after(
                delay,
                Ev::DiskSync {
                    node: self.node(),
                    incarnation: self.incarnation,
                },
            );
        }
    }
}

/// The error body a participant's HTTP layer answers a rejection with: a fencing refusal names
/// the highest epoch it holds for the sender's coordinator id, as the real one does.
fn refusal(rejection: &Rejection) -> ErrorBody {
    let body = ErrorBody::new(rejection.code(), rejection.to_string());
    match rejection.highest_epoch() {
        Some(epoch) => body.with_highest_epoch(epoch),
        None => body,
    }
}
