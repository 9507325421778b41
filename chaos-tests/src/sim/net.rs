//! Simulated time and the message network: one queue of timed events, and a network that
//! delivers, drops, duplicates, delays (and so reorders) messages by the seeded generator.
//!
//! A request goes to a node whatever incarnation is running when it arrives; a response goes
//! to the incarnation that sent the request (an HTTP response travels on the caller's
//! connection, so it dies with the caller's process).
//!
//! Batches (issue 28) meet harsher faults than TCP allows, so that nothing rests on a batch's
//! grouping or order: besides being lost, duplicated or delayed whole, a batch is split in two
//! (each part delayed and lost on its own) and its items reordered, every item keeping the
//! index it had in the request the coordinator built; each answer line is a message of its own
//! (lines overtake each other), and a batch's answer stream breaks after a few lines
//! ([`Connections`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use coordinator::engine::Reply as ClientReply;
use protocol::{
    Decision, DecisionQuery, DecisionQueryResponse, DecisionRequest, ErrorBody, GlobalTxId,
    PrepareRequest, TxId, Vote,
};

/// Identifies an outstanding request (an HTTP call) so its response and its timeout resolve it
/// once.
pub type RequestId = u64;

/// A node's incarnation: rises at every restart.
pub type Incarnation = u64;

/// Who a message is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Coordinator,
    Participant(usize),
}

/// What travels on the network.
#[derive(Debug, Clone)]
pub enum Body {
    /// Client -> coordinator: `POST /v1/transactions` (order index, attempt number).
    Submit { order: usize, attempt: u32 },
    /// Coordinator -> client: the answer to one attempt.
    ClientAnswer {
        order: usize,
        attempt: u32,
        reply: ClientReply,
    },
    Prepare {
        rid: RequestId,
        from: Incarnation,
        request: PrepareRequest,
    },
    /// `Ok(vote)` or a non-vote answer (a rejection: 4xx with its error code).
    PrepareAnswer {
        rid: RequestId,
        to: Incarnation,
        answer: Result<Vote, ErrorBody>,
    },
    Decide {
        rid: RequestId,
        from: Incarnation,
        decision: Decision,
        request: DecisionRequest,
    },
    DecideAnswer {
        rid: RequestId,
        to: Incarnation,
        answer: Result<(), ErrorBody>,
    },
    /// `POST /2pc/batch/prepare`: `batch` names the HTTP call; each item is (its index in the
    /// request the coordinator built, the prepare).
    PrepareBatch {
        batch: RequestId,
        from: Incarnation,
        items: Vec<(usize, PrepareRequest)>,
    },
    /// `POST /2pc/batch/decide`: each item is (its index, the decision, what the lone
    /// `/2pc/commit` or `/2pc/abort` would carry).
    DecideBatch {
        batch: RequestId,
        from: Incarnation,
        items: Vec<(usize, Decision, DecisionRequest)>,
    },
    /// One line of a batch's answer (`protocol::batch::BatchAnswer`): the answer to the item
    /// at `index`, naming its attempt.
    BatchAnswer {
        batch: RequestId,
        to: Incarnation,
        index: usize,
        gtid: GlobalTxId,
        answer: LineAnswer,
    },
    /// Participant in doubt -> coordinator: `GET /v1/transactions/{txid}/decision?{query}`.
    Query {
        rid: RequestId,
        from: (usize, Incarnation),
        txid: TxId,
        query: DecisionQuery,
    },
    QueryAnswer {
        rid: RequestId,
        to: Incarnation,
        answer: DecisionQueryResponse,
    },
}

/// What an answer line carries: what the lone message's answer would have.
#[derive(Debug, Clone)]
pub enum LineAnswer {
    Vote(Result<Vote, ErrorBody>),
    Ack(Result<(), ErrorBody>),
}

impl Body {
    /// The batch call this message belongs to, and its items (0 for an answer line).
    pub fn batch(&self) -> Option<(RequestId, usize)> {
        match self {
            Body::PrepareBatch { batch, items, .. } => Some((*batch, items.len())),
            Body::DecideBatch { batch, items, .. } => Some((*batch, items.len())),
            Body::BatchAnswer { batch, .. } => Some((*batch, 0)),
            _ => None,
        }
    }
}

/// A message: to a node (`Some`) or to a client (`None`).
#[derive(Debug, Clone)]
pub struct Msg {
    pub to: Option<Node>,
    pub body: Body,
}

/// Everything that can happen at an instant of simulated time.
#[derive(Debug, Clone)]
pub enum Ev {
    Deliver(Msg),
    /// A timer of one incarnation of a node (dropped if that incarnation died).
    Timer {
        node: Node,
        incarnation: Incarnation,
        timer: Timer,
    },
    /// The disk of a node finishes an fdatasync.
    DiskSync {
        node: Node,
        incarnation: Incarnation,
    },
    Crash(Node),
    Restart(Node),
    Checkpoint(Node),
    /// An operator stops the coordinator cleanly and copies its data directory.
    Backup,
    /// An operator stops the coordinator and puts the copy back (the restore the docs must
    /// never advise, and that the coordinator must survive without splitting a decision).
    Restore,
    /// After the faults heal: an operator resolves what the coordinator cannot decide.
    Operator,
    /// A client sends (or resends) an order.
    ClientSend {
        order: usize,
        attempt: u32,
    },
    /// A client gives up waiting for one attempt.
    ClientTimeout {
        order: usize,
        attempt: u32,
    },
    /// Faults stop: no more drops, duplicates, crashes; every node comes back.
    Heal,
    /// An adversary without the peer token sends this participant a forged message.
    Forge(usize),
    /// An adversary that saw this batch on the wire sends the coordinator an answer line for
    /// one of its items naming another attempt.
    ForgeLine(RequestId),
    /// A hostile peer asks the coordinator for a decision naming a made-up run and epoch.
    HostileQuery,
    /// An operator who errs resolves with the wrong id, a gtid not yet given out, or one whose
    /// outcome the log already holds.
    HostileOperator,
}

