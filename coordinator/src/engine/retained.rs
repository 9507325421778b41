//! Staging: ended transactions' outcomes that are not yet durable in the outcome index. They
//! answer idempotent retries and decision queries until the index does, and they are what the
//! checkpoint snapshot keeps of ended transactions (an outcome leaves staging only once the
//! index holds it, so a checkpoint never drops the only copy). Its size is the archiver's lag;
//! the engine refuses new attempts beyond `retained_max` rather than dropping any.

use std::collections::{HashMap, VecDeque};

use protocol::{GlobalTxId, TxId};

use crate::records::Retained;

/// One staged outcome and the insertion number that `order` refers to. (Staging holds only
/// the archiver's lag, so a checkpoint copies it and encodes it off the engine lock.)
#[derive(Debug, Clone)]
struct Entry {
    retained: Retained,
    number: u64,
}

#[derive(Debug, Clone, Default)]
pub struct RetainedSet {
    map: HashMap<TxId, Entry>,
    /// Which id each staged attempt ended under: a question that pairs an attempt with
    /// another id is told the attempt has a record, never presumed abort.
    owners: HashMap<GlobalTxId, TxId>,
    /// Insertion order (= end order), so the oldest go first in O(1).
    order: VecDeque<(TxId, u64)>,
    next: u64,
}

impl RetainedSet {
    pub fn new() -> RetainedSet {
        RetainedSet::default()
    }

    pub fn get(&self, txid: &TxId) -> Option<&Retained> {
        self.map.get(txid).map(|e| &e.retained)
    }

    /// The staged outcome of attempt `gtid`, whatever id it ended under.
    pub fn of_attempt(&self, gtid: &GlobalTxId) -> Option<&Retained> {
        self.owners.get(gtid).and_then(|txid| self.get(txid))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets one outcome (its place in `order` is skipped later).
    pub fn remove(&mut self, txid: &TxId) {
        if let Some(entry) = self.map.remove(txid) {
            self.owners.remove(&entry.retained.decision.attempt.gtid);
        }
    }

    /// Forgets `txid`'s outcome if it is the one of attempt `gtid` (the index holds it now); a
    /// newer outcome of the same id stays.
    pub fn remove_archived(&mut self, txid: &TxId, gtid: &protocol::GlobalTxId) {
        if self
            .map
            .get(txid)
            .is_some_and(|e| &e.retained.decision.attempt.gtid == gtid)
        {
            self.remove(txid);
        }
        // Keep `order` from growing with stale entries: drop those at its front.
        while let Some((front, number)) = self.order.front() {
            if self.map.get(front).is_some_and(|e| e.number == *number) {
                break;
            }
            self.order.pop_front();
        }
    }

    /// Adds an outcome (the newest); it stays until archived or expired.
    pub fn insert(&mut self, retained: Retained) {
        let txid = retained.decision.txid.clone();
        let number = self.next;
        self.next += 1;
        self.remove(&txid);
        self.owners
            .insert(retained.decision.attempt.gtid.clone(), txid.clone());
        self.map.insert(txid.clone(), Entry { retained, number });
        self.order.push_back((txid, number));
    }

    fn pop_oldest(&mut self) -> bool {
        let Some((txid, number)) = self.order.pop_front() else {
            return false;
        };
        // An id may have been dropped and used again since; only drop the entry it names.
        if self.map.get(&txid).is_some_and(|e| e.number == number) {
            self.remove(&txid);
        }
        true
    }

    /// Drops outcomes that ended `retention_ms` or longer before `now_ms`.
    pub fn expire(&mut self, now_ms: u64, retention_ms: u64) {
        while let Some((txid, number)) = self.order.front() {
            match self.map.get(txid) {
                Some(e) if e.number == *number => {
                    if e.retained.ended_at_ms.saturating_add(retention_ms) > now_ms {
                        break;
                    }
                }
                // A stale order entry: drop it and look further.
                Some(_) | None => {}
            }
            self.pop_oldest();
        }
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.order
            .iter()
            .filter_map(|(txid, number)| self.map.get(txid).filter(|e| e.number == *number))
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Retained> {
        self.entries().map(|e| &e.retained)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;
    use crate::records::{Attempt, DecisionRecord};
    use protocol::Decision;

    fn ended(id: &str, at: u64) -> Retained {
        Retained {
            decision: DecisionRecord {
                txid: TxId::new(id).unwrap(),
                attempt: Attempt::new(
                    &protocol::CoordinatorId::new("c").unwrap(),
                    protocol::Incarnation(1),
                    at,
                ),
                digest: Digest(1),
                decision: Decision::Commit,
                reason: None,
                votes: vec![],
                created_at_ms: 0,
                decided_at_ms: 0,
                client: None,
            },
            ended_at_ms: at,
        }
    }

    fn ids(set: &RetainedSet) -> Vec<String> {
        set.iter().map(|r| r.decision.txid.to_string()).collect()
    }

    #[test]
    fn archived_entries_leave_but_a_newer_outcome_of_the_id_stays() {
        let mut set = RetainedSet::new();
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            set.insert(ended(id, i as u64));
        }
        let gtid_of = |set: &RetainedSet, id: &str| {
            set.get(&TxId::new(id).unwrap())
                .unwrap()
                .decision
                .attempt
                .gtid
                .clone()
        };
        let old_b = gtid_of(&set, "b");
        // "b" ends again (another attempt) before the first archive of "b" is durable.
        set.insert(ended("b", 10));
        set.remove_archived(&TxId::new("b").unwrap(), &old_b);
        assert_eq!(set.get(&TxId::new("b").unwrap()).unwrap().ended_at_ms, 10);
        let a = gtid_of(&set, "a");
        set.remove_archived(&TxId::new("a").unwrap(), &a);
        assert_eq!(ids(&set), ["c", "b"]);
        assert_eq!(set.order.len(), 2, "stale front entries are dropped");
        assert!(
            set.of_attempt(&old_b).is_none(),
            "replaced: its attempt left"
        );
        assert!(set.of_attempt(&a).is_none(), "archived: its attempt left");
        let c = gtid_of(&set, "c");
        assert_eq!(
            set.of_attempt(&c).map(|r| r.decision.txid.as_str()),
            Some("c")
        );
        assert_eq!(set.owners.len(), set.len(), "one owner per staged outcome");
    }

    #[test]
    fn expires_by_end_time_and_survives_id_reuse() {
        let mut set = RetainedSet::new();
        set.insert(ended("a", 10));
        set.insert(ended("b", 20));
        // "a" ends again later (a new transaction with the same id after it was forgotten).
        set.insert(ended("a", 30));
        set.expire(31, 10);
        assert_eq!(ids(&set), ["a"]);
        assert_eq!(set.get(&TxId::new("a").unwrap()).unwrap().ended_at_ms, 30);
        set.expire(40, 10);
        assert_eq!(set.len(), 0);
        assert!(set.owners.is_empty());
    }
}
