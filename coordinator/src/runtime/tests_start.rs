//! Starts on logs the fuzzer (fuzz/, `coordinator_log`) found: each must refuse with a typed
//! `StartError` or start, never panic. The inputs are inlined, minimized, as the records they
//! decode to.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use protocol::{CoordinatorId, Epoch, Incarnation};
use wal::RecordType;
use wal::sim::SimStorage;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::records::{EpochRecord, LogRecord};
use crate::runtime::{StartError, recover_on};

/// A log of one segment holding `records` from seq 1 on.
fn log_of(dir: &Path, records: &[LogRecord]) -> Arc<SimStorage> {
    let mut segment = Vec::new();
    for (index, record) in records.iter().enumerate() {
        wal::encode_frame(
            &mut segment,
            index as u64 + 1,
            RecordType(record.record_type()),
            &record.encode(),
        );
    }
    let sim = Arc::new(SimStorage::new());
    sim.set_contents(&dir.join("wal").join(wal::format::segment_name(1)), segment);
    sim
}

fn epoch_record(epoch: u64) -> LogRecord {
    LogRecord::Epoch(EpochRecord {
        coordinator_id: CoordinatorId::new("c-1").unwrap(),
        epoch: Epoch(epoch),
        incarnation: Incarnation(7),
    })
}

/// Found as `{"coordinator_id":"c-1","epoch":18446744073709551615,"incarnation":...}`: the
/// start computed the next epoch with a panicking `+ 1`.
#[tokio::test]
async fn a_log_at_the_highest_epoch_is_refused_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::for_tests(dir.path().to_path_buf(), BTreeMap::new());
    let sim = log_of(dir.path(), &[epoch_record(u64::MAX)]);
    match recover_on(sim, &config, Arc::new(Metrics::default())).await {
        Err(StartError::EpochExhausted { epoch, .. }) => assert_eq!(epoch, Epoch(u64::MAX)),
        other => panic!("expected EpochExhausted, got {:?}", other.map(|_| ())),
    }

    // One below still starts, at the highest epoch, and then the log is exhausted.
    let dir = tempfile::tempdir().unwrap();
    let config = Config::for_tests(dir.path().to_path_buf(), BTreeMap::new());
    let sim = log_of(dir.path(), &[epoch_record(u64::MAX - 1)]);
    let core = recover_on(sim.clone(), &config, Arc::new(Metrics::default()))
        .await
        .unwrap();
    assert_eq!(core.identity().epoch, Epoch(u64::MAX));
}
