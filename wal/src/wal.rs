//! The `Wal` handle: open (recovery), submit, append, checkpoint, stats, close.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::WalError;
use crate::frame::RECORD_PAYLOAD_BYTES_MAX;
use crate::preallocated::PreallocatedStorage;
use crate::recovery;
use crate::shared::{Request, Shared, Snapshot};
use crate::snapshot::SNAPSHOT_BYTES_MAX;
use crate::storage::Storage;
use crate::ticket::AppendTicket;
use crate::types::{Durability, RecordType, Recovery, WalOptions};
use crate::writer::Writer;

/// Counters for `/metrics` and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct WalStats {
    /// Records written by this process (not counting recovered ones).
    pub records_appended: u64,
    /// fdatasync/fsync calls on segment and snapshot files by the writer. Group commit keeps this
    /// far below `records_appended`.
    pub fsyncs: u64,
    /// fsync calls on the log directory by the writer (segment roll, checkpoint).
    pub dir_fsyncs: u64,
    /// Batches the writer took off the queue.
    pub batches: u64,
    pub checkpoints: u64,
    pub bytes_written: u64,
    /// Bytes of live segments and the current snapshot.
    pub log_bytes_on_disk: u64,
    /// Highest sequence number written (or recovered).
    pub last_seq: u64,
    pub poisoned: bool,
}

/// A handle to an open log. Cheap to clone; `Send + Sync`. The log closes (draining what was
/// submitted) when the last handle is dropped or [`Wal::close`] is called.
#[derive(Clone)]
pub struct Wal {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    dir: PathBuf,
}

impl fmt::Debug for Wal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.inner.dir)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Wal {
    /// Blocking. Creates the directory if absent, fsyncs files and directory, verifies every
    /// record, truncates a torn tail (keeping a `.broken` copy), finishes an interrupted
    /// checkpoint, and refuses corruption with [`WalError::Corrupt`]. Segments are zero-filled
    /// ahead of their appends ([`PreallocatedStorage`]).
    pub fn open(dir: impl AsRef<Path>, options: WalOptions) -> Result<(Wal, Recovery), WalError> {
        Self::open_with_storage(Arc::new(PreallocatedStorage::default()), dir, options)
    }

    /// [`Wal::open`] on any storage (the simulated one in crash tests).
    pub fn open_with_storage(
        storage: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        options: WalOptions,
    ) -> Result<(Wal, Recovery), WalError> {
        let dir = dir.as_ref().to_path_buf();
        let (recovery, layout) = recovery::recover(storage.as_ref(), &dir)?;
        let shared = Arc::new(Shared::default());
        let writer = Writer::new(storage, dir.clone(), options, shared.clone(), layout)?;
        let thread = std::thread::Builder::new()
            .name("wal-writer".to_string())
            .spawn(move || writer.run())
            .map_err(|e| WalError::io("spawn writer thread for", &dir, e))?;
        let wal = Wal {
            inner: Arc::new(Inner {
                shared,
                writer: Mutex::new(Some(thread)),
                dir,
            }),
        };
        Ok((wal, recovery))
    }

    /// Non-blocking enqueue; never awaits, so it is safe under a `std::sync::Mutex` (which is how
    /// an owner keeps its in-memory state and the log in the same order). Enqueue order is
    /// sequence order is log order.
    pub fn submit(
        &self,
        record_type: RecordType,
        payload: Vec<u8>,
        durability: Durability,
    ) -> AppendTicket {
        if !record_type.is_owner_type() {
            return AppendTicket::ready(Err(WalError::InvalidRecordType(record_type.0)));
        }
        if payload.len() > RECORD_PAYLOAD_BYTES_MAX {
            return AppendTicket::ready(Err(WalError::RecordTooLarge {
                len: payload.len(),
                max: RECORD_PAYLOAD_BYTES_MAX,
            }));
        }
        self.enqueue(|completer| Request::Append {
            record_type,
            payload,
            durability,
            completer,
        })
    }

