//! The outcome index on a real file: insert, lookup, expiry, the disk budget, paged listing,
//! and reopening.

use protocol::{CoordinatorId, Decision, Incarnation, TxId};

use super::{Cursor, OutcomeStore};
use crate::digest::Digest;
use crate::records::{Attempt, DecisionRecord, Retained};

const DAY: u64 = 86_400_000;

fn ended(id: &str, position: u64, decision: Decision, at: u64) -> Retained {
    Retained {
        decision: DecisionRecord {
            txid: TxId::new(id).unwrap(),
            attempt: Attempt::new(&CoordinatorId::new("c").unwrap(), Incarnation(1), position),
            digest: Digest(position as u128),
            decision,
            reason: None,
            votes: vec![],
            created_at_ms: at,
            decided_at_ms: at,
            client: None,
        },
        ended_at_ms: at,
    }
}

fn open(dir: &tempfile::TempDir, max_bytes: u64) -> OutcomeStore {
    OutcomeStore::open(&dir.path().join("outcomes.redb"), max_bytes).unwrap()
}

fn id(s: &str) -> TxId {
    TxId::new(s).unwrap()
}

#[test]
fn an_archived_outcome_is_found_by_id_until_its_window_passes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, u64::MAX);
    let a = ended("a", 1, Decision::Commit, 1_000);
    let report = store.archive(std::slice::from_ref(&a), 1_000, DAY).unwrap();
    assert_eq!(report.written, 1);
    assert_eq!(store.get(&id("a"), 2_000, DAY).unwrap(), Some(a));
    assert_eq!(store.get(&id("b"), 2_000, DAY).unwrap(), None);
    // Past the window it is absent before any sweep deletes it.
    assert_eq!(store.get(&id("a"), 1_000 + DAY, DAY).unwrap(), None);
    assert_eq!(store.stats(1_000 + DAY, DAY).unwrap().entries, 1);
}

#[test]
fn expiry_deletes_what_the_window_left_and_gives_the_bytes_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, u64::MAX);
    let batch: Vec<Retained> = (0..5)
        .map(|i| ended(&format!("t{i}"), i, Decision::Commit, 100 * i))
        .collect();
    store.archive(&batch, 0, DAY).unwrap();
    let full = store.stats(0, DAY).unwrap().logical_bytes;
    assert!(full > 0);
    // At 250 + DAY, t0..t2 (ended at 0, 100, 200) are out of the window.
    assert_eq!(store.expire(250 + DAY, DAY).unwrap(), 3);
    assert_eq!(store.expire(250 + DAY, DAY).unwrap(), 0);
    let stats = store.stats(250 + DAY, DAY).unwrap();
    assert_eq!(stats.entries, 2);
    assert!(stats.logical_bytes < full && stats.logical_bytes > 0);
    assert!(store.get(&id("t3"), 250 + DAY, DAY).unwrap().is_some());
}

#[test]
fn a_newer_outcome_replaces_an_older_one_and_never_the_reverse() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, u64::MAX);
    store
        .archive(&[ended("k", 1, Decision::Abort, 10)], 10, DAY)
        .unwrap();
    store
        .archive(&[ended("k", 2, Decision::Commit, 20)], 20, DAY)
        .unwrap();
    let bytes = store.stats(20, DAY).unwrap().logical_bytes;
    // A restart re-archives the older End record it replayed: it must not come back.
    let report = store
        .archive(&[ended("k", 1, Decision::Abort, 10)], 30, DAY)
        .unwrap();
    assert_eq!(report.written, 0);
    let got = store.get(&id("k"), 30, DAY).unwrap().unwrap();
    assert_eq!(got.decision.decision, Decision::Commit);
    let stats = store.stats(30, DAY).unwrap();
    assert_eq!((stats.entries, stats.logical_bytes), (1, bytes));
}

