//! The disk's own durable-write latency, measured in the directory the bench's logs live in: a
//! raw loop of `write(273 B) + fdatasync`, the size of a typical log record. Latency at low
//! concurrency is a few fsyncs in a row (a participant's prepare, the coordinator's decision),
//! so this is the figure to read it against; it varies several-fold between days here. The
//! same loop through the log's own preallocated segment file (`wal::PreallocatedStorage`, the
//! record written over zeros filled ahead) gives the figure the logs actually pay.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::latency::quantile;

const RECORD_BYTES: usize = 273;

/// Median of `rounds` write+fdatasync pairs on a new file in `dir` (removed afterwards).
pub fn fsync_p50(dir: &Path, rounds: usize) -> std::io::Result<Duration> {
    probe(&wal::FileStorage, &dir.join("fsync-probe"), rounds)
}

/// [`fsync_p50`] through a log segment zero-filled ahead of its appends, as the logs write:
/// an fdatasync that neither grows the file nor allocates blocks (most of the time).
pub fn preallocated_fsync_p50(dir: &Path, rounds: usize) -> std::io::Result<Duration> {
    probe(
        &wal::PreallocatedStorage::default(),
        &dir.join(wal::format::segment_name(1)),
        rounds,
    )
}

fn probe(storage: &dyn wal::Storage, path: &Path, rounds: usize) -> std::io::Result<Duration> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A probe a killed bench left behind: the storages create files that must be new.
    let _ = std::fs::remove_file(path);
    let mut file = storage.create(path)?;
    let record = [0x5au8; RECORD_BYTES];
    let mut latencies = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        file.append(&record)?;
        let started = Instant::now();
        file.sync_data()?;
        latencies.push(started.elapsed());
    }
    drop(file);
    std::fs::remove_file(path)?;
    latencies.sort();
    Ok(quantile(&latencies, 0.5).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let p50 = fsync_p50(dir.path(), 5).unwrap();
        assert!(p50 > Duration::ZERO);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let p50 = preallocated_fsync_p50(dir.path(), 5).unwrap();
        assert!(p50 > Duration::ZERO);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
