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
    ) -> Result<ReplicaHost, OutcomeError> {
        let index_path = data_dir.join(crate::outcomes::FILE_NAME);
        let outcomes = OutcomeStore::open(&index_path, index_max_bytes)?;
        Ok(ReplicaHost {
            index_path,
            index_max_bytes,
            retention_ms,
            copy: Mutex::new(Copy {
                replica: Replica::new(data_dir.join("wal")),
                outcomes: Some(outcomes),
                highest_term: 0,
                backup_term: 0,
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

    /// Blocking: replaces the log copy with a leader's base backup.
    pub fn install(&self, term: u64, body: &[u8]) -> Result<(), Refusal> {
        let backup = BaseBackup::decode(body).map_err(|e| Refusal::Undecodable(e.to_string()))?;
        let mut copy = self.lock();
        Self::admit(&mut copy, term)?;
        copy.replica.install(&backup)?;
        copy.backup_term = term;
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