#[test]
fn the_budget_evicts_oldest_first_and_shows_the_effective_window() {
    let dir = tempfile::tempdir().unwrap();
    let one = {
        let probe = tempfile::tempdir().unwrap();
        let store = open(&probe, u64::MAX);
        store
            .archive(&[ended("t0", 0, Decision::Commit, 0)], 0, DAY)
            .unwrap();
        store.stats(0, DAY).unwrap().logical_bytes
    };
    // Room for three entries of this size.
    let store = open(&dir, 3 * one + one / 2);
    assert_eq!(store.stats(0, DAY).unwrap().effective_window_ms, DAY);
    let batch: Vec<Retained> = (0..5)
        .map(|i| ended(&format!("t{i}"), i, Decision::Commit, 1_000 * i))
        .collect();
    let report = store.archive(&batch, 5_000, DAY).unwrap();
    assert_eq!(report.evicted_early, 2);
    assert_eq!(store.get(&id("t0"), 5_000, DAY).unwrap(), None);
    assert_eq!(store.get(&id("t1"), 5_000, DAY).unwrap(), None);
    assert!(store.get(&id("t2"), 5_000, DAY).unwrap().is_some());
    let stats = store.stats(5_000, DAY).unwrap();
    assert_eq!(stats.evicted_early_total, 2);
    assert!(stats.logical_bytes <= 3 * one + one / 2);
    // The oldest kept ended at 2,000: it is 3,000 ms old.
    assert_eq!(stats.effective_window_ms, 3_000);
    // Once the evicted ones would have expired anyway, the window is whole again.
    assert_eq!(
        store.stats(1_000 + DAY, DAY).unwrap().effective_window_ms,
        DAY
    );
}

#[test]
fn listing_pages_through_the_time_table_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, u64::MAX);
    let batch: Vec<Retained> = (0..7)
        .map(|i| {
            let decision = if i % 2 == 0 {
                Decision::Commit
            } else {
                Decision::Abort
            };
            ended(&format!("t{i}"), i, decision, 10 * i)
        })
        .collect();
    store.archive(&batch, 100, DAY).unwrap();
    let ids = |page: &super::Page| -> Vec<String> {
        page.outcomes
            .iter()
            .map(|r| r.decision.txid.to_string())
            .collect()
    };
    let first = store.list(None, 3, None, 100, DAY).unwrap();
    assert_eq!(ids(&first), ["t0", "t1", "t2"]);
    let next = first.next.unwrap();
    // The cursor survives its text form.
    let next: Cursor = next.to_string().parse().unwrap();
    let second = store.list(None, 3, Some(next), 100, DAY).unwrap();
    assert_eq!(ids(&second), ["t3", "t4", "t5"]);
    let third = store.list(None, 3, second.next, 100, DAY).unwrap();
    assert_eq!(ids(&third), ["t6"]);
    assert_eq!(third.next, None);
    let committed = store
        .list(Some(Decision::Commit), 10, None, 100, DAY)
        .unwrap();
    assert_eq!(ids(&committed), ["t0", "t2", "t4", "t6"]);
    // Out of the window is out of the listing: at 25 + DAY, t0..t2 are gone.
    let late = store.list(None, 10, None, 25 + DAY, DAY).unwrap();
    assert_eq!(ids(&late), ["t3", "t4", "t5", "t6"]);
    assert!("12".parse::<Cursor>().is_err());
}

#[test]
fn what_was_archived_is_there_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(&dir, u64::MAX);
        store
            .archive(&[ended("a", 1, Decision::Commit, 5)], 5, DAY)
            .unwrap();
    }
    let store = open(&dir, u64::MAX);
    assert!(store.get(&id("a"), 6, DAY).unwrap().is_some());
    assert_eq!(store.stats(6, DAY).unwrap().entries, 1);
}

#[test]
fn a_corrupt_file_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outcomes.redb");
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    let err = OutcomeStore::open(&path, u64::MAX).unwrap_err().to_string();
    assert!(err.contains("outcomes.redb"), "{err}");
    assert!(err.contains("will not start"), "{err}");
}

fn gtid_of(r: &Retained) -> protocol::GlobalTxId {
    r.decision.attempt.gtid.clone()
}

#[test]
fn an_attempt_is_found_by_its_own_id_whatever_id_asks_until_it_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, u64::MAX);
    let a = ended("a", 1, Decision::Commit, 1_000);
    let b = ended("b", 2, Decision::Abort, 2_000);
    store.archive(&[a.clone(), b.clone()], 2_000, DAY).unwrap();
    assert_eq!(
        store.get_attempt(&gtid_of(&a), 3_000, DAY).unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        store.get_attempt(&gtid_of(&b), 3_000, DAY).unwrap(),
        Some(b.clone())
    );
    // A later attempt of "a" replaces the first: the first's attempt id no longer maps.
    let a2 = ended("a", 3, Decision::Abort, 3_000);
    store
        .archive(std::slice::from_ref(&a2), 3_000, DAY)
        .unwrap();
    assert_eq!(store.get_attempt(&gtid_of(&a), 4_000, DAY).unwrap(), None);
    assert_eq!(
        store.get_attempt(&gtid_of(&a2), 4_000, DAY).unwrap(),
        Some(a2.clone())
    );
    // Outside the window it is absent, and expiry removes the mapping with the entry.
    assert_eq!(
        store.get_attempt(&gtid_of(&b), 2_000 + DAY, DAY).unwrap(),
        None
    );
    store.expire(2_000 + DAY, DAY).unwrap();
    assert_eq!(store.get_attempt(&gtid_of(&b), 3_000, DAY).unwrap(), None);
    assert_eq!(
        store.get_attempt(&gtid_of(&a2), 4_000, DAY).unwrap(),
        Some(a2)
    );
}

