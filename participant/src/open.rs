//! Starting a participant: lock the data directory, open the log, rebuild the engine from the
//! newest checkpoint plus the records after it (prepared transactions with their locks held).

use std::fs::{self, File, TryLockError};
use std::path::PathBuf;
use std::sync::Arc;

use wal::{PreallocatedStorage, Storage, Wal, WalError};

use crate::config::ParticipantConfig;
use crate::engine::{Engine, ReplayError};
use crate::record::{DecodeError, Record};
use crate::resource::Resource;
use crate::service::Participant;
use crate::snapshot::Snapshot;

/// Why a participant cannot start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("data directory {} is locked by another process (lock file {})", dir.display(), lock.display())]
    Locked { dir: PathBuf, lock: PathBuf },
    #[error("data directory {}: {op}: {source}", dir.display())]
    Io {
        dir: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("log in {}: {source}", dir.display())]
    Decode {
        dir: PathBuf,
        #[source]
        source: DecodeError,
    },
    #[error("log in {}: snapshot does not decode: {source}", dir.display())]
    Snapshot {
        dir: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot build the decision client: {0}")]
    Client(#[from] net::outbound::BuildError),
    #[error("log in {}: {source}", dir.display())]
    Replay {
        dir: PathBuf,
        #[source]
        source: ReplayError,
    },
}

impl OpenError {
    /// The process exit code for this failure (docs/operations.md): 3 locked, 4 corrupt log,
    /// 1 anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            OpenError::Locked { .. } => 3,
            OpenError::Wal(WalError::Corrupt { .. })
            | OpenError::Decode { .. }
            | OpenError::Snapshot { .. }
            | OpenError::Replay { .. } => 4,
            OpenError::Wal(_) | OpenError::Io { .. } | OpenError::Client(_) => 1,
        }
    }
}

impl<R: Resource> Participant<R> {
    /// Opens (or creates) a participant in `config.data_dir`. Blocking: run it before serving,
    /// or in `spawn_blocking`.
    ///
    /// `initial` makes the resource for a first start (an empty log): it is used once and made
    /// durable with a checkpoint before this returns, so seeding happens exactly once.
    pub fn open(config: ParticipantConfig, initial: impl FnOnce() -> R) -> Result<Self, OpenError> {
        let storage = PreallocatedStorage::with_fill_ahead(config.wal_fill_ahead_bytes);
        Self::open_with_storage(config, Arc::new(storage), initial)
    }

    /// [`Participant::open`] with the log on any storage (the simulated disk of `wal::sim` in
    /// tests: lost unsynced writes, failing fsyncs). The directory lock is always a real file.
    pub fn open_with_storage(
        config: ParticipantConfig,
        storage: Arc<dyn Storage>,
        initial: impl FnOnce() -> R,
    ) -> Result<Self, OpenError> {
        let dir = config.data_dir.clone();
        fs::create_dir_all(&dir).map_err(|source| OpenError::Io {
            dir: dir.clone(),
            op: "create",
            source,
        })?;
        let lock_path = dir.join("LOCK");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| OpenError::Io {
                dir: dir.clone(),
                op: "open LOCK",
                source,
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(OpenError::Locked {
                    dir,
                    lock: lock_path,
                });
            }
            Err(TryLockError::Error(source)) => {
                return Err(OpenError::Io {
                    dir,
                    op: "lock LOCK",
                    source,
                });
            }
        }
        let (wal, recovery) = Wal::open_with_storage(storage, dir.join("wal"), config.wal.clone())?;
        if let Some(torn) = &recovery.torn_tail {
            tracing::warn!(
                file = %torn.file.display(),
                offset = torn.offset,
                bytes = torn.bytes,
                reason = %torn.reason,
                "cut off a torn write at the end of the log"
            );
        }
        let first_start = recovery.snapshot.is_none() && recovery.records.is_empty();
        let mut engine = match recovery.snapshot {
            Some(bytes) => {
                let snapshot: Snapshot =
                    serde_json::from_slice(&bytes).map_err(|source| OpenError::Snapshot {
                        dir: dir.clone(),
                        source,
                    })?;
                Engine::restore(config.engine.clone(), snapshot).map_err(|source| {
                    OpenError::Replay {
                        dir: dir.clone(),
                        source,
                    }
                })?
            }
            None => Engine::new(config.engine.clone(), initial()),
        };
        let replayed = recovery.records.len();
        for record in recovery.records {
            let record = Record::decode(record.seq, record.record_type, &record.payload).map_err(
                |source| OpenError::Decode {
                    dir: dir.clone(),
                    source,
                },
            )?;
            engine.replay(record).map_err(|source| OpenError::Replay {
                dir: dir.clone(),
                source,
            })?;
        }
        if first_start {
            // The initial state (a seed) becomes durable before anything can depend on it.
            let snapshot = engine
                .snapshot()
                .and_then(|snapshot| serde_json::to_vec(&snapshot))
                .map_err(|source| OpenError::Snapshot {
                    dir: dir.clone(),
                    source,
                })?;
            wal.checkpoint(snapshot).wait_blocking()?;
        }
        tracing::info!(
            data_dir = %dir.display(),
            first_start,
            replayed,
            prepared = engine.prepared_len(),
            "recovered"
        );
        for entry in engine.prepared_list() {
            tracing::info!(txid = %entry.txid, gtid = %entry.gtid, coordinator_id = %entry.coordinator_id,
                incarnation = %entry.incarnation, position = entry.position, keys = ?entry.keys,
                "in doubt after restart; keys stay locked");
        }
        let client = crate::decision_client::build(
            config.decision_timeout_ms,
            config.coordinator_tls.clone(),
        )?;
        let coordinators =
            crate::decision_client::Coordinators::new(client, &config.coordinator_urls);
        Ok(Participant::from_parts(
            engine,
            wal,
            config,
            lock,
            coordinators,
        ))
    }
}
