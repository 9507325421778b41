//! The on-disk outcome index: every ended transaction's outcome for its whole idempotency
//! window, in one redb file (`<data-dir>/outcomes.redb`).
//!
//! Four tables:
//! - `outcomes`: txid -> (ended_at_ms, seq, JSON of the `Retained` record), for point lookups;
//! - `by_time`: (ended_at_ms, seq) -> txid, oldest first, for expiry, budget eviction and
//!   paged listing without touching anything else;
//! - `by_gtid`: attempt id -> txid, so an attempt is found whatever id a question names it
//!   under (a decision query or an operator's resolve that pairs it with another id must not
//!   be answered as if the attempt had no record); built from `outcomes` once when an index
//!   written before it is opened;
//! - `meta`: counters that must survive restarts (the logical bytes stored, the next seq, early
//!   evictions), because a B-tree file's size lags its deletes and cannot be the budget.
//!
//! Every write is one redb transaction committed with immediate durability: when `archive`
//! returns `Ok`, the batch survives a crash, which is what lets the engine drop it from staging.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use protocol::{Decision, GlobalTxId, TxId};

use crate::records::Retained;

const OUTCOMES: TableDefinition<&str, (u64, u64, &[u8])> = TableDefinition::new("outcomes");
const BY_TIME: TableDefinition<(u64, u64), &str> = TableDefinition::new("by_time");
const BY_GTID: TableDefinition<&str, &str> = TableDefinition::new("by_gtid");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Set once `by_gtid` holds every entry of `outcomes` (an index from before it gets it built).
const META_BY_GTID_BUILT: &str = "by_gtid_built";

const META_BYTES: &str = "logical_bytes";
const META_NEXT_SEQ: &str = "next_seq";
const META_EVICTED_EARLY: &str = "evicted_early_total";
/// `ended_at_ms` of the newest outcome the budget evicted while it was still in its window.
const META_LAST_EARLY: &str = "last_early_evicted_ended_at_ms";

/// redb's page cache. Its default (1 GiB) would let the coordinator's memory grow with the
/// index, undoing the point of keeping outcomes on disk; lookups are by id, mostly of
/// recent outcomes, whose pages stay cached in this much.
const CACHE_BYTES: usize = 32 << 20;

/// Most entries one expiry transaction deletes, so a sweep after a long pause never builds a
/// huge write transaction; the next sweep goes on.
const EXPIRE_BATCH: usize = 10_000;

/// Most `by_time` entries one listing page looks at, so a filter that matches little (say
/// `state=committed` over days of aborts) costs a bounded scan; the page comes back short with
/// a cursor to go on from.
const LIST_SCAN_MAX: usize = 10_000;

/// Why the index could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum OutcomeError {
    #[error(
        "cannot open the outcome index {path}: {source}; it holds the idempotency records of \
         ended transactions, so the coordinator will not start without it (see \
         docs/operations.md, \"The outcome index\")"
    )]
    Open {
        path: PathBuf,
        // Boxed: redb's errors are large, and these travel in every `Result`.
        source: Box<redb::DatabaseError>,
    },
    #[error("outcome index {path}: {op} failed: {source}")]
    Index {
        path: PathBuf,
        op: &'static str,
        source: Box<redb::Error>,
    },
    #[error("outcome index {path}: the entry for {txid} does not decode: {source}")]
    Decode {
        path: PathBuf,
        txid: String,
        source: serde_json::Error,
    },
}

/// Where a listing page ends: the (ended_at_ms, seq) of its last entry. Shown to clients as
/// `<ended_at_ms>-<seq>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub ended_at_ms: u64,
    pub seq: u64,
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ended_at_ms, self.seq)
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;
    fn from_str(s: &str) -> Result<Cursor, String> {
        let bad = || format!("cursor {s:?}: expected the \"next\" value of a previous page");
        let (at, seq) = s.split_once('-').ok_or_else(bad)?;
        Ok(Cursor {
            ended_at_ms: at.parse().map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

/// One listing page from the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub outcomes: Vec<Retained>,
    /// Where the next page starts; `None` when the index has nothing after this page.
    pub next: Option<Cursor>,
}

/// What one archive batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveReport {
    pub written: u64,
    /// Entries the disk budget evicted while still inside the retention window.
    pub evicted_early: u64,
}

/// The index's numbers, for metrics and `/readyz`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub logical_bytes: u64,
    pub entries: u64,
    pub evicted_early_total: u64,
    /// How long outcomes are really kept: the configured window, or less when the budget
    /// evicted an outcome that was still inside it (the age of the oldest one kept).
    pub effective_window_ms: u64,
}

