//! Recovery (design 4.2): open the log (the WAL verifies every record, cuts a torn tail and
//! refuses corruption), rebuild the table, persist the next epoch before anything is sent,
//! then abort what was begun and never decided and resend every unacknowledged decision.
//! Every step is idempotent, so a crash in the middle is recovered by the next start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use protocol::{CoordinatorId, Epoch, Incarnation};
use wal::{
    Durability, PreallocatedStorage, RecordType, Storage, SyncPolicy, Wal, WalError, WalOptions,
};

use super::archiver::archiver;
use crate::config::Config;
use crate::engine::{Engine, EngineConfig, Event};
use crate::http_client::{BadBaseUrl, Endpoint};
use crate::leases::{LeaseClock, LeaseEngine, Leases};
use crate::metrics::Metrics;
use crate::outcomes::OutcomeStore;
use crate::records::{DecodeError, EpochRecord, LogRecord, Snapshot};
use crate::runtime::{Core, SagaShell, now_ms};
use crate::saga::engine::{SagaConfig, SagaEngine, SagaEvent};

/// Why the coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The log is corrupt: starting would make presumed abort unsafe.
    #[error("refusing to start: {0}")]
    Corrupt(WalError),
    #[error("refusing to start: log in {dir} holds a record that does not decode: {source}")]
    Undecodable { dir: String, source: DecodeError },
    #[error("cannot open or write the log: {0}")]
    Log(WalError),
    /// The log's last epoch is the highest there is: no next start can be told apart from it.
    #[error(
        "refusing to start: the log in {dir} holds epoch {epoch}, the highest there is, so no \
         higher epoch is left for this start"
    )]
    EpochExhausted { dir: String, epoch: Epoch },
    #[error("cannot make a coordinator id: {0}")]
    Identity(protocol::IdError),
    #[error("participant URL: {0}")]
    ParticipantUrl(BadBaseUrl),
    #[error("log open task failed: {0}")]
    Join(String),
    /// The outcome index cannot be opened: starting without it would forget idempotency
    /// records (the remedy is in docs/operations.md, "The outcome index").
    #[error("refusing to start: {0}")]
    Outcomes(crate::outcomes::OutcomeError),
}

/// A fresh identity for a new data directory: a wiped directory is a new coordinator.
/// A random incarnation for this start, never one the log already holds. Random rather than
/// counted: a run started on a restored copy of the log must not repeat the incarnation of the
/// run whose log was lost, and a counter in that log would repeat it.
fn new_incarnation(engine: &Engine) -> Incarnation {
    loop {
        let candidate = Incarnation(fastrand::u64(..) ^ std::process::id() as u64);
        if !engine.runs().any(|span| span.incarnation == candidate) {
            return candidate;
        }
    }
}

fn new_coordinator_id() -> Result<CoordinatorId, StartError> {
    CoordinatorId::new(format!("c-{:016x}", fastrand::u64(..))).map_err(StartError::Identity)
}

/// Opens the log under `config.data_dir` and recovers. The returned core is ready: its epoch
/// is durable, recovery's aborts are submitted and its resends are under way.
pub async fn recover(config: &Config, metrics: Arc<Metrics>) -> Result<Arc<Core>, StartError> {
    let storage = PreallocatedStorage::with_fill_ahead(config.wal_fill_ahead_bytes);
    recover_on(Arc::new(storage), config, metrics).await
}

/// [`recover`] on any storage (the WAL's simulated, fault-injecting one in tests).
pub async fn recover_on(
    storage: Arc<dyn Storage>,
    config: &Config,
    metrics: Arc<Metrics>,
) -> Result<Arc<Core>, StartError> {
    recover_with(storage, config, metrics, None).await
}

/// A leader of a coordinator group taking over (`ha`): the term it won and its replication.
#[derive(Debug, Clone)]
pub struct GroupStart {
    pub term: u64,
    pub mirror: crate::ha::mirror::GroupMirror,
}