    /// [`Wal::submit`] and wait: resolves to the record's sequence number.
    pub async fn append(
        &self,
        record_type: RecordType,
        payload: Vec<u8>,
        durability: Durability,
    ) -> Result<u64, WalError> {
        self.submit(record_type, payload, durability).await
    }

    /// Ordered with `submit`: `snapshot` must reflect every record submitted before this call.
    /// Resolves (to the last sequence number the snapshot covers) once the snapshot is durable;
    /// recovery then returns it plus the records submitted after it. Whole older segments go.
    pub fn checkpoint(&self, snapshot: Vec<u8>) -> AppendTicket {
        if snapshot.len() > SNAPSHOT_BYTES_MAX {
            return AppendTicket::ready(Err(WalError::SnapshotTooLarge {
                len: snapshot.len(),
                max: SNAPSHOT_BYTES_MAX,
            }));
        }
        self.enqueue(|completer| Request::Checkpoint {
            snapshot: Snapshot::Bytes(snapshot),
            completer,
        })
    }

    /// Like [`Wal::checkpoint`], ordered with `submit` in the same way, but the snapshot is
    /// encoded by `encode` on a thread of its own once the writer has made everything before
    /// this point durable and started a new segment. Appends go on meanwhile (into the new
    /// segment), so neither the owner's lock nor the log waits for the encoding: the owner
    /// only has to copy its state into the closure. One checkpoint at a time: another one
    /// asked for meanwhile fails with [`WalError::CheckpointInProgress`]. An encoding error or
    /// an oversized snapshot fails this ticket and leaves the log healthy.
    pub fn checkpoint_with(
        &self,
        encode: impl FnOnce() -> Result<Vec<u8>, String> + Send + 'static,
    ) -> AppendTicket {
        self.enqueue(|completer| Request::Checkpoint {
            snapshot: Snapshot::Deferred(Box::new(encode)),
            completer,
        })
    }

    fn enqueue(&self, request: impl FnOnce(crate::ticket::Completer) -> Request) -> AppendTicket {
        let shared = &self.inner.shared;
        if shared.is_poisoned() {
            return AppendTicket::ready(Err(shared.poisoned_error()));
        }
        let (ticket, completer) = AppendTicket::pair();
        let mut queue = shared.lock_queue();
        if queue.closed {
            return AppendTicket::ready(Err(WalError::Closed));
        }
        // The writer sleeps until something urgent is queued or a deadline passes.
        let wake = queue.push(request(completer));
        drop(queue);
        if wake {
            shared.wake.notify_one();
        }
        ticket
    }

    pub fn stats(&self) -> WalStats {
        let shared = &self.inner.shared;
        let c = &shared.counters;
        WalStats {
            records_appended: c.records_appended.load(Ordering::Relaxed),
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            dir_fsyncs: c.dir_fsyncs.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            log_bytes_on_disk: c.log_bytes_on_disk.load(Ordering::Relaxed),
            last_seq: c.last_seq.load(Ordering::Relaxed),
            poisoned: shared.is_poisoned(),
        }
    }

    /// True once a write or fsync failed: every later append errors.
    pub fn is_poisoned(&self) -> bool {
        self.inner.shared.is_poisoned()
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Blocking. Writes (and resolves) everything already submitted, then stops the writer;
    /// later submits fail with [`WalError::Closed`]. Dropping the last handle does the same.
    pub fn close(&self) {
        self.inner.close();
    }
}

impl Inner {
    fn close(&self) {
        self.shared.lock_queue().closed = true;
        self.shared.wake.notify_all();
        let thread = self
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            self.shared.poison(&WalError::Poisoned {
                cause: "the writer thread panicked".to_string(),
            });
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_tickets_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Wal>();
        send::<AppendTicket>();
        send_sync::<WalError>();
    }
}
