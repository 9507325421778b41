//! One coordinator process of the group, outside its leader role: its log (durable and
//! unsynced), its etcd lease and keep-alives, the follower side of replication (base backups
//! and shipped records, each through `replica_verdict`), the watch of the leader key and the
//! campaign (`may_campaign`, freeze, create-if-absent txn, `next_term`), and the process's
//! life: SIGKILL (the unsynced part is lost), exit (a poisoned or deposed leader), restart.
//! The leader's own work is in `leader`; this file never acknowledges a record.

use coordinator::ha::rules::{self, GroupState, LeaderClaim, ReplicaVerdict};

use super::calls::{Purpose, Wait};
use super::etcd::{Cmp, Entry, Key, LeaseId, Op, Put, Reply, Value};
use super::leader::Lead;
use super::net::Msg;
use super::{
    ETCD_TIMEOUT_MS, HaBroken, KEEPALIVE_MS, RUN_MS, Rec, TTL_MS, WATCH_MS, World, last_epoch, name,
};

#[derive(Debug)]
pub struct Node {
    pub up: bool,
    pub inc: u64,
    pub restart_at: u64,
    pub paused_until: u64,
    pub durable: Vec<Rec>,
    pub unsynced: Vec<Rec>,
    /// The highest epoch seen from a leader's replication (volatile: from the log at start).
    pub highest_seen: u64,
    pub frozen: bool,
    pub lease: Option<LeaseId>,
    pub ttl: u64,
    /// When the last keep-alive (or the grant) that etcd confirmed was sent.
    pub last_ka_sent: u64,
    pub next_ka: u64,
    /// An outstanding grant: (request id, give-up time).
    pub grant: Option<(u64, u64)>,
    pub wait: Option<Wait>,
    /// As a follower: the leader and stream whose base backup this log is.
    pub upstream: Option<(usize, u64)>,
    pub lead: Option<Lead>,
    pub next_watch: u64,
    /// Messages that arrived while the process was stopped (SIGSTOP), read when it wakes.
    pub held: Vec<Msg>,
}

impl Node {
    pub fn new(log: Vec<Rec>, first_watch: u64) -> Node {
        let highest_seen = last_epoch(&log);
        Node {
            up: true,
            inc: 1,
            restart_at: 0,
            paused_until: 0,
            durable: log,
            unsynced: Vec::new(),
            highest_seen,
            frozen: false,
            lease: None,
            ttl: TTL_MS,
            last_ka_sent: 0,
            next_ka: 0,
            grant: None,
            wait: None,
            upstream: None,
            lead: None,
            next_watch: first_watch,
            held: Vec::new(),
        }
    }

    /// The whole log as the process sees it: durable, then unsynced.
    pub fn log(&self) -> impl Iterator<Item = &Rec> {
        self.durable.iter().chain(self.unsynced.iter())
    }

    pub fn runs(&self, now: u64) -> bool {
        self.up && self.paused_until <= now
    }
}

impl World {
    pub(super) fn send(&mut self, msg: Msg) {
        self.stats.messages += 1;
        let faults = self.now < RUN_MS;
        self.net.send(&mut self.rng, self.now, msg, faults);
    }

    /// Starts the node's one etcd call for `purpose`.
    pub(super) fn call(&mut self, i: usize, op: Op, purpose: Purpose) {
        let rid = self.rid();
        self.nodes[i].wait = Some(Wait {
            rid,
            deadline: self.now + ETCD_TIMEOUT_MS,
            purpose,
        });
        self.send_etcd(i, rid, op);
    }

    fn send_etcd(&mut self, i: usize, rid: u64, op: Op) {
        let msg = Msg::ToEtcd {
            from: i,
            inc: self.nodes[i].inc,
            rid,
            sent_at: self.now,
            op,
        };
        self.send(msg);
    }

    /// One message arrives (its receiver is up and running).
    pub(super) fn deliver(&mut self, msg: Msg) {
        match msg {
            Msg::ToEtcd {
                from,
                inc,
                rid,
                sent_at,
                op,
            } => {
                let reply = self.etcd.apply(self.now, op);
                let to = from;
                self.send(Msg::FromEtcd {
                    to,
                    inc,
                    rid,
                    sent_at,
                    reply,
                });
            }
            Msg::FromEtcd {
                to,
                inc,
                rid,
                sent_at,
                reply,
            } => {
                if self.nodes[to].inc == inc {
                    self.on_etcd(to, rid, sent_at, reply);
                }
            }
            Msg::Backup {
                from,
                to,
                epoch,
                stream,
                log,
            } => self.on_backup(to, from, epoch, stream, log),
            Msg::Ship {
                from,
                to,
                epoch,
                stream,
                at,
                recs,
            } => self.on_ship(to, from, epoch, stream, at, recs),
            Msg::Confirm {
                from,
                to,
                stream,
                len,
            } => self.on_confirm(to, from, stream, len),
            Msg::NeedBackup { from, to, stream } => self.on_need_backup(to, from, stream),
            Msg::Decide { to, attempt } => self.on_decide(to, attempt),
        }
    }

