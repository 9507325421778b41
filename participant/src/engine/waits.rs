//! Lock waits: a prepare whose keys are locked by older attempts queues instead of voting no.
//!
//! Attempts are ordered by `(started_at_ms, gtid)`. The coordinator assigns the start time, so
//! the order is the same at every participant. A prepare waits only for *older* holders and
//! waiters; one that meets a *younger* holder votes no at once (`lock_conflict: ...`). Every
//! wait-for edge therefore points to an older attempt, at every participant, so no cycle (no
//! deadlock) can form, even across participants. The client's retry is a new attempt with a
//! later start time: it then waits rather than dies, so nobody starves. The wait list is kept in
//! that order and grants follow it: a waiter is granted when none of its keys is held and no
//! earlier waiter still waiting wants any of them (FIFO per key, in age order).
//!
//! Waiters are never logged. After a restart there are none: the coordinator's prepare request
//! failed or timed out with the old process, and it counts that as a no.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use protocol::digest::Digest;
use protocol::{GlobalTxId, TxId, Vote};

use super::Engine;
use super::sender::Sender;
use super::types::{Command, Reply};
use super::vote::Holding;
use crate::resource::Resource;

/// An attempt's place in the lock order: the older (smaller) first, the gtid breaking ties.
pub(crate) type Order = (u64, GlobalTxId);

/// A prepare queued for locks: everything needed to prepare it once granted.
#[derive(Debug)]
pub(crate) struct Waiter<S> {
    pub txid: TxId,
    pub sender: Sender,
    pub position: u64,
    pub payload: serde_json::Value,
    pub digest: Digest,
    pub staged: S,
    pub keys: Vec<String>,
    pub participants: Option<Vec<protocol::ParticipantName>>,
    /// The requests to answer: the first prepare and any duplicate that came while it waited.
    pub requests: Vec<u64>,
    pub arrived_at_ms: u64,
    pub deadline_ms: u64,
    /// Its prepare raised the coordinator's epoch: the no vote is forced, as an immediate one
    /// would be, so the raised epoch is durable before anyone hears an answer given under it.
    pub raised: bool,
}

/// The queue: waiters in lock order, with the indexes that keep each step cheap.
#[derive(Debug)]
pub(crate) struct Waits<S> {
    pub by_order: BTreeMap<Order, Waiter<S>>,
    pub order_of: HashMap<GlobalTxId, u64>,
    /// Per key, the waiters that want it (to tell a newcomer whether an older one is ahead).
    pub wanted: HashMap<String, BTreeSet<Order>>,
    pub deadlines: BTreeSet<(u64, Order)>,
    /// Something that could unblock a waiter happened since the last scan.
    pub changed: bool,
}

impl<S> Default for Waits<S> {
    fn default() -> Self {
        Self {
            by_order: BTreeMap::new(),
            order_of: HashMap::new(),
            wanted: HashMap::new(),
            deadlines: BTreeSet::new(),
            changed: false,
        }
    }
}

impl<S> Waits<S> {
    pub fn len(&self) -> usize {
        self.by_order.len()
    }

    pub fn get_mut(&mut self, gtid: &GlobalTxId) -> Option<&mut Waiter<S>> {
        let started = *self.order_of.get(gtid)?;
        self.by_order.get_mut(&(started, gtid.clone()))
    }

    pub fn contains(&self, gtid: &GlobalTxId) -> bool {
        self.order_of.contains_key(gtid)
    }

    pub fn insert(&mut self, order: Order, waiter: Waiter<S>) {
        for key in &waiter.keys {
            self.wanted
                .entry(key.clone())
                .or_default()
                .insert(order.clone());
        }
        self.deadlines.insert((waiter.deadline_ms, order.clone()));
        self.order_of.insert(order.1.clone(), order.0);
        self.by_order.insert(order, waiter);
    }

    pub fn remove(&mut self, gtid: &GlobalTxId) -> Option<(Order, Waiter<S>)> {
        let started = self.order_of.remove(gtid)?;
        let order = (started, gtid.clone());
        let waiter = self.by_order.remove(&order)?;
        for key in &waiter.keys {
            if let Some(set) = self.wanted.get_mut(key) {
                set.remove(&order);
                if set.is_empty() {
                    self.wanted.remove(key);
                }
            }
        }
        self.deadlines.remove(&(waiter.deadline_ms, order.clone()));
        // Whoever queued behind it on its keys may go now.
        self.changed = true;
        Some((order, waiter))
    }

    /// The oldest waiter older than `order` that wants one of `keys`, with that key.
    pub fn older_wanting<'a>(
        &'a self,
        order: &Order,
        keys: &'a [String],
    ) -> Option<(&'a str, &'a GlobalTxId)> {
        keys.iter()
            .filter_map(|key| {
                let first = self.wanted.get(key)?.first()?;
                (first < order).then_some((first, key.as_str()))
            })
            .min()
            .map(|(first, key)| (key, &first.1))
    }
}

/// Why a fresh prepare cannot take its locks now.
pub(crate) enum Blocked<'a> {
    /// A younger attempt holds `key`: waiting for it could close a cycle, so vote no.
    Younger {
        key: &'a str,
        holder: &'a GlobalTxId,
    },
    /// Only older attempts stand in the way (the first named): queue behind them.
    Older { key: &'a str, ahead: &'a GlobalTxId },
}

