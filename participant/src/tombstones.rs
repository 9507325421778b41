//! What the participant remembers about decided attempts, so duplicates and late messages get
//! the same answer: committed, aborted (including aborts that overtook their prepare), and
//! refused (voted no). Keyed by the attempt's global id, never by the client's id: a client id
//! reused later is another attempt with another global id, so it can never be answered from
//! this attempt's tombstone. Each one keeps the digest of the payload it was prepared with (when
//! it was prepared here), so a prepare for the same attempt with another payload votes no.
//!
//! Retention is bounded two ways, oldest first: an entry older than `retention_ms` goes, and so
//! does the oldest entry once there are more than `count_max`. After an entry goes, a duplicate
//! commit or abort is acked without applying anything (only the decision that ended it here can
//! be resent), and a very late duplicate prepare votes no: for every coordinator run this remembers the highest attempt position it
//! has forgotten (`forgotten`), and an attempt at or below it may have ended here already.
//! Evaluating it afresh could vote yes and then, asking the coordinator, commit a second time
//! an attempt that was already applied.

use std::collections::{HashMap, VecDeque};

use protocol::GlobalTxId;
use protocol::digest::Digest;
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
    pub gtid: GlobalTxId,
    #[serde(flatten)]
    pub ended: Ended,
    /// The payload it was prepared with; `None` for an abort that came before any prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    pub at_ms: u64,
}

/// What a tombstone says about one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    pub ended: Ended,
    pub digest: Option<Digest>,
}

/// The decided set with its retention.
#[derive(Debug)]
pub struct Tombstones {
    by_gtid: HashMap<GlobalTxId, (Remembered, u64)>,
    /// Per coordinator run (`coordinator_id:incarnation`, the gtid's prefix), the highest
    /// position whose tombstone was dropped.
    forgotten: HashMap<String, u64>,
    order: VecDeque<(u64, GlobalTxId)>,
    retention_ms: u64,
    count_max: usize,
}

impl Tombstones {
    pub fn new(retention_ms: u64, count_max: usize) -> Self {
        Self {
            by_gtid: HashMap::new(),
            forgotten: HashMap::new(),
            order: VecDeque::new(),
            retention_ms,
            count_max,
        }
    }

    pub fn get(&self, gtid: &GlobalTxId) -> Option<&Remembered> {
        self.by_gtid.get(gtid).map(|(remembered, _)| remembered)
    }

    pub fn insert(&mut self, gtid: GlobalTxId, ended: Ended, digest: Option<Digest>, at_ms: u64) {
        self.order.push_back((at_ms, gtid.clone()));
        self.by_gtid
            .insert(gtid, (Remembered { ended, digest }, at_ms));
    }

    /// Forgets `gtid` (a later prepared record for it supersedes the tombstone in replay).
    pub fn remove(&mut self, gtid: &GlobalTxId) {
        // Its queue entry no longer matches and is skipped by `prune` and `to_vec`.
        self.by_gtid.remove(gtid);
    }

    /// Drops what retention no longer covers at `now_ms`.
    pub fn prune(&mut self, now_ms: u64) {
        while let Some((at_ms, gtid)) = self.order.front() {
            let expired = now_ms.saturating_sub(*at_ms) > self.retention_ms;
            if !expired && self.by_gtid.len() <= self.count_max {
                break;
            }
            // Only the queue entry that matches the map's timestamp removes the map entry.
            if self.by_gtid.get(gtid).map(|(_, at)| at) == Some(at_ms) {
                self.by_gtid.remove(gtid);
                let gtid = gtid.clone();
                self.note_forgotten(&gtid);
            }
            self.order.pop_front();
        }
    }

    fn note_forgotten(&mut self, gtid: &GlobalTxId) {
        if let Some((run, position)) = run_and_position(gtid) {
            let highest = self.forgotten.entry(run).or_insert(0);
            *highest = (*highest).max(position);
        }
    }

    /// Whether `gtid` may have ended here and been forgotten since: its run has dropped a
    /// tombstone at its position or later. Such a prepare must vote no.
    pub fn may_have_forgotten(&self, gtid: &GlobalTxId) -> bool {
        // The common case until the first tombstone is dropped: nothing to parse.
        if self.forgotten.is_empty() {
            return false;
        }
        run_and_position(gtid).is_some_and(|(run, position)| {
            self.forgotten
                .get(&run)
                .is_some_and(|highest| position <= *highest)
        })
    }

