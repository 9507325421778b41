//! A follower's side: its copy of the leader's log directory (`wal::Replica`) and of its
//! outcome index, behind the epoch gate of `rules::replica_verdict`. The `/v1/replica/*`
//! handlers call in here; everything that touches the disk runs on a blocking thread and
//! answers only once it is durable (the leader counts the answer as this copy's fsync).
//!
//! Must never: take a message from a term below the highest seen; move once frozen (a
//! campaign started); answer before the copy is on disk.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use wal::{BaseBackup, OpBatch, Replica, ReplicaError};

use super::rules::{ReplicaVerdict, replica_verdict};
use crate::outcomes::{OutcomeError, OutcomeStore};
use crate::records::Retained;

/// Why a replication message was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("a leader of term {highest} was seen; term {sent} is deposed")]
    StaleTerm { sent: u64, highest: u64 },
    #[error("this node is campaigning or leads: its copy is frozen")]
    Frozen,
    #[error("{0}")]
    Replica(#[from] ReplicaError),
    #[error("the batch does not decode: {0}")]
    Undecodable(String),
    #[error("the outcome index copy: {0}")]
    Outcomes(#[from] OutcomeError),
    #[error("the outcome index copy is closed (this node was promoted)")]
    Closed,
    #[error(
        "this node's data directory holds the log of coordinator {held}, not of {offered} (the \
         group's): refusing to overwrite another coordinator's history; move the directory \
         aside (its in-doubt attempts need it) to let this node join (docs/ha.md, \"Forming a group\")"
    )]
    ForeignLog { held: String, offered: String },
}

/// Why a follower's copy could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Index(#[from] OutcomeError),
    #[error("the log copy in {dir}: {detail}", dir = dir.display())]
    Log {
        dir: std::path::PathBuf,
        detail: String,
    },
}

/// The coordinator id a data directory's log holds, if any: from its last epoch record, or
/// from its checkpoint when the records after it hold none. Read-only.
pub fn logged_coordinator_id(wal_dir: &Path) -> Result<Option<String>, String> {
    // A node that never ran has no directory yet: no log, no history to keep.
    if !wal_dir.exists() || !wal::inspect::holds_log(wal_dir).map_err(|e| e.to_string())? {
        return Ok(None);
    }
    let mut found = None;
    let summary = wal::inspect::dump(wal_dir, |record| {
        if let Ok(crate::records::LogRecord::Epoch(identity)) =
            crate::records::LogRecord::decode(record.seq, record.record_type.0, record.payload)
        {
            found = Some(identity.coordinator_id.to_string());
        }
    })
    .map_err(|e| e.to_string())?;
    if found.is_some() {
        return Ok(found);
    }
    let Some(snapshot) = summary.snapshot else {
        return Ok(None);
    };
    let bytes = std::fs::read(&snapshot.path).map_err(|e| e.to_string())?;
    let payload = wal::decode_snapshot(&bytes, snapshot.seq)?;
    let decoded = crate::records::Snapshot::decode(payload).map_err(|e| e.to_string())?;
    Ok(Some(decoded.identity.coordinator_id.to_string()))
}

/// What a follower holds, for `/v1/group` and the leader's logs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CopyStatus {
    /// The next file operation this copy expects (None: it needs a base backup).
    pub next_op: Option<u64>,
    pub highest_term: u64,
    pub frozen: bool,
    pub batches_applied: u64,
    pub outcomes_applied: u64,
}

#[derive(Debug)]
struct Copy {
    replica: Replica,
    outcomes: Option<OutcomeStore>,
    highest_term: u64,
    /// The term of the leader whose base backup the copy holds (0: none in this process).
    backup_term: u64,
    /// Whose log the copy holds (read at open, then the leader's after a backup).
    coordinator_id: Option<String>,
    frozen: bool,
    batches_applied: u64,
    outcomes_applied: u64,
}

/// A follower's copy.
#[derive(Debug)]
pub struct ReplicaHost {
    index_path: PathBuf,
    index_max_bytes: u64,
    /// This node's --retention-ms: its index copy expires as the leader's does.
    retention_ms: u64,
    copy: Mutex<Copy>,
}