impl<R: Resource> Engine<R> {
    /// Whether an attempt at `order` may take `keys` now, and if not, whom it would wait for.
    pub(super) fn blocked<'a>(&'a self, order: &Order, keys: &'a [String]) -> Option<Blocked<'a>> {
        let mut older = None;
        for key in keys {
            let Some(holder) = self.locks.holder(key) else {
                continue;
            };
            if *holder == order.1 {
                continue;
            }
            let holder_order = self.prepared.get(holder).map_or(0, |p| p.started_at_ms);
            if (holder_order, holder) > (order.0, &order.1) {
                return Some(Blocked::Younger {
                    key: key.as_str(),
                    holder,
                });
            }
            older.get_or_insert(Blocked::Older {
                key: key.as_str(),
                ahead: holder,
            });
        }
        older.or_else(|| {
            self.waits
                .older_wanting(order, keys)
                .map(|(key, ahead)| Blocked::Older { key, ahead })
        })
    }

    /// After every step: waiters past their deadline vote no, then, if locks were released or
    /// the queue changed, the waiters that may go now are prepared, oldest first.
    pub(super) fn settle_waits(&mut self, now_ms: u64, commands: &mut Vec<Command>) {
        while let Some((deadline, order)) = self.waits.deadlines.first().cloned() {
            if deadline > now_ms {
                break;
            }
            let Some((_, waiter)) = self.waits.remove(&order.1) else {
                // An index out of step with the queue; drop the stale entry.
                self.waits.deadlines.remove(&(deadline, order));
                continue;
            };
            let why = self.blocker_of(&order, &waiter.keys);
            let reason = format!(
                "lock_timeout: waited {} ms for key {why}",
                now_ms.saturating_sub(waiter.arrived_at_ms)
            );
            self.refuse_waiter(&order.1, waiter, reason, now_ms, commands);
        }
        if !self.waits.changed {
            return;
        }
        self.waits.changed = false;
        self.grant_waiters(now_ms, commands);
    }

    /// What `keys` still wait for, in words: the holder of the first held one, or the older
    /// waiter ahead in the queue.
    fn blocker_of(&self, order: &Order, keys: &[String]) -> String {
        for key in keys {
            if let Some(holder) = self.locks.holder(key) {
                return format!("{key:?} held by prepared attempt {holder}");
            }
        }
        match self.waits.older_wanting(order, keys) {
            Some((key, ahead)) => format!("{key:?} queued behind attempt {ahead}"),
            None => "(none held any more)".to_string(),
        }
    }

    /// Scans the queue in lock order; grants each waiter none of whose keys is held or wanted
    /// by an earlier waiter that is still waiting.
    fn grant_waiters(&mut self, now_ms: u64, commands: &mut Vec<Command>) {
        let mut blocked: HashSet<String> = HashSet::new();
        let orders: Vec<Order> = self.waits.by_order.keys().cloned().collect();
        for order in orders {
            let Some(waiter) = self.waits.by_order.get(&order) else {
                continue;
            };
            let free = waiter
                .keys
                .iter()
                .all(|key| !blocked.contains(key) && self.locks.holder(key).is_none());
            if !free {
                blocked.extend(waiter.keys.iter().cloned());
                continue;
            }
            let Some((order, waiter)) = self.waits.remove(&order.1) else {
                continue;
            };
            self.grant(order, waiter, now_ms, commands);
        }
        // The grants themselves changed nothing that could unblock the rest.
        self.waits.changed = false;
    }

    /// A granted waiter: the business checks run now, against the state as it is after the
    /// attempts it waited for; then it prepares (yes) or is refused (no), as a fresh one would.
    fn grant(
        &mut self,
        order: Order,
        waiter: Waiter<R::Staged>,
        now_ms: u64,
        out: &mut Vec<Command>,
    ) {
        let gtid = order.1;
        let fenced = crate::fence::claims_in(&waiter.payload)
            .map_err(|e| e.0)
            .and_then(|claims| {
                self.fences
                    .check_all(&claims, &self.config.fence)
                    .map_err(|refusal| refusal.to_string())
            });
        if let Err(reason) = self.resource.check(&waiter.staged).and(fenced) {
            self.refuse_waiter(&gtid, waiter, reason, now_ms, out);
            return;
        }
        let Waiter {
            txid,
            sender,
            position,
            payload,
            digest,
            staged,
            keys,
            participants,
            requests,
            ..
        } = waiter;
        // The yes is a promise: the Deliver follows the forced record in this list.
        let record = self.hold(
            Holding {
                gtid,
                txid,
                sender,
                position,
                payload,
                digest,
                staged,
                keys,
                started_at_ms: order.0,
                participants,
            },
            now_ms,
        );
        out.push(Command::Log {
            record,
            forced: true,
        });
        deliver_all(out, requests, &Reply::Vote(Vote::Yes));
    }

    /// A waiter that will not prepare: a tombstone and a `Refused` record as for any no vote
    /// (a duplicate prepare later gets the same no), then the no to every request it has.
    pub(super) fn refuse_waiter(
        &mut self,
        gtid: &GlobalTxId,
        waiter: Waiter<R::Staged>,
        reason: String,
        now_ms: u64,
        out: &mut Vec<Command>,
    ) {
        let (log, reason) = self.refuse(
            gtid,
            &waiter.sender,
            waiter.digest,
            reason,
            waiter.raised,
            now_ms,
        );
        out.push(log);
        deliver_all(out, waiter.requests, &Reply::Vote(Vote::No { reason }));
    }
}

pub(super) fn deliver_all(out: &mut Vec<Command>, requests: Vec<u64>, reply: &Reply) {
    for waiter in requests {
        out.push(Command::Deliver {
            waiter,
            reply: reply.clone(),
        });
    }
}