    fn verdict(&mut self, i: usize, from: usize, epoch: u64) -> bool {
        let node = &self.nodes[i];
        match rules::replica_verdict(node.highest_seen, node.frozen, epoch) {
            ReplicaVerdict::Accept => {
                let node = &mut self.nodes[i];
                node.highest_seen = node.highest_seen.max(epoch);
                true
            }
            ReplicaVerdict::Frozen => {
                self.stats.refused_frozen += 1;
                self.note(|| format!("n{i} frozen: refuses n{from}'s epoch {epoch}"));
                false
            }
            ReplicaVerdict::StaleEpoch { highest } => {
                self.stats.refused_stale += 1;
                self.note(|| format!("n{i} refuses n{from}'s epoch {epoch} < {highest}"));
                false
            }
        }
    }

    fn on_backup(&mut self, i: usize, from: usize, epoch: u64, stream: u64, log: Vec<Rec>) {
        if !self.verdict(i, from, epoch) {
            return;
        }
        self.stats.backups += 1;
        self.changes += 1;
        let node = &mut self.nodes[i];
        // Written to a new directory, fsynced and renamed over the old log: durable at once.
        node.durable = log;
        node.unsynced.clear();
        node.upstream = Some((from, stream));
        let len = node.durable.len();
        self.note(|| format!("n{i} takes n{from}'s base backup ({len} records, epoch {epoch})"));
        self.send(Msg::Confirm {
            from: i,
            to: from,
            stream,
            len,
        });
    }

    fn on_ship(
        &mut self,
        i: usize,
        from: usize,
        epoch: u64,
        stream: u64,
        at: usize,
        recs: Vec<Rec>,
    ) {
        if !self.verdict(i, from, epoch) {
            return;
        }
        if self.nodes[i].upstream != Some((from, stream)) {
            self.send(Msg::NeedBackup {
                from: i,
                to: from,
                stream,
            });
            return;
        }
        self.changes += 1;
        let node = &mut self.nodes[i];
        // The stream writes at the leader's offsets (like WAL streaming by position); the
        // copy is fsynced before the confirmation.
        let mut log: Vec<Rec> = node.log().copied().collect();
        if at <= log.len() {
            for (k, rec) in recs.into_iter().enumerate() {
                let idx = at + k;
                if idx < log.len() {
                    if log[idx] != rec {
                        log.truncate(idx);
                        log.push(rec);
                    }
                } else {
                    log.push(rec);
                }
            }
        }
        node.durable = log;
        node.unsynced.clear();
        let len = node.durable.len();
        self.send(Msg::Confirm {
            from: i,
            to: from,
            stream,
            len,
        });
    }

    fn on_etcd(&mut self, i: usize, rid: u64, sent_at: u64, reply: Reply) {
        match reply {
            Reply::Granted { lease, ttl } => {
                if self.nodes[i].grant.is_some_and(|(r, _)| r == rid) {
                    let node = &mut self.nodes[i];
                    node.grant = None;
                    node.lease = Some(lease);
                    node.ttl = ttl;
                    node.last_ka_sent = sent_at;
                    node.next_ka = self.now + KEEPALIVE_MS;
                }
            }
            Reply::KeptAlive { lease, alive } => {
                if self.nodes[i].lease != Some(lease) {
                    return;
                }
                if alive {
                    let node = &mut self.nodes[i];
                    node.last_ka_sent = node.last_ka_sent.max(sent_at);
                } else if self.nodes[i].lead.is_some() || self.campaigning(i) {
                    // The leader key (or the one a campaign in flight may create) went with
                    // it; a leader never takes a new lease for an old key.
                    self.exit(i, "etcd says its lease is gone");
                } else {
                    self.nodes[i].lease = None;
                }
            }
            Reply::Got { leader, state } => {
                let Some(wait) = self.take_wait(i, rid) else {
                    return;
                };
                match wait.purpose {
                    Purpose::Watch => self.on_watch(i, leader, state),
                    Purpose::RemoveRead(missing) => self.on_remove_read(i, missing, state),
                    _ => {}
                }
            }
            Reply::Txn { ok, revision } => {
                let Some(wait) = self.take_wait(i, rid) else {
                    return;
                };
                match wait.purpose {
                    Purpose::Campaign(next, lease) => {
                        self.on_campaign(i, ok, revision, next, lease)
                    }
                    Purpose::Remove(missing) => self.on_removed(i, ok, revision, missing),
                    Purpose::Add(member) => self.on_added(i, ok, revision, member),
                    _ => {}
                }
            }
        }
    }

    fn take_wait(&mut self, i: usize, rid: u64) -> Option<Wait> {
        if self.nodes[i].wait.as_ref().is_some_and(|w| w.rid == rid) {
            self.nodes[i].wait.take()
        } else {
            None
        }
    }

