//! Ended transactions' outcomes, kept for idempotent retries and decision queries: for the
//! retention window, and at most `max` of them (the oldest go first), so memory and snapshot
//! size stay bounded whatever the throughput.

use std::collections::{HashMap, VecDeque};

use protocol::TxId;

use crate::records::Retained;

/// One kept outcome: the outcome, the insertion number that `order` refers to, and its JSON
/// encoding, made once when it ends so that checkpoints copy bytes instead of re-encoding
/// every retained outcome under the engine lock.
#[derive(Debug, Clone)]
struct Entry {
    retained: Retained,
    number: u64,
    json: Vec<u8>,
}

#[derive(Debug, Clone, Default)]
pub struct RetainedSet {
    map: HashMap<TxId, Entry>,
    /// Insertion order (= end order), so the oldest go first in O(1).
    order: VecDeque<(TxId, u64)>,
    /// Sum of the encodings' lengths, to size the snapshot buffer once.
    json_bytes: usize,
    next: u64,
    max: usize,
}

impl RetainedSet {
    pub fn new(max: usize) -> RetainedSet {
        RetainedSet {
            max,
            ..RetainedSet::default()
        }
    }

    pub fn get(&self, txid: &TxId) -> Option<&Retained> {
        self.map.get(txid).map(|e| &e.retained)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets one outcome (its place in `order` is skipped later).
    pub fn remove(&mut self, txid: &TxId) {
        if let Some(entry) = self.map.remove(txid) {
            self.json_bytes -= entry.json.len();
        }
    }

    /// Adds an outcome (the newest), dropping the oldest beyond `max`.
    pub fn insert(&mut self, retained: Retained) {
        let txid = retained.decision.txid.clone();
        let number = self.next;
        self.next += 1;
        let json = serde_json::to_vec(&retained).unwrap_or_default();
        self.json_bytes += json.len();
        if let Some(old) = self.map.insert(
            txid.clone(),
            Entry {
                retained,
                number,
                json,
            },
        ) {
            self.json_bytes -= old.json.len();
        }
        self.order.push_back((txid, number));
        while self.map.len() > self.max {
            if !self.pop_oldest() {
                break;
            }
        }
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

    /// The JSON array of every outcome, oldest first, from the encodings made at insert time.
    pub fn write_json_array(&self, out: &mut Vec<u8>) {
        out.reserve(self.json_bytes + self.map.len() + 2);
        out.push(b'[');
        for (i, entry) in self.entries().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&entry.json);
        }
        out.push(b']');
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
            },
            ended_at_ms: at,
        }
    }

    fn ids(set: &RetainedSet) -> Vec<String> {
        set.iter().map(|r| r.decision.txid.to_string()).collect()
    }

    #[test]
    fn keeps_at_most_max_dropping_the_oldest() {
        let mut set = RetainedSet::new(2);
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            set.insert(ended(id, i as u64));
        }
        assert_eq!(ids(&set), ["b", "c"]);
        assert!(set.get(&TxId::new("a").unwrap()).is_none());
    }

    #[test]
    fn expires_by_end_time_and_survives_id_reuse() {
        let mut set = RetainedSet::new(10);
        set.insert(ended("a", 10));
        set.insert(ended("b", 20));
        // "a" ends again later (a new transaction with the same id after it was forgotten).
        set.insert(ended("a", 30));
        set.expire(31, 10);
        assert_eq!(ids(&set), ["a"]);
        assert_eq!(set.get(&TxId::new("a").unwrap()).unwrap().ended_at_ms, 30);
        set.expire(40, 10);
        assert_eq!(set.len(), 0);
    }
}
