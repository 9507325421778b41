//! What the participant remembers about decided transactions, so duplicates and late messages
//! get the same answer: committed, aborted (including aborts that overtook their prepare), and
//! refused (voted no).
//!
//! Retention is bounded two ways, oldest first: an entry older than `retention_ms` goes, and so
//! does the oldest entry once there are more than `count_max`. After an entry goes, a duplicate
//! commit is answered 409 `not_prepared` (never applied twice), and a very late prepare is
//! evaluated afresh (and, if it votes yes, resolved by asking the coordinator).

use std::collections::{HashMap, VecDeque};

use protocol::TxId;
use serde::{Deserialize, Serialize};

/// How a transaction ended here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Ended {
    Committed,
    Aborted,
    /// Voted no with this reason.
    Refused {
        reason: String,
    },
}

/// One remembered transaction, in the order it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub txid: TxId,
    #[serde(flatten)]
    pub ended: Ended,
    pub at_ms: u64,
}

/// The decided set with its retention.
#[derive(Debug)]
pub struct Tombstones {
    by_txid: HashMap<TxId, (Ended, u64)>,
    order: VecDeque<(u64, TxId)>,
    retention_ms: u64,
    count_max: usize,
}

impl Tombstones {
    pub fn new(retention_ms: u64, count_max: usize) -> Self {
        Self {
            by_txid: HashMap::new(),
            order: VecDeque::new(),
            retention_ms,
            count_max,
        }
    }

    pub fn get(&self, txid: &TxId) -> Option<&Ended> {
        self.by_txid.get(txid).map(|(ended, _)| ended)
    }

    pub fn insert(&mut self, txid: TxId, ended: Ended, at_ms: u64) {
        self.order.push_back((at_ms, txid.clone()));
        self.by_txid.insert(txid, (ended, at_ms));
    }

    /// Drops what retention no longer covers at `now_ms`.
    pub fn prune(&mut self, now_ms: u64) {
        while let Some((at_ms, txid)) = self.order.front() {
            let expired = now_ms.saturating_sub(*at_ms) > self.retention_ms;
            if !expired && self.by_txid.len() <= self.count_max {
                break;
            }
            // Only the queue entry that matches the map's timestamp removes the map entry.
            if self.by_txid.get(txid).map(|(_, at)| at) == Some(at_ms) {
                self.by_txid.remove(txid);
            }
            self.order.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.by_txid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_txid.is_empty()
    }

    /// Every live entry, oldest first (for checkpoints).
    pub fn to_vec(&self) -> Vec<Tombstone> {
        self.order
            .iter()
            .filter_map(|(at_ms, txid)| match self.by_txid.get(txid) {
                Some((ended, at)) if at == at_ms => Some(Tombstone {
                    txid: txid.clone(),
                    ended: ended.clone(),
                    at_ms: *at_ms,
                }),
                Some(_) | None => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(s: &str) -> TxId {
        TxId::new(s).unwrap()
    }

    #[test]
    fn prunes_by_age_and_by_count() {
        let mut t = Tombstones::new(100, 2);
        t.insert(tx("a"), Ended::Committed, 0);
        t.insert(tx("b"), Ended::Aborted, 50);
        t.insert(tx("c"), Ended::Aborted, 60);
        t.prune(60);
        assert_eq!(t.get(&tx("a")), None, "count bound drops the oldest");
        assert_eq!(t.len(), 2);
        t.prune(155);
        assert_eq!(t.get(&tx("b")), None, "older than retention");
        assert_eq!(t.get(&tx("c")), Some(&Ended::Aborted));
        assert_eq!(t.to_vec().len(), 1);
    }
}
