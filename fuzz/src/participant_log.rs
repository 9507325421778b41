//! `participant_log`: a participant's start on a log of arbitrary records and snapshots.
//!
//! The input is a [`RecordLog`] as the reference key-value participant decodes it. Its real
//! start (`Participant::open_with_storage`, the log on the simulated disk) must either refuse
//! with a typed `OpenError` that says the log is bad (exit code 4), or start; a participant
//! that started must start again on what it left with the same state, and a checkpoint of
//! that state must restore to the same state.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use participant::kv::KvStore;
use participant::{OpenError, Participant, ParticipantConfig};
use serde_json::Value;
use wal::sim::SimStorage;

use crate::records::RecordLog;

fn data_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(crate::coordinator_http::scratch_dir).path()
}

fn config() -> ParticipantConfig {
    // Only the LOCK file is real; the log is on the simulated disk.
    let dir: PathBuf = data_dir().join("participant");
    ParticipantConfig::new(dir)
}

/// Opens, reads the state, and closes (dropping the participant releases its lock).
fn open(sim: &SimStorage) -> Result<Value, OpenError> {
    let participant =
        Participant::open_with_storage(config(), std::sync::Arc::new(sim.clone()), KvStore::new)?;
    let state = participant.with_engine(|engine| engine.snapshot().and_then(serde_json::to_value));
    participant.close();
    drop(participant);
    Ok(canonical(state.unwrap_or_else(|e| {
        panic!("a participant's snapshot does not serialize: {e}")
    })))
}

/// The snapshot with its lists in a fixed order (they come from maps whose order says nothing).
fn canonical(mut state: Value) -> Value {
    if let Value::Object(fields) = &mut state {
        for value in fields.values_mut() {
            if let Value::Array(items) = value {
                items.sort_by_key(|item| item.to_string());
            }
        }
    }
    state
}

pub fn run(input: &[u8]) {
    let log = RecordLog::read(input);
    let dir = config().data_dir.join("wal");
    let sim = log.load(&dir);
    let first = match open(&sim) {
        Ok(state) => state,
        Err(refused) => {
            assert_eq!(
                refused.exit_code(),
                4,
                "a bad log must be refused as a bad log, not as {refused}"
            );
            return;
        }
    };
    let second = open(&sim)
        .unwrap_or_else(|e| panic!("a log the participant opened does not open again: {e}"));
    assert_eq!(first, second, "a restart changed the participant's state");
    let checkpoint = RecordLog {
        snapshot: Some(first.to_string().into_bytes()),
        records: Vec::new(),
    };
    let restored = open(&checkpoint.load(&dir))
        .unwrap_or_else(|e| panic!("a checkpoint of a started participant does not open: {e}"));
    assert_eq!(
        first, restored,
        "a checkpoint does not restore the same state"
    );
}