#[test]
fn an_index_written_before_the_attempt_table_gets_it_built_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let batch: Vec<Retained> = (0..20)
        .map(|i| ended(&format!("t{i}"), i + 1, Decision::Commit, 100 * i))
        .collect();
    let bytes = {
        let store = open(&dir, u64::MAX);
        store.archive(&batch, 0, DAY).unwrap();
        let bytes = store.stats(0, DAY).unwrap().logical_bytes;
        store.forget_attempt_table().unwrap();
        assert_eq!(
            store
                .get_attempt(&gtid_of(&batch[3]), 0, DAY)
                .ok()
                .flatten(),
            None
        );
        bytes
    };
    let store = open(&dir, u64::MAX);
    for r in &batch {
        assert_eq!(
            store.get_attempt(&gtid_of(r), 5_000, DAY).unwrap().as_ref(),
            Some(r)
        );
    }
    assert_eq!(
        store.stats(0, DAY).unwrap().logical_bytes,
        bytes,
        "the budget is counted again"
    );
}

#[test]
fn budget_eviction_removes_the_attempt_mapping_too() {
    let dir = tempfile::tempdir().unwrap();
    let first = ended("first", 1, Decision::Commit, 0);
    let store = open(&dir, 1);
    store.archive(std::slice::from_ref(&first), 0, DAY).unwrap();
    assert_eq!(
        store.get(&id("first"), 0, DAY).unwrap(),
        None,
        "over budget: evicted"
    );
    assert_eq!(store.get_attempt(&gtid_of(&first), 0, DAY).unwrap(), None);
}

#[test]
fn a_lookup_sees_every_commit_that_returned_before_it_though_lookups_share_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, u64::MAX);
    // A miss first, so that a snapshot from before the archive is there to be reused.
    assert_eq!(store.get(&id("a"), 1_000, DAY).unwrap(), None);
    let a = ended("a", 1, Decision::Abort, 1_000);
    store.archive(std::slice::from_ref(&a), 1_000, DAY).unwrap();
    assert_eq!(store.get(&id("a"), 1_000, DAY).unwrap(), Some(a));
    // A newer outcome for the id, then its expiry: each lookup after a commit sees that commit.
    let newer = ended("a", 2, Decision::Commit, 2_000);
    store
        .archive(std::slice::from_ref(&newer), 2_000, DAY)
        .unwrap();
    assert_eq!(store.get(&id("a"), 2_000, DAY).unwrap(), Some(newer));
    assert_eq!(store.expire(2_001 + DAY, DAY).unwrap(), 1);
    assert_eq!(store.get(&id("a"), 0, u64::MAX).unwrap(), None);
    // Kept between lookups, dropped by the next commit: an idle index's expiry sweeps are never
    // kept from reusing the pages they free by a snapshot older than them.
    assert!(store.keeps_a_snapshot());
    store
        .archive(&[ended("b", 3, Decision::Commit, 3_000)], 3_000, DAY)
        .unwrap();
    assert!(!store.keeps_a_snapshot());
}

#[test]
fn lookups_racing_archives_find_every_outcome_archived_before_they_began() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(&dir, u64::MAX));
    // How many single-outcome batches have returned: a lookup of any id below it must hit.
    let archived = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, archived) = (
                std::sync::Arc::clone(&store),
                std::sync::Arc::clone(&archived),
            );
            std::thread::spawn(move || {
                let mut checked = 0u64;
                while archived.load(std::sync::atomic::Ordering::SeqCst) < 200 {
                    let done = archived.load(std::sync::atomic::Ordering::SeqCst);
                    if let Some(last) = done.checked_sub(1) {
                        let found = store.get(&id(&format!("t{last}")), 0, DAY).unwrap();
                        assert!(
                            found.is_some(),
                            "t{last} was archived before this lookup began"
                        );
                        checked += 1;
                    }
                }
                checked
            })
        })
        .collect();
    for i in 0..200u64 {
        store
            .archive(&[ended(&format!("t{i}"), i, Decision::Commit, 0)], 0, DAY)
            .unwrap();
        archived.store(i + 1, std::sync::atomic::Ordering::SeqCst);
    }
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(checked > 0, "the readers looked nothing up");
}