/// `outcomes` as one read snapshot sees it.
type OutcomesSnapshot = redb::ReadOnlyTable<&'static str, (u64, u64, &'static [u8])>;

#[derive(Debug)]
pub struct OutcomeStore {
    db: Database,
    path: PathBuf,
    /// Most logical bytes kept; the oldest outcomes go first beyond it.
    max_bytes: u64,
    /// Write transactions committed since open.
    commits: AtomicU64,
    /// The snapshot lookups share, with the `commits` count read before it was begun: kept
    /// only while no commit came since, so a lookup sees every commit that returned before it,
    /// as a read transaction of its own would (beginning one and opening the table was half of
    /// a lookup's cost on submit's path, docs/benchmarks.md). Every commit drops it.
    snapshot: Mutex<Option<(u64, Arc<OutcomesSnapshot>)>>,
}

/// The bytes one entry costs in the budget: every table's keys and values.
fn entry_bytes(txid: &str, gtid_len: usize, json_len: usize) -> u64 {
    // outcomes: key + (u64, u64, json); by_time: (u64, u64) + txid; by_gtid: gtid + txid.
    (3 * txid.len() + gtid_len + 32 + json_len) as u64
}

/// The attempt id inside a stored entry, read without decoding the rest.
fn gtid_of(json: &[u8]) -> Result<String, redb::Error> {
    #[derive(serde::Deserialize)]
    struct Entry {
        decision: Decision_,
    }
    #[derive(serde::Deserialize)]
    struct Decision_ {
        attempt: Attempt_,
    }
    #[derive(serde::Deserialize)]
    struct Attempt_ {
        gtid: String,
    }
    serde_json::from_slice::<Entry>(json)
        .map(|e| e.decision.attempt.gtid)
        .map_err(|e| redb::Error::Corrupted(format!("an outcome entry without its attempt: {e}")))
}

/// Removes `txid`'s entry from `outcomes` and `by_gtid` (not `by_time`: callers hold its key);
/// the budget bytes it cost, if it was there.
fn remove_entry(
    outcomes: &mut redb::Table<&str, (u64, u64, &[u8])>,
    by_gtid: &mut redb::Table<&str, &str>,
    txid: &str,
) -> Result<Option<u64>, redb::Error> {
    let Some(json) = outcomes.remove(txid)?.map(|v| v.value().2.to_vec()) else {
        return Ok(None);
    };
    let gtid = gtid_of(&json)?;
    // Attempt ids are never reused, so the mapping is this entry's; checked anyway, because
    // removing another id's mapping would hide that attempt's record.
    let owned = by_gtid
        .get(gtid.as_str())?
        .is_some_and(|owner| owner.value() == txid);
    if owned {
        by_gtid.remove(gtid.as_str())?;
    }
    Ok(Some(entry_bytes(txid, gtid.len(), json.len())))
}

/// The first `ended_at_ms` still inside the window at `now_ms` (`ended_at + retention > now`).
fn window_start(now_ms: u64, retention_ms: u64) -> u64 {
    now_ms.saturating_add(1).saturating_sub(retention_ms)
}

fn get_meta(table: &impl ReadableTable<&'static str, u64>, key: &str) -> Result<u64, redb::Error> {
    Ok(table.get(key)?.map_or(0, |v| v.value()))
}

impl OutcomeStore {
    /// Opens (or creates) the index at `path`. A file that cannot be opened (corrupt, or held
    /// by another process) is an error: moving it aside would forget idempotency records.
    pub fn open(path: &Path, max_bytes: u64) -> Result<OutcomeStore, OutcomeError> {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|source| OutcomeError::Open {
                path: path.to_path_buf(),
                source: Box::new(source),
            })?;
        let store = OutcomeStore {
            db,
            path: path.to_path_buf(),
            max_bytes,
            commits: AtomicU64::new(0),
            snapshot: Mutex::new(None),
        };
        // Create the tables, so read transactions find them from the start; an index written
        // before `by_gtid` existed gets it built (and its byte count redone to match).
        store.write("create tables", |tx| {
            let outcomes = tx.open_table(OUTCOMES)?;
            tx.open_table(BY_TIME)?;
            let mut by_gtid = tx.open_table(BY_GTID)?;
            let mut meta = tx.open_table(META)?;
            if get_meta(&meta, META_BY_GTID_BUILT)? == 0 {
                let mut bytes = 0u64;
                for entry in outcomes.iter()? {
                    let (txid, value) = entry?;
                    let json = value.value().2;
                    let gtid = gtid_of(json)?;
                    by_gtid.insert(gtid.as_str(), txid.value())?;
                    bytes += entry_bytes(txid.value(), gtid.len(), json.len());
                }
                meta.insert(META_BYTES, bytes)?;
                meta.insert(META_BY_GTID_BUILT, 1)?;
            }
            Ok(())
        })?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, op: &'static str) -> impl Fn(redb::Error) -> OutcomeError + '_ {
        move |source| OutcomeError::Index {
            path: self.path.clone(),
            op,
            source: Box::new(source),
        }
    }