#[derive(Debug, Clone)]
pub enum Timer {
    PrepareDeadline(TxId),
    RetryDue(TxId, protocol::ParticipantName),
    /// An HTTP call's own timeout.
    RequestTimeout(RequestId),
    /// A participant's periodic scan for transactions in doubt.
    Tick,
    /// The coordinator asks this participant (index) its epoch probe again.
    ProbeDue(usize),
    /// The coordinator's batch lane for this participant (index) flushes.
    FlushBatches(usize),
}

/// The event queue: earliest first, ties in scheduling order.
#[derive(Debug, Default)]
pub struct Queue {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    events: std::collections::BTreeMap<u64, Ev>,
    next: u64,
}

impl Queue {
    pub fn push(&mut self, at_ms: u64, ev: Ev) {
        let id = self.next;
        self.next += 1;
        self.heap.push(Reverse((at_ms, id)));
        self.events.insert(id, ev);
    }

    pub fn pop(&mut self) -> Option<(u64, Ev)> {
        let Reverse((at, id)) = self.heap.pop()?;
        let ev = self.events.remove(&id)?;
        Some((at, ev))
    }
}

/// How unreliable the network is while faults are on.
#[derive(Debug, Clone, Copy)]
pub struct NetFaults {
    /// Percent of messages lost.
    pub drop_pct: u32,
    /// Percent of messages delivered twice.
    pub dup_pct: u32,
    /// Most delay of a message; delays are drawn per copy, so messages overtake each other.
    pub delay_max_ms: u64,
    /// Percent of messages held far longer (past most timeouts).
    pub long_delay_pct: u32,
    /// Percent of batches (of two items or more) split in two, and whose items are reordered.
    pub split_pct: u32,
    pub reorder_pct: u32,
    /// Percent of batch calls whose answer stream breaks after a few lines.
    pub cut_pct: u32,
}

impl NetFaults {
    pub const NONE: NetFaults = NetFaults {
        drop_pct: 0,
        dup_pct: 0,
        delay_max_ms: 5,
        long_delay_pct: 0,
        split_pct: 0,
        reorder_pct: 0,
        cut_pct: 0,
    };

    /// The delivery times of a message sent at `now_ms` (empty: lost).
    pub fn schedule(&self, rng: &mut fastrand::Rng, now_ms: u64) -> Vec<u64> {
        if rng.u32(0..100) < self.drop_pct {
            return Vec::new();
        }
        let copies = if rng.u32(0..100) < self.dup_pct { 2 } else { 1 };
        (0..copies)
            .map(|_| {
                let delay = if rng.u32(0..100) < self.long_delay_pct {
                    rng.u64(self.delay_max_ms..=self.delay_max_ms * 20 + 1)
                } else {
                    rng.u64(1..=self.delay_max_ms.max(1))
                };
                now_ms + delay
            })
            .collect()
    }
}

/// What the network did to a batch on its way.
#[derive(Debug, Default)]
pub struct Reshaped {
    pub msgs: Vec<Msg>,
    pub split: bool,
    pub reordered: bool,
}

impl NetFaults {
    /// A batch's items reordered and maybe split over two messages (each keeps its index);
    /// any other message as it is.
    pub fn reshape(&self, rng: &mut fastrand::Rng, msg: Msg) -> Reshaped {
        let mut out = Reshaped::default();
        let to = msg.to;
        match msg.body {
            Body::PrepareBatch { batch, from, items } => {
                let parts = self.cut_items(rng, items, &mut out);
                for items in parts {
                    out.msgs.push(Msg {
                        to,
                        body: Body::PrepareBatch { batch, from, items },
                    });
                }
            }
            Body::DecideBatch { batch, from, items } => {
                let parts = self.cut_items(rng, items, &mut out);
                for items in parts {
                    out.msgs.push(Msg {
                        to,
                        body: Body::DecideBatch { batch, from, items },
                    });
                }
            }
            body => out.msgs.push(Msg { to, body }),
        }
        out
    }

    fn cut_items<T>(
        &self,
        rng: &mut fastrand::Rng,
        mut items: Vec<T>,
        out: &mut Reshaped,
    ) -> Vec<Vec<T>> {
        if items.len() < 2 {
            return vec![items];
        }
        if rng.u32(0..100) < self.reorder_pct {
            rng.shuffle(&mut items);
            out.reordered = true;
        }
        if rng.u32(0..100) < self.split_pct {
            let rest = items.split_off(rng.usize(1..items.len()));
            out.split = true;
            return vec![items, rest];
        }
        vec![items]
    }
}

/// The answer streams of batch calls: whether each broke, and how many lines it still
/// carries.
#[derive(Debug, Default)]
pub struct Connections {
    /// Per batch call, the lines it still carries (`None`: it does not break); a duplicate of
    /// the request shares its call's.
    left: std::collections::BTreeMap<RequestId, Option<u32>>,
}

impl Connections {
    /// Whether this answer line of `batch` gets through the call's connection (drawn at its
    /// first line: with `cut_pct`, the stream breaks after 0 to 2 lines).
    pub fn carries(
        &mut self,
        faults: &NetFaults,
        rng: &mut fastrand::Rng,
        batch: RequestId,
    ) -> bool {
        let left = self
            .left
            .entry(batch)
            .or_insert_with(|| (rng.u32(0..100) < faults.cut_pct).then(|| rng.u32(0..=2)));
        match left {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}