    /// The forgotten marks, for checkpoints.
    pub fn forgotten(&self) -> Vec<(String, u64)> {
        let mut marks: Vec<_> = self
            .forgotten
            .iter()
            .map(|(run, position)| (run.clone(), *position))
            .collect();
        marks.sort();
        marks
    }

    /// Restores a forgotten mark from a checkpoint.
    pub fn restore_forgotten(&mut self, run: String, position: u64) {
        let highest = self.forgotten.entry(run).or_insert(0);
        *highest = (*highest).max(position);
    }

    pub fn len(&self) -> usize {
        self.by_gtid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_gtid.is_empty()
    }

    /// Every live entry, oldest first (for checkpoints).
    pub fn to_vec(&self) -> Vec<Tombstone> {
        self.order
            .iter()
            .filter_map(|(at_ms, gtid)| match self.by_gtid.get(gtid) {
                Some((remembered, at)) if at == at_ms => Some(Tombstone {
                    gtid: gtid.clone(),
                    ended: remembered.ended.clone(),
                    digest: remembered.digest,
                    at_ms: *at_ms,
                }),
                Some(_) | None => None,
            })
            .collect()
    }
}

/// `coordinator_id:incarnation` and the position of an attempt id made by `GlobalTxId::compose`.
fn run_and_position(gtid: &GlobalTxId) -> Option<(String, u64)> {
    let (coordinator, incarnation, position) = gtid.parts()?;
    Some((format!("{coordinator}:{incarnation}"), position))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(s: &str) -> GlobalTxId {
        GlobalTxId::new(s).unwrap()
    }

    #[test]
    fn prunes_by_age_and_by_count() {
        let mut t = Tombstones::new(100, 2);
        t.insert(tx("a"), Ended::Committed, Some(Digest(1)), 0);
        t.insert(tx("b"), Ended::Aborted, None, 50);
        t.insert(tx("c"), Ended::Aborted, None, 60);
        t.prune(60);
        assert_eq!(t.get(&tx("a")), None, "count bound drops the oldest");
        assert_eq!(t.len(), 2);
        t.prune(155);
        assert_eq!(t.get(&tx("b")), None, "older than retention");
        assert_eq!(t.get(&tx("c")).map(|r| &r.ended), Some(&Ended::Aborted));
        assert_eq!(t.to_vec().len(), 1);
    }

    #[test]
    fn a_dropped_tombstone_marks_its_run_up_to_its_position_as_forgotten() {
        let c = protocol::CoordinatorId::new("c").unwrap();
        let at = |run, position| GlobalTxId::compose(&c, protocol::Incarnation(run), position);
        let mut t = Tombstones::new(1_000, 1);
        t.insert(at(1, 5), Ended::Committed, Some(Digest(1)), 0);
        t.insert(at(1, 9), Ended::Committed, Some(Digest(2)), 1);
        t.prune(2);
        assert!(t.get(&at(1, 5)).is_none(), "dropped by the count bound");
        assert!(t.may_have_forgotten(&at(1, 5)));
        assert!(
            t.may_have_forgotten(&at(1, 3)),
            "older attempts of that run too"
        );
        assert!(
            !t.may_have_forgotten(&at(1, 6)),
            "newer ones are judged afresh"
        );
        assert!(
            !t.may_have_forgotten(&at(2, 1)),
            "another run is not affected"
        );
        let mut restored = Tombstones::new(1_000, 1);
        for (run, position) in t.forgotten() {
            restored.restore_forgotten(run, position);
        }
        assert!(
            restored.may_have_forgotten(&at(1, 5)),
            "marks survive checkpoints"
        );
    }

    #[test]
    fn a_removed_tombstone_stays_gone_and_its_digest_is_kept_until_then() {
        let mut t = Tombstones::new(1_000, 10);
        t.insert(tx("a"), Ended::Committed, Some(Digest(7)), 0);
        assert_eq!(t.get(&tx("a")).and_then(|r| r.digest), Some(Digest(7)));
        t.remove(&tx("a"));
        assert_eq!(t.get(&tx("a")), None);
        assert!(t.to_vec().is_empty(), "no stale entry in checkpoints");
        t.prune(10);
        assert_eq!(t.len(), 0);
    }
}