    /// Runs `body` in one write transaction, committed durably.
    fn write<T>(
        &self,
        op: &'static str,
        body: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, OutcomeError> {
        let run = || -> Result<T, redb::Error> {
            let mut tx = self.db.begin_write()?;
            // The default, said out loud: the engine drops a batch from staging (and so from
            // the next checkpoint) on the strength of this commit.
            tx.set_durability(Durability::Immediate)
                .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
            let value = body(&tx)?;
            tx.commit()?;
            self.commits.fetch_add(1, Ordering::SeqCst);
            // Nothing keeps the pages this commit freed from being reused, however long until
            // the next lookup (an idle coordinator's expiry sweeps still free pages).
            *self.shared_snapshot() = None;
            Ok(value)
        };
        run().map_err(self.err(op))
    }

    fn decode(&self, txid: &str, json: &[u8]) -> Result<Retained, OutcomeError> {
        serde_json::from_slice(json).map_err(|source| OutcomeError::Decode {
            path: self.path.clone(),
            txid: txid.to_string(),
            source,
        })
    }

    /// Upserts a batch (one durable transaction), then evicts the oldest beyond the budget.
    /// An entry older than the one already stored for its id is skipped, so re-archiving after
    /// a restart (the log's End records replay into staging) never brings back a superseded
    /// outcome.
    pub fn archive(
        &self,
        batch: &[Retained],
        now_ms: u64,
        retention_ms: u64,
    ) -> Result<ArchiveReport, OutcomeError> {
        let max_bytes = self.max_bytes;
        self.write("archive", |tx| {
            let mut outcomes = tx.open_table(OUTCOMES)?;
            let mut by_time = tx.open_table(BY_TIME)?;
            let mut by_gtid = tx.open_table(BY_GTID)?;
            let mut meta = tx.open_table(META)?;
            let mut bytes = get_meta(&meta, META_BYTES)?;
            let mut seq = get_meta(&meta, META_NEXT_SEQ)?;
            let mut report = ArchiveReport::default();
            for retained in batch {
                let txid = retained.decision.txid.as_str();
                let gtid = retained.decision.attempt.gtid.as_str();
                let json = serde_json::to_vec(retained)
                    .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
                let old = outcomes.get(txid)?.map(|v| {
                    let (at, old_seq, _) = v.value();
                    (at, old_seq)
                });
                if let Some((at, old_seq)) = old {
                    if at > retained.ended_at_ms {
                        continue;
                    }
                    by_time.remove((at, old_seq))?;
                    let freed = remove_entry(&mut outcomes, &mut by_gtid, txid)?;
                    bytes = bytes.saturating_sub(freed.unwrap_or(0));
                }
                outcomes.insert(txid, (retained.ended_at_ms, seq, json.as_slice()))?;
                by_time.insert((retained.ended_at_ms, seq), txid)?;
                by_gtid.insert(gtid, txid)?;
                bytes += entry_bytes(txid, gtid.len(), json.len());
                seq += 1;
                report.written += 1;
            }
            // The budget: oldest first. What is still inside the window is an early eviction,
            // counted and remembered so the effective window can be shown.
            let mut last_early = get_meta(&meta, META_LAST_EARLY)?;
            while bytes > max_bytes {
                let Some((key, txid)) = by_time
                    .pop_first()?
                    .map(|(k, v)| (k.value(), v.value().to_string()))
                else {
                    break;
                };
                if let Some(freed) = remove_entry(&mut outcomes, &mut by_gtid, &txid)? {
                    bytes = bytes.saturating_sub(freed);
                }
                if key.0.saturating_add(retention_ms) > now_ms {
                    report.evicted_early += 1;
                    last_early = last_early.max(key.0);
                }
            }
            let early_total = get_meta(&meta, META_EVICTED_EARLY)? + report.evicted_early;
            meta.insert(META_BYTES, bytes)?;
            meta.insert(META_NEXT_SEQ, seq)?;
            meta.insert(META_EVICTED_EARLY, early_total)?;
            meta.insert(META_LAST_EARLY, last_early)?;
            Ok(report)
        })
    }

    /// The outcome recorded for `txid`, if it ended less than `retention_ms` before `now_ms`
    /// (an older one is absent even before the expiry sweep deletes it).
    pub fn get(
        &self,
        txid: &TxId,
        now_ms: u64,
        retention_ms: u64,
    ) -> Result<Option<Retained>, OutcomeError> {
        let found = (|| -> Result<Option<(u64, Vec<u8>)>, redb::Error> {
            let outcomes = self.snapshot()?;
            Ok(outcomes.get(txid.as_str())?.map(|v| {
                let (at, _, json) = v.value();
                (at, json.to_vec())
            }))
        })()
        .map_err(self.err("lookup"))?;
        match found {
            Some((at, json)) if at.saturating_add(retention_ms) > now_ms => {
                self.decode(txid.as_str(), &json).map(Some)
            }
            Some(_) | None => Ok(None),
        }
    }

    /// The shared snapshot of `outcomes`, begun anew when a commit came since the last one.
    fn snapshot(&self) -> Result<Arc<OutcomesSnapshot>, redb::Error> {
        // Read before the snapshot is begun: the snapshot then holds at least these commits.
        let commits = self.commits.load(Ordering::SeqCst);
        if let Some((seen, snapshot)) = self.shared_snapshot().as_ref()
            && *seen == commits
        {
            return Ok(Arc::clone(snapshot));
        }
        // Begun outside the lock, kept only if no commit came meanwhile (a commit counts, then
        // drops what is kept, so a snapshot kept here is never older than the last commit).
        let snapshot = Arc::new(self.db.begin_read()?.open_table(OUTCOMES)?);
        let mut shared = self.shared_snapshot();
        if self.commits.load(Ordering::SeqCst) == commits {
            *shared = Some((commits, Arc::clone(&snapshot)));
        }
        Ok(snapshot)
    }

    /// Whether a snapshot is kept for the next lookup (tests: every commit drops it).
    #[cfg(test)]
    pub(super) fn keeps_a_snapshot(&self) -> bool {
        self.shared_snapshot().is_some()
    }

    fn shared_snapshot(&self) -> std::sync::MutexGuard<'_, Option<(u64, Arc<OutcomesSnapshot>)>> {
        // Only ever a finished assignment under the lock: a panic elsewhere leaves it whole.
        self.snapshot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The outcome recorded for attempt `gtid`, whatever id it ended under, inside the window
    /// as for [`OutcomeStore::get`].
    pub fn get_attempt(
        &self,
        gtid: &GlobalTxId,
        now_ms: u64,
        retention_ms: u64,
    ) -> Result<Option<Retained>, OutcomeError> {
        let owner = (|| -> Result<Option<String>, redb::Error> {
            let tx = self.db.begin_read()?;
            let by_gtid = tx.open_table(BY_GTID)?;
            Ok(by_gtid.get(gtid.as_str())?.map(|v| v.value().to_string()))
        })()
        .map_err(self.err("lookup by attempt"))?;
        let Some(owner) = owner.and_then(|t| TxId::new(t).ok()) else {
            return Ok(None);
        };
        Ok(self
            .get(&owner, now_ms, retention_ms)?
            .filter(|r| r.decision.attempt.gtid == *gtid))
    }

    /// Deletes outcomes that ended `retention_ms` or longer before `now_ms`, at most
    /// `EXPIRE_BATCH` of them; returns how many went (call again while it returns the batch).
    pub fn expire(&self, now_ms: u64, retention_ms: u64) -> Result<usize, OutcomeError> {
        // A read first: most sweeps find nothing, and a write transaction costs an fsync.
        let oldest = (|| -> Result<Option<u64>, redb::Error> {
            let tx = self.db.begin_read()?;
            let by_time = tx.open_table(BY_TIME)?;
            Ok(by_time.first()?.map(|(k, _)| k.value().0))
        })()
        .map_err(self.err("expire"))?;
        if oldest.is_none_or(|at| at.saturating_add(retention_ms) > now_ms) {
            return Ok(0);
        }
        self.write("expire", |tx| {
            let mut outcomes = tx.open_table(OUTCOMES)?;
            let mut by_time = tx.open_table(BY_TIME)?;
            let mut by_gtid = tx.open_table(BY_GTID)?;
            let mut meta = tx.open_table(META)?;
            let mut bytes = get_meta(&meta, META_BYTES)?;
            let mut gone = 0;
            while gone < EXPIRE_BATCH {
                let Some((key, txid)) = by_time
                    .first()?
                    .map(|(k, v)| (k.value(), v.value().to_string()))
                else {
                    break;
                };
                // Expired means ended_at + retention <= now, as in `get`.
                if key.0.saturating_add(retention_ms) > now_ms {
                    break;
                }
                by_time.remove(key)?;
                if let Some(freed) = remove_entry(&mut outcomes, &mut by_gtid, &txid)? {
                    bytes = bytes.saturating_sub(freed);
                }
                gone += 1;
            }
            meta.insert(META_BYTES, bytes)?;
            Ok(gone)
        })
    }

    /// Ended outcomes in end order (oldest first) after `after`, at most `limit` of them,
    /// only `wanted` decisions (all when `None`), none outside the window. At most
    /// `LIST_SCAN_MAX` entries are looked at, so a page can come back short, with `next`.
    pub fn list(
        &self,
        wanted: Option<Decision>,
        limit: usize,
        after: Option<Cursor>,
        now_ms: u64,
        retention_ms: u64,
    ) -> Result<Page, OutcomeError> {
        let err = self.err("list");
        let tx = self.db.begin_read().map_err(|e| err(e.into()))?;
        let outcomes = tx.open_table(OUTCOMES).map_err(|e| err(e.into()))?;
        let by_time = tx.open_table(BY_TIME).map_err(|e| err(e.into()))?;
        // Skip what is out of the window: start at its first millisecond, or after the cursor
        // if that is later.
        let in_window = (window_start(now_ms, retention_ms), 0);
        let start = match after {
            Some(c) => in_window.max((c.ended_at_ms, c.seq.saturating_add(1))),
            None => in_window,
        };
        let mut page = Page {
            outcomes: Vec::new(),
            next: None,
        };
        let mut last = None;
        let range = by_time.range(start..).map_err(|e| err(e.into()))?;
        for (scanned, entry) in range.enumerate() {
            if page.outcomes.len() == limit || scanned == LIST_SCAN_MAX {
                page.next = last;
                break;
            }
            let (key, txid) = entry.map_err(|e| err(e.into()))?;
            let key = key.value();
            last = Some(Cursor {
                ended_at_ms: key.0,
                seq: key.1,
            });
            let txid = txid.value();
            let Some(value) = outcomes.get(txid).map_err(|e| err(e.into()))? else {
                continue;
            };
            let (_, seq, json) = value.value();
            if seq != key.1 {
                continue;
            }
            let retained = self.decode(txid, json)?;
            if wanted.is_none_or(|w| w == retained.decision.decision) {
                page.outcomes.push(retained);
            }
        }
        Ok(page)
    }

    /// Makes the index look as one written before `by_gtid` existed (the upgrade test).
    #[cfg(test)]
    pub(crate) fn forget_attempt_table(&self) -> Result<(), OutcomeError> {
        self.write("forget by_gtid", |tx| {
            tx.delete_table(BY_GTID)?;
            tx.open_table(META)?.remove(META_BY_GTID_BUILT)?;
            Ok(())
        })
    }

    /// The numbers for metrics and `/readyz`.
    pub fn stats(&self, now_ms: u64, retention_ms: u64) -> Result<IndexStats, OutcomeError> {
        (|| -> Result<IndexStats, redb::Error> {
            let tx = self.db.begin_read()?;
            let meta = tx.open_table(META)?;
            let by_time = tx.open_table(BY_TIME)?;
            let last_early = get_meta(&meta, META_LAST_EARLY)?;
            let early_matters = get_meta(&meta, META_EVICTED_EARLY)? > 0
                && last_early.saturating_add(retention_ms) > now_ms;
            let effective_window_ms = match by_time.first()? {
                Some((key, _)) if early_matters => now_ms.saturating_sub(key.value().0),
                // Evicted early and nothing left: nothing is kept at all.
                None if early_matters => 0,
                Some(_) | None => retention_ms,
            };
            Ok(IndexStats {
                logical_bytes: get_meta(&meta, META_BYTES)?,
                entries: by_time.len()?,
                evicted_early_total: get_meta(&meta, META_EVICTED_EARLY)?,
                effective_window_ms,
            })
        })()
        .map_err(self.err("stats"))
    }
}
