//! `coordinator_log`: the coordinator's start on a log of arbitrary records.
//!
//! The input is a [`RecordLog`]: a checkpoint snapshot and records as the coordinator would
//! decode them. The coordinator's real recovery (`runtime::recover_on`, on the simulated
//! disk) must either refuse with a typed `StartError` that blames the log (corrupt,
//! undecodable, epochs exhausted) or start; a coordinator that started
//! takes a checkpoint of what it rebuilt and must start again on what it left, as the same
//! coordinator with the next epoch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use coordinator::config::Config;
use coordinator::metrics::Metrics;
use coordinator::records::EpochRecord;
use coordinator::runtime::{StartError, recover_on};
use wal::sim::SimStorage;

use crate::records::RecordLog;

/// A data directory for this process (the outcome index is a real file; the log is not), on
/// a memory file system where there is one.
fn data_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(crate::coordinator_http::scratch_dir).path()
}

fn fresh_data_dir() -> PathBuf {
    let dir = data_dir().join("coordinator");
    // Only the outcome index lives on the real disk; each input starts without one.
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("harness setup: {}: {e}", dir.display());
    }
    dir
}

/// Starts a coordinator on `sim`, checkpoints, and stops it (dropping its runtime ends every
/// task it started). Returns who it started as.
fn start(sim: &SimStorage, config: &Config) -> Result<EpochRecord, StartError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("harness setup: a runtime: {e}"));
    let started = runtime.block_on(async {
        let core = recover_on(Arc::new(sim.clone()), config, Arc::new(Metrics::default())).await?;
        // A checkpoint of whatever was rebuilt must be readable by the next start.
        if let Err(e) = core.checkpoint().await {
            panic!("checkpoint after recovery failed: {e}");
        }
        Ok(core.identity().clone())
    });
    drop(runtime);
    started
}

pub fn run(input: &[u8]) {
    let log = RecordLog::read(input);
    let data = fresh_data_dir();
    let sim = log.load(&data.join("wal"));
    let mut config = Config::for_tests(data, BTreeMap::new());
    config.fsync = false;
    let first = match start(&sim, &config) {
        Ok(identity) => identity,
        // A refusal that says the log is bad is the right answer to a log that makes no
        // sense; anything else (the outcome index, the log's I/O) is the harness's fault.
        Err(
            StartError::Corrupt(_)
            | StartError::Undecodable { .. }
            | StartError::EpochExhausted { .. },
        ) => return,
        Err(other) => panic!("the start failed for a reason other than the log: {other}"),
    };
    match start(&sim, &config) {
        Ok(second) => {
            assert_eq!(
                second.coordinator_id, first.coordinator_id,
                "a restart changed the coordinator's identity"
            );
            assert_eq!(
                first.epoch.0.checked_add(1),
                Some(second.epoch.0),
                "a restart did not take the next epoch"
            );
        }
        Err(StartError::EpochExhausted { .. }) if first.epoch.0 == u64::MAX => {}
        Err(e) => panic!("a log the coordinator started on does not start again: {e}"),
    }
}
