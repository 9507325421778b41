//! The modelled network: messages between the nodes, etcd and the clients, on FIFO links (a
//! TCP or gRPC connection keeps order), each with a drawn delay (sometimes a long spike),
//! sometimes lost, never delivered across a partition (checked when sent and when due), and
//! slower from a node that lags. Keep-alives have their own lane, which sometimes stalls. It draws only from the generator it is handed.

use std::collections::BTreeMap;

use super::Rec;
use super::etcd::{Op, Reply};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum End {
    Node(usize),
    Etcd,
    Client,
}

#[derive(Debug, Clone)]
pub enum Msg {
    ToEtcd {
        from: usize,
        inc: u64,
        rid: u64,
        sent_at: u64,
        op: Op,
    },
    FromEtcd {
        to: usize,
        inc: u64,
        rid: u64,
        sent_at: u64,
        reply: Reply,
    },
    /// A leader's base backup: the follower's log becomes `log` (durably, at once).
    Backup {
        from: usize,
        to: usize,
        epoch: u64,
        stream: u64,
        log: Vec<Rec>,
    },
    /// Records of the stream, written at offset `at` of the follower's log.
    Ship {
        from: usize,
        to: usize,
        epoch: u64,
        stream: u64,
        at: usize,
        recs: Vec<Rec>,
    },
    /// The follower holds `len` records of the stream durably.
    Confirm {
        from: usize,
        to: usize,
        stream: u64,
        len: usize,
    },
    /// The follower does not follow `stream` (it restarted): send a base backup.
    NeedBackup { from: usize, to: usize, stream: u64 },
    /// A client asks a node to decide (or tell the decision of) an attempt.
    Decide { to: usize, attempt: u64 },
}

impl Msg {
    /// Keep-alives travel on their own stream (etcd's lease stream), ordered apart from the
    /// key-value calls, and stall on their own.
    fn lane(&self) -> u8 {
        match self {
            Msg::ToEtcd {
                op: Op::KeepAlive { .. },
                ..
            }
            | Msg::FromEtcd {
                reply: Reply::KeptAlive { .. },
                ..
            } => 1,
            _ => 0,
        }
    }

    pub fn ends(&self) -> (End, End) {
        match self {
            Msg::ToEtcd { from, .. } => (End::Node(*from), End::Etcd),
            Msg::FromEtcd { to, .. } => (End::Etcd, End::Node(*to)),
            Msg::Backup { from, to, .. }
            | Msg::Ship { from, to, .. }
            | Msg::Confirm { from, to, .. }
            | Msg::NeedBackup { from, to, .. } => (End::Node(*from), End::Node(*to)),
            Msg::Decide { to, .. } => (End::Client, End::Node(*to)),
        }
    }

    /// The node this message is for, if any.
    pub fn to_node(&self) -> Option<usize> {
        match self.ends().1 {
            End::Node(i) => Some(i),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct Net {
    queue: Vec<(u64, u64, Msg)>,
    seq: u64,
    /// The last delivery time scheduled per link and lane (FIFO).
    last: BTreeMap<(End, End, u8), u64>,
    /// Partitioned pairs (smaller end first) and when they heal.
    cut: BTreeMap<(End, End), u64>,
    /// Per node, until when its outgoing messages are slow.
    lag_until: Vec<u64>,
}

fn pair(a: End, b: End) -> (End, End) {
    if a <= b { (a, b) } else { (b, a) }
}

impl Net {
    pub fn new(nodes: usize) -> Net {
        Net {
            queue: Vec::new(),
            seq: 0,
            last: BTreeMap::new(),
            cut: BTreeMap::new(),
            lag_until: vec![0; nodes],
        }
    }

    pub fn is_cut(&self, a: End, b: End, now: u64) -> bool {
        self.cut.get(&pair(a, b)).is_some_and(|until| *until > now)
    }

    pub fn partition(&mut self, a: End, b: End, until: u64) {
        self.cut.insert(pair(a, b), until);
    }

    pub fn lag(&mut self, node: usize, until: u64) {
        self.lag_until[node] = until;
    }

    /// Sends `msg` at `now`; `faults` off means no loss and no spikes (the calm phase).
    pub fn send(&mut self, rng: &mut fastrand::Rng, now: u64, msg: Msg, faults: bool) {
        let (from, to) = msg.ends();
        if self.is_cut(from, to, now) || (faults && rng.u32(0..100) < 2) {
            return;
        }
        let lane = msg.lane();
        let mut delay = if faults && lane == 1 && rng.u32(0..100) < 3 {
            // A stalled lease stream: etcd may expire a lease whose holder is fine.
            rng.u64(100..300)
        } else if faults && rng.u32(0..100) < 4 {
            rng.u64(30..200)
        } else {
            rng.u64(1..8)
        };
        if let End::Node(i) = from
            && self.lag_until[i] > now
        {
            delay += rng.u64(20..120);
        }
        let link = self.last.entry((from, to, lane)).or_insert(0);
        let at = (now + delay).max(*link);
        *link = at;
        self.seq += 1;
        self.queue.push((at, self.seq, msg));
    }

    /// The messages due by `now`, in delivery order; those crossing a partition are lost.
    pub fn due(&mut self, now: u64) -> Vec<Msg> {
        self.queue.sort_by_key(|(at, seq, _)| (*at, *seq));
        let n = self.queue.iter().take_while(|(at, ..)| *at <= now).count();
        let msgs: Vec<Msg> = self.queue.drain(..n).map(|(_, _, m)| m).collect();
        msgs.into_iter()
            .filter(|m| {
                let (a, b) = m.ends();
                !self.is_cut(a, b, now)
            })
            .collect()
    }
}