/// [`recover_on`], for a group's new leader when `group` is given: its epoch is at least the
/// term it won in etcd (`ha::rules::epoch_for_term`), and the outcome index's batches are
/// replicated to the followers.
pub async fn recover_with(
    storage: Arc<dyn Storage>,
    config: &Config,
    metrics: Arc<Metrics>,
    group: Option<GroupStart>,
) -> Result<Arc<Core>, StartError> {
    let dir = config.data_dir.join("wal");
    let options = WalOptions {
        sync: if config.fsync {
            SyncPolicy::Fsync
        } else {
            SyncPolicy::Never
        },
        ..WalOptions::default()
    };
    let open_dir = dir.clone();
    let opened =
        tokio::task::spawn_blocking(move || Wal::open_with_storage(storage, &open_dir, options))
            .await
            .map_err(|e| StartError::Join(e.to_string()))?;
    let (wal, recovery) = match opened {
        Ok(opened) => opened,
        Err(e @ WalError::Corrupt { .. }) => return Err(StartError::Corrupt(e)),
        Err(e) => return Err(StartError::Log(e)),
    };
    if let Some(torn) = &recovery.torn_tail {
        warn!(file = %torn.file.display(), offset = torn.offset, bytes = torn.bytes,
              reason = %torn.reason, "cut a torn write off the end of the log (a crash mid-append)");
    }
    let index_path = config.data_dir.join(crate::outcomes::FILE_NAME);
    let max_bytes = config.retained_disk_max_bytes;
    let outcomes = tokio::task::spawn_blocking(move || OutcomeStore::open(&index_path, max_bytes))
        .await
        .map_err(|e| StartError::Join(e.to_string()))?
        .map_err(StartError::Outcomes)?;
    let undecodable = |source| StartError::Undecodable {
        dir: dir.display().to_string(),
        source,
    };
    let mut snapshot = recovery
        .snapshot
        .as_deref()
        .map(Snapshot::decode)
        .transpose()
        .map_err(undecodable)?;
    let mut records = Vec::with_capacity(recovery.records.len());
    let mut lease_records = Vec::new();
    for record in &recovery.records {
        match LogRecord::decode(record.seq, record.record_type.0, &record.payload)
            .map_err(undecodable)?
        {
            LogRecord::Lease(lease) => lease_records.push(lease),
            other => records.push(other),
        }
    }
    let sagas = SagaEngine::replay(
        SagaConfig {
            retry_base_ms: config.retry_base_ms,
            retry_max_ms: config.retry_max_ms,
            step_timeout_ms: config.delivery_timeout_ms,
        },
        snapshot
            .as_mut()
            .map(|s| std::mem::take(&mut s.sagas))
            .unwrap_or_default(),
        &records,
    );
    let lease_snapshot = snapshot
        .as_mut()
        .map(|s| std::mem::take(&mut s.leases))
        .unwrap_or_default();
    // The restart rule's "now": every lease that may still be held holds a full TTL from here.
    let lease_clock = LeaseClock::starting_at(now_ms());
    let lease_engine = LeaseEngine::recover(lease_snapshot, lease_records, lease_clock.now_ms());
    let replayed = Engine::replay(
        EngineConfig {
            retry_base_ms: config.retry_base_ms,
            retry_max_ms: config.retry_max_ms,
            retained_max: config.retained_max,
            bounds: config.bounds(),
        },
        snapshot,
        records,
    );
    let incarnation = new_incarnation(&replayed.engine);
    let mut identity = match replayed.identity {
        Some(last) => EpochRecord {
            epoch: last
                .epoch
                .checked_next()
                .ok_or_else(|| StartError::EpochExhausted {
                    dir: dir.display().to_string(),
                    epoch: last.epoch,
                })?,
            coordinator_id: last.coordinator_id,
            incarnation,
        },
        None => EpochRecord {
            coordinator_id: new_coordinator_id()?,
            epoch: Epoch(1),
            incarnation,
        },
    };
    if let Some(group) = &group {
        identity.epoch = Epoch(crate::ha::rules::epoch_for_term(
            identity.epoch.0,
            group.term,
        ));
    }
    // The new epoch is durable before any message carries it: a participant that saw it must
    // never see a lower one from us again.
    let epoch_record = LogRecord::Epoch(identity.clone());
    wal.append(
        RecordType(epoch_record.record_type()),
        epoch_record.encode(),
        Durability::Forced,
    )
    .await
    .map_err(StartError::Log)?;
    let gauges = replayed.engine.gauges();
    metrics.recovered_transactions.store(
        gauges.preparing + gauges.committing + gauges.aborting,
        Ordering::Relaxed,
    );
    info!(coordinator_id = %identity.coordinator_id, epoch = %identity.epoch,
          preparing = gauges.preparing, committing = gauges.committing, aborting = gauges.aborting,
          retained = gauges.retained, "log replayed");
    let participants = config
        .participants
        .iter()
        .map(|(name, url)| {
            let mut endpoint = Endpoint::new(url)?.with_keys(config.keys.clone());
            if let Some(tls) = &config.tls.client {
                endpoint = endpoint.with_tls(Arc::clone(tls));
            }
            Ok((name.clone(), Arc::new(endpoint)))
        })
        .collect::<Result<_, BadBaseUrl>>()
        .map_err(StartError::ParticipantUrl)?;
    let (archive, staged) = tokio::sync::mpsc::unbounded_channel();
    let (decisions, submitted_decisions) = tokio::sync::mpsc::unbounded_channel();
    let core = Arc::new(Core {
        engine: Mutex::new(replayed.engine),
        waiters: Mutex::new(HashMap::new()),
        next_waiter: AtomicU64::new(1),
        wal,
        epoch: AtomicU64::new(identity.epoch.0),
        identity,
        participants,
        config: config.clone(),
        metrics,
        recovering: AtomicBool::new(true),
        behind: AtomicBool::new(false),
        live_transactions: std::sync::atomic::AtomicUsize::new(0),
        outcomes: Arc::new(outcomes),
        archive,
        archive_generation: AtomicU64::new(0),
        operator_lock: tokio::sync::Mutex::new(()),
        sagas: SagaShell::new(sagas),
        leases: Leases::new(lease_engine, lease_clock),
        group: group.map(|g| g.mirror),
        lanes: Default::default(),
        deadlines: Default::default(),
        decisions,
    });
    if let Some(mirror) = &core.group {
        mirror.set_outcomes(Arc::clone(&core.outcomes), config.retention_ms);
        mirror.set_coordinator_id(core.identity.coordinator_id.as_str());
    }
    // Before `RecoveryDone`, which stages everything replayed for archiving again. It ends
    // when the core is dropped.
    tokio::spawn(archiver(Arc::downgrade(&core), staged));
    tokio::spawn(super::durable::decision_waiter(
        Arc::downgrade(&core),
        submitted_decisions,
    ));
    tokio::spawn(super::deadlines::deadline_timer(Arc::downgrade(&core)));
    if let Some(behind) = core.lock_engine().behind() {
        core.behind.store(true, Ordering::Relaxed);
        core.metrics.log_behind.store(1, Ordering::Relaxed);
        tracing::error!(evidence = %behind.evidence, at_ms = behind.at_ms,
            "LOG BEHIND (recorded in the log): participants proved this log is behind what they \
             saw; refusing new transactions; see docs/operations.md, \"Restores and rolled-back \
             logs\"");
    }
    core.apply(Event::RecoveryDone {
        now_ms: now_ms(),
        identity: core.identity.clone(),
    });
    core.recovering.store(false, Ordering::Relaxed);
    // Whether a run this log does not hold passed this one (a restore) shows in the answers.
    core.probe_epochs();
    // Every live saga resumes where its log says: unknown steps are asked about first.
    core.apply_saga(SagaEvent::Recovered {
        now_ms: core.sagas.now_ms(),
    });
    Ok(core)
}
