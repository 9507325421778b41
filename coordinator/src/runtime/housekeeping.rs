//! Background work: periodic checkpoints (so the log's size follows live transactions, not
//! history), expiring retained outcomes, and reporting a poisoned log loudly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::{error, info};

use crate::engine::Event;
use crate::runtime::{Core, now_ms};

impl Core {
    /// Expires old outcomes, copies the table and checkpoints the log with it. The copy is
    /// taken and the checkpoint submitted under the engine lock, so it reflects exactly the
    /// records submitted before it; the encoding happens off the lock, on the log's snapshot
    /// thread, while transactions carry on.
    /// Returns the last sequence number covered and the snapshot's size.
    pub async fn checkpoint(&self) -> Result<(u64, u64), wal::WalError> {
        let bytes = Arc::new(AtomicU64::new(0));
        let ticket = {
            let mut engine = self.lock_engine();
            engine.step(Event::ExpireRetained {
                now_ms: now_ms(),
                retention_ms: self.config.retention_ms,
            });
            let snapshot = engine.snapshot(self.identity.clone());
            let size = Arc::clone(&bytes);
            self.wal.checkpoint_with(move || {
                let encoded = snapshot.encode();
                size.store(encoded.len() as u64, Ordering::Relaxed);
                Ok(encoded)
            })
        };
        let seq = ticket.wait().await?;
        Ok((seq, bytes.load(Ordering::Relaxed)))
    }
}

/// Runs until the process stops.
pub async fn housekeeping(core: Arc<Core>) {
    let interval = Duration::from_millis(core.config.checkpoint_interval_ms);
    let mut tick = tokio::time::interval(interval.min(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_checkpoint = Instant::now();
    let mut appended_at_checkpoint = core.wal.stats().records_appended;
    let mut written_at_checkpoint = core.wal.stats().bytes_written;
    let mut snapshot_bytes: u64 = 0;
    let mut reported = false;
    loop {
        tick.tick().await;
        if core.wal.is_poisoned() {
            if !reported {
                error!(
                    "LOG FAILED: the write-ahead log is poisoned (a write or fsync failed); \
                     new transactions get 503 log_failed, /readyz is 503; restart the \
                     coordinator once the disk is healthy (recovery resends every decision)"
                );
                reported = true;
            }
            continue;
        }
        if last_checkpoint.elapsed() < interval {
            continue;
        }
        last_checkpoint = Instant::now();
        let stats = core.wal.stats();
        // Nothing new, or less new log than the last snapshot weighed: a checkpoint costs about
        // its snapshot's size, so checkpointing only once the log it replaces is comparable
        // keeps its cost a fixed fraction of logging, however many outcomes are retained.
        if stats.records_appended == appended_at_checkpoint
            || stats.bytes_written.saturating_sub(written_at_checkpoint) < snapshot_bytes / 2
        {
            continue;
        }
        match core.checkpoint().await {
            Ok((seq, bytes)) => {
                let stats = core.wal.stats();
                appended_at_checkpoint = stats.records_appended;
                written_at_checkpoint = stats.bytes_written;
                snapshot_bytes = bytes;
                info!(
                    snapshot_bytes = bytes,
                    seq,
                    log_bytes = core.wal.stats().log_bytes_on_disk,
                    "checkpoint"
                );
            }
            Err(e) => error!(error = %e, "checkpoint failed"),
        }
    }
}
