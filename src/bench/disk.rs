//! The disk's own durable-write latency, measured in the directory the bench's logs live in: a
//! raw loop of `write(273 B) + fdatasync`, the size of a typical log record. Latency at low
//! concurrency is a few fsyncs in a row (a participant's prepare, the coordinator's decision),
//! so this is the figure to read it against; it varies several-fold between days here.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::latency::quantile;

const RECORD_BYTES: usize = 273;

/// Median of `rounds` write+fdatasync pairs on a new file in `dir` (removed afterwards).
pub fn fsync_p50(dir: &Path, rounds: usize) -> std::io::Result<Duration> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path)?;
    let record = [0x5au8; RECORD_BYTES];
    let mut latencies = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        file.write_all(&record)?;
        let started = Instant::now();
        file.sync_data()?;
        latencies.push(started.elapsed());
    }
    drop(file);
    std::fs::remove_file(&path)?;
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
    }
}
