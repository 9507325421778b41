//! The archiver: takes the outcomes the engine stages (`Command::Archive`), writes them to the
//! index in batches (one durable redb transaction each), and only then tells the engine
//! (`Event::Archived`), which drops them from staging. A failed write keeps the batch: the
//! outcomes stay staged (and answered), and the write is retried with a growing pause; the
//! coordinator goes on, since the log, not the index, is the source of truth.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{Core, now_ms};
use crate::records::Retained;

/// The longest an outcome waits in staging for company before its batch is written: at one
/// client a write (a redb commit, with its fsyncs on the log's disk) per second instead of one
/// per transaction or per tick. The log, not the index, makes an outcome durable, so the wait
/// costs no safety; staging holds at most this long's outcomes, or [`ARCHIVE_BATCH_MAX`].
pub const ARCHIVE_BATCH_WAIT: Duration = Duration::from_secs(1);
/// Most outcomes per write transaction; a batch this full is written without waiting longer.
pub const ARCHIVE_BATCH_MAX: usize = 1_000;
/// How often the archiver looks at what came while it gathers. Waiting in `recv` instead woke
/// this task (often a parked worker with it) and re-armed its timer for every ended
/// transaction: a cost per transaction where one per tick will do (issue 28).
const GATHER_TICK: Duration = Duration::from_millis(50);
/// The longest pause between retries of a failed write.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Runs until the engine's side of the channel is gone (the core dropped). It holds the core
/// weakly: the core owns the channel's sender, and a strong reference would keep both (and the
/// index file, which one process may open once) alive for ever.
pub async fn archiver(core: Weak<Core>, mut staged: UnboundedReceiver<Retained>) {
    let mut pending: Vec<Retained> = Vec::new();
    let mut failures: u32 = 0;
    let mut open = true;
    while open || !pending.is_empty() {
        let write_by = if pending.is_empty() {
            match staged.recv().await {
                Some(retained) => pending.push(retained),
                None => return,
            }
            Instant::now() + ARCHIVE_BATCH_WAIT
        } else {
            // A batch whose write failed goes again as soon as its pause is over.
            Instant::now()
        };
        while open && pending.len() < ARCHIVE_BATCH_MAX && Instant::now() < write_by {
            tokio::time::sleep_until((Instant::now() + GATHER_TICK).min(write_by)).await;
            open = take_staged(&mut staged, &mut pending);
        }
        open = open && take_staged(&mut staged, &mut pending);
        let Some(core) = core.upgrade() else {
            return;
        };
        let take = pending.len().min(ARCHIVE_BATCH_MAX);
        let batch: Vec<Retained> = pending.drain(..take).collect();
        let store = Arc::clone(&core.outcomes);
        let retention_ms = core.config().retention_ms;
        // In a group the followers' index copies take the batch too, before staging lets go
        // of it; the gate keeps a follower's index backup from overlapping the batch.
        let group = core.group.clone();
        let _gate = match &group {
            Some(mirror) => Some(mirror.archive_gate().await),
            None => None,
        };
        let written = tokio::task::spawn_blocking(move || {
            let now = now_ms();
            let result = store.archive(&batch, now, retention_ms);
            (batch, result, now)
        })
        .await;
        let (batch, result, archived_at_ms) = match written {
            Ok(done) => done,
            Err(join) => {
                // The batch went with the panicked task; the outcomes are still staged, and a
                // restart archives everything staged again.
                error!(error = %join, "the outcome index write task failed");
                core.metrics()
                    .archive_failures
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let result = match (result, &group) {
            (Ok(report), Some(mirror)) => mirror
                .replicate_outcomes(&batch, archived_at_ms)
                .await
                .map(|()| report)
                .map_err(|e| format!("the followers' index copies did not take the batch: {e}")),
            (Ok(report), None) => Ok(report),
            (Err(e), _) => Err(e.to_string()),
        };
        drop(_gate);
        match result {
            Ok(report) => {
                if failures > 0 {
                    info!(failures, "outcome index writes work again; staging drains");
                }
                failures = 0;
                let metrics = core.metrics();
                metrics
                    .archived
                    .fetch_add(report.written, Ordering::Relaxed);
                if report.evicted_early > 0 {
                    warn!(
                        evicted = report.evicted_early,
                        "the outcome index is over --retained-disk-max-bytes: evicted outcomes \
                           still inside the retention window (see the effective window metric)"
                    );
                }
                // Durable: now, and only now, they may leave staging.
                core.archived(
                    batch
                        .into_iter()
                        .map(|r| (r.decision.txid, r.decision.attempt.gtid))
                        .collect(),
                );
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                core.metrics()
                    .archive_failures
                    .fetch_add(1, Ordering::Relaxed);
                error!(error = %e, outcomes = batch.len(), failures,
                       "cannot write outcomes to the index; they stay staged (and answered) \
                        and the write is retried");
                // Put them back in front, in order, and pause before the retry.
                let mut again = batch;
                again.append(&mut pending);
                pending = again;
                let pause = Duration::from_millis(100u64 << failures.min(6)).min(RETRY_MAX);
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Moves what is staged into `pending`, up to a batch; false once the engine's side is gone.
fn take_staged(staged: &mut UnboundedReceiver<Retained>, pending: &mut Vec<Retained>) -> bool {
    while pending.len() < ARCHIVE_BATCH_MAX {
        match staged.try_recv() {
            Ok(retained) => pending.push(retained),
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Disconnected) => return false,
        }
    }
    true
}