    /// The leader key and the state, read: campaign if the key is free and the rules allow.
    fn on_watch(&mut self, i: usize, leader: Option<Entry>, state: Option<Entry>) {
        if leader.is_some() || self.nodes[i].lead.is_some() {
            return;
        }
        let Some(lease) = self.nodes[i].lease else {
            return;
        };
        let (group, state_rev) = match &state {
            Some(Entry {
                value: Value::State(s),
                mod_rev,
                ..
            }) => (Some(s), *mod_rev),
            _ => (None, 0),
        };
        let me = name(i);
        if self.broken != HaBroken::AnyCampaign && !rules::may_campaign(&me, group) {
            return;
        }
        let next = rules::next_term(&me, group);
        // Freeze first: from here on no replication moves this copy (`replica_verdict`).
        let frozen = self.broken != HaBroken::NoFreeze;
        self.nodes[i].frozen = frozen;
        self.stats.campaigns += 1;
        self.note(|| format!("n{i} campaigns for term {} (frozen: {frozen})", next.term));
        let claim = LeaderClaim {
            node: me,
            url: format!("http://n{i}"),
            term: next.term,
        };
        let op = Op::Txn {
            cmps: vec![
                Cmp::CreateRev(Key::Leader, 0),
                Cmp::ModRev(Key::State, state_rev),
            ],
            puts: vec![
                Put {
                    key: Key::Leader,
                    value: Value::Leader(claim),
                    lease: Some(lease),
                },
                Put {
                    key: Key::State,
                    value: Value::State(next.clone()),
                    lease: None,
                },
            ],
        };
        self.call(i, op, Purpose::Campaign(next, lease));
    }

    fn campaigning(&self, i: usize) -> bool {
        self.nodes[i]
            .wait
            .as_ref()
            .is_some_and(|w| matches!(w.purpose, Purpose::Campaign(..)))
    }

    fn on_campaign(&mut self, i: usize, ok: bool, revision: u64, next: GroupState, lease: LeaseId) {
        if ok && self.nodes[i].lease != Some(lease) {
            self.exit(i, "won with a lease it no longer holds");
            return;
        }
        if !ok {
            self.nodes[i].frozen = false;
            self.note(|| format!("n{i} lost the campaign for term {}", next.term));
            return;
        }
        self.start_term(i, next.term, revision, lease);
    }

    /// A follower's (or a leader's) tick: keep-alives, the grant, etcd time-outs, the watch.
    pub(super) fn node_tick(&mut self, i: usize) {
        let now = self.now;
        let node = &self.nodes[i];
        if let Some(lease) = node.lease
            && now >= node.next_ka
        {
            self.nodes[i].next_ka = now + KEEPALIVE_MS;
            let rid = self.rid();
            self.send_etcd(i, rid, Op::KeepAlive { lease });
        }
        let node = &self.nodes[i];
        if node.lease.is_none() && node.grant.is_none_or(|(_, until)| now >= until) {
            let rid = self.rid();
            self.nodes[i].grant = Some((rid, now + ETCD_TIMEOUT_MS));
            self.send_etcd(i, rid, Op::Grant { ttl: TTL_MS });
        }
        if let Some(wait) = &self.nodes[i].wait
            && now >= wait.deadline
        {
            match wait.purpose {
                Purpose::Watch => self.nodes[i].wait = None,
                // The outcome is unknown: it may have won or removed. The process exits, its
                // lease lapses, and it comes back as a follower.
                _ => {
                    self.exit(i, "an etcd call timed out");
                    return;
                }
            }
        }
        if self.nodes[i].lead.is_some() {
            self.leader_tick(i);
            return;
        }
        let node = &self.nodes[i];
        if now >= node.next_watch && node.wait.is_none() && node.lease.is_some() {
            self.nodes[i].next_watch = now + WATCH_MS + self.rng.u64(0..WATCH_MS);
            self.call(i, Op::Get, Purpose::Watch);
        }
    }

    /// SIGKILL: the unsynced records and every volatile thing are gone.
    pub(super) fn crash(&mut self, i: usize) {
        if !self.nodes[i].up {
            return;
        }
        self.stats.crashes += 1;
        self.note(|| format!("n{i} crashes (SIGKILL)"));
        self.down(i);
    }

    /// The process exits on purpose (poisoned, deposed): same as a crash for its state.
    pub(super) fn exit(&mut self, i: usize, why: &str) {
        self.stats.exits += 1;
        self.note(|| format!("n{i} exits: {why}"));
        self.down(i);
    }

    fn down(&mut self, i: usize) {
        self.changes += 1;
        let restart_at = self.now + self.rng.u64(20..200);
        let node = &mut self.nodes[i];
        node.up = false;
        node.restart_at = restart_at;
        node.paused_until = 0;
        node.unsynced.clear();
        node.held.clear();
        node.lead = None;
    }

    pub(super) fn restart(&mut self, i: usize) {
        self.changes += 1;
        let now = self.now;
        let watch = now + self.rng.u64(0..WATCH_MS);
        let node = &mut self.nodes[i];
        let log = std::mem::take(&mut node.durable);
        let inc = node.inc + 1;
        *node = Node::new(log, watch);
        node.inc = inc;
        self.note(|| format!("n{i} restarts"));
    }
}