impl ReplicaHost {
    /// Opens the copy under `data_dir` (the log directory `wal/` and `outcomes.redb`, the same
    /// places a single coordinator uses, so a promoted follower recovers from them as a
    /// restarted coordinator would).
    pub fn open(
        data_dir: &Path,
        index_max_bytes: u64,
        retention_ms: u64,
    ) -> Result<ReplicaHost, OpenError> {
        let index_path = data_dir.join(crate::outcomes::FILE_NAME);
        let outcomes = OutcomeStore::open(&index_path, index_max_bytes)?;
        let coordinator_id =
            logged_coordinator_id(&data_dir.join("wal")).map_err(|detail| OpenError::Log {
                dir: data_dir.join("wal"),
                detail,
            })?;
        Ok(ReplicaHost {
            index_path,
            index_max_bytes,
            retention_ms,
            copy: Mutex::new(Copy {
                replica: Replica::new(data_dir.join("wal")),
                outcomes: Some(outcomes),
                highest_term: 0,
                backup_term: 0,
                coordinator_id,
                frozen: false,
                batches_applied: 0,
                outcomes_applied: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Copy> {
        // A panic mid-apply leaves the files as a crash would; recovery handles that.
        self.copy.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admit(copy: &mut Copy, term: u64) -> Result<(), Refusal> {
        match replica_verdict(copy.highest_term, copy.frozen, term) {
            ReplicaVerdict::Accept => {
                copy.highest_term = term;
                Ok(())
            }
            ReplicaVerdict::StaleEpoch { highest } => Err(Refusal::StaleTerm {
                sent: term,
                highest,
            }),
            ReplicaVerdict::Frozen => Err(Refusal::Frozen),
        }
    }

    /// Blocking: replaces the log copy with a leader's base backup of coordinator
    /// `coordinator_id`'s log, unless the copy holds another coordinator's.
    pub fn install(
        &self,
        term: u64,
        coordinator_id: Option<&str>,
        body: &[u8],
    ) -> Result<(), Refusal> {
        let backup = BaseBackup::decode(body).map_err(|e| Refusal::Undecodable(e.to_string()))?;
        let mut copy = self.lock();
        if let (Some(held), Some(offered)) = (&copy.coordinator_id, coordinator_id)
            && held != offered
        {
            return Err(Refusal::ForeignLog {
                held: held.clone(),
                offered: offered.to_string(),
            });
        }
        Self::admit(&mut copy, term)?;
        copy.replica.install(&backup)?;
        copy.backup_term = term;
        if let Some(offered) = coordinator_id {
            copy.coordinator_id = Some(offered.to_string());
        }
        Ok(())
    }

    /// Blocking: applies one sync point's file operations, durably.
    pub fn apply(&self, term: u64, body: &[u8]) -> Result<(), Refusal> {
        let batch = OpBatch::decode(body).map_err(|e| Refusal::Undecodable(e.to_string()))?;
        let mut copy = self.lock();
        Self::admit(&mut copy, term)?;
        if copy.backup_term != term {
            // Op numbers start again with every leader's run: only a stream from the leader
            // whose base backup this copy holds may continue it.
            return Err(Refusal::Replica(ReplicaError::NeedsBackup));
        }
        copy.replica.apply(&batch)?;
        copy.batches_applied += 1;
        Ok(())
    }

    /// Blocking: archives a batch of ended outcomes into the index copy (`reset`: empty it
    /// first, the start of a base backup).
    pub fn archive(
        &self,
        term: u64,
        reset: bool,
        batch: &[Retained],
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let mut copy = self.lock();
        Self::admit(&mut copy, term)?;
        if reset {
            // Closed before the file goes: one process opens a redb file once.
            copy.outcomes = None;
            match std::fs::remove_file(&self.index_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Refusal::Undecodable(format!(
                        "cannot remove {}: {e}",
                        self.index_path.display()
                    )));
                }
            }
            copy.outcomes = Some(OutcomeStore::open(&self.index_path, self.index_max_bytes)?);
        }
        let store = copy.outcomes.as_ref().ok_or(Refusal::Closed)?;
        store.archive(batch, now_ms, self.retention_ms)?;
        copy.outcomes_applied += batch.len() as u64;
        Ok(())
    }

    /// Stops taking messages (before a campaign): whatever a deposed leader sends later is
    /// refused, so the copy this node may lead from cannot move under it.
    pub fn freeze(&self) {
        self.lock().frozen = true;
    }

    /// The campaign was lost: follow again.
    pub fn thaw(&self) {
        self.lock().frozen = false;
    }

    /// Promotion: closes the index copy so recovery can open the file.
    pub fn close_for_promotion(&self) {
        let mut copy = self.lock();
        copy.frozen = true;
        copy.outcomes = None;
    }

    pub fn status(&self) -> CopyStatus {
        let copy = self.lock();
        CopyStatus {
            next_op: copy.replica.next_op(),
            highest_term: copy.highest_term,
            frozen: copy.frozen,
            batches_applied: copy.batches_applied,
            outcomes_applied: copy.outcomes_applied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{EpochRecord, LogRecord};
    use protocol::{CoordinatorId, Epoch, Incarnation};
    use wal::{Durability, RecordType, Wal, WalOptions};

    fn log_of(dir: &Path, id: &str) {
        let (wal, _) = Wal::open(dir.join("wal"), WalOptions::default()).unwrap();
        let record = LogRecord::Epoch(EpochRecord {
            coordinator_id: CoordinatorId::new(id.to_string()).unwrap(),
            epoch: Epoch(3),
            incarnation: Incarnation(9),
        });
        wal.submit(
            RecordType(record.record_type()),
            record.encode(),
            Durability::Forced,
        )
        .wait_blocking()
        .unwrap();
        wal.close();
    }

    fn empty_backup() -> Vec<u8> {
        BaseBackup {
            next_op: 1,
            files: Vec::new(),
        }
        .encode()
    }

    #[test]
    fn a_copy_holding_another_coordinators_log_refuses_to_be_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        log_of(dir.path(), "c-held");
        assert_eq!(
            logged_coordinator_id(&dir.path().join("wal")).unwrap(),
            Some("c-held".to_string())
        );
        let host = ReplicaHost::open(dir.path(), 1 << 20, 60_000).unwrap();
        let refused = host.install(1, Some("c-other"), &empty_backup());
        assert!(
            matches!(refused, Err(Refusal::ForeignLog { .. })),
            "{refused:?}"
        );
        assert!(
            logged_coordinator_id(&dir.path().join("wal"))
                .unwrap()
                .is_some(),
            "the history is still there"
        );
        // The same coordinator's backup (a follower catching up) is taken.
        host.install(1, Some("c-held"), &empty_backup()).unwrap();
        assert_eq!(host.status().next_op, Some(1));
    }

    #[test]
    fn an_empty_copy_takes_any_group_and_then_only_that_groups_stream() {
        let dir = tempfile::tempdir().unwrap();
        let host = ReplicaHost::open(dir.path(), 1 << 20, 60_000).unwrap();
        host.install(2, Some("c-group"), &empty_backup()).unwrap();
        // A stream from another term than the backup's must start with its own backup.
        let batch = OpBatch {
            first: 1,
            ops: Vec::new(),
        }
        .encode();
        assert!(matches!(
            host.apply(3, &batch),
            Err(Refusal::Replica(ReplicaError::NeedsBackup))
        ));
        // An older term is refused as deposed; a frozen copy refuses everything.
        assert!(matches!(
            host.apply(1, &batch),
            Err(Refusal::StaleTerm { .. })
        ));
        host.freeze();
        assert!(matches!(
            host.install(4, Some("c-group"), &empty_backup()),
            Err(Refusal::Frozen)
        ));
        assert!(matches!(
            host.install(4, Some("c-else"), &empty_backup()),
            Err(Refusal::ForeignLog { .. })
        ));
    }
}
