//! State shared by the `Wal` handles and the writer thread: the request queue, the poison flag and
//! the counters behind `WalStats`.

use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::WalError;
use crate::ticket::Completer;
use crate::types::{Durability, RecordType};

#[derive(Debug)]
pub enum Request {
    Append {
        record_type: RecordType,
        payload: Vec<u8>,
        durability: Durability,
        completer: Completer,
    },
    Checkpoint {
        snapshot: Snapshot,
        completer: Completer,
    },
    /// A deferred checkpoint's snapshot, encoded and written to its temporary file (synced) off
    /// the writer thread, or why not: the writer already made everything up to `covered` durable
    /// and rolled; it now makes the file the log's start. `Ok` is the file's length.
    CheckpointEncoded {
        covered: u64,
        written: Result<u64, WalError>,
    },
}

/// A snapshot's bytes, or the means to make them later without holding anyone up.
pub enum Snapshot {
    Bytes(Vec<u8>),
    /// Run on its own thread once the writer reached this point of the log.
    Deferred(Box<dyn FnOnce() -> Result<Vec<u8>, String> + Send>),
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Snapshot::Bytes(bytes) => write!(f, "Snapshot::Bytes({} bytes)", bytes.len()),
            Snapshot::Deferred(_) => f.write_str("Snapshot::Deferred"),
        }
    }
}

impl Request {
    pub fn fail(self, error: WalError) {
        match self {
            Request::Append { completer, .. } | Request::Checkpoint { completer, .. } => {
                completer.complete(Err(error));
            }
            // Its ticket is held by the writer, which fails it with the same error.
            Request::CheckpointEncoded { .. } => {}
        }
    }
}

#[derive(Debug, Default)]
pub struct Queue {
    pub requests: Vec<Request>,
    /// Set by `Wal::close` (or dropping the last handle): the writer drains and exits.
    pub closed: bool,
    /// A request the writer takes at once is queued (anything but a background append): set
    /// with the one wake-up it costs, cleared when the writer takes the queue.
    pub urgent: bool,
    /// When the oldest queued background append came; the writer takes it by
    /// [`crate::WalOptions::background_delay`] after.
    pub background_since: Option<Instant>,
    /// The writer waits with no deadline: the next background append wakes it to set one.
    pub writer_parked: bool,
}

impl Queue {
    /// Queues `request`; true when the writer must be woken for it.
    pub fn push(&mut self, request: Request) -> bool {
        let background = matches!(
            request,
            Request::Append {
                durability: Durability::Background,
                ..
            }
        );
        self.requests.push(request);
        if background {
            self.background_since.get_or_insert_with(Instant::now);
            mem::take(&mut self.writer_parked)
        } else {
            !mem::replace(&mut self.urgent, true)
        }
    }

    /// Everything queued, for the writer.
    pub fn take(&mut self, into: &mut Vec<Request>) {
        mem::swap(into, &mut self.requests);
        self.urgent = false;
        self.background_since = None;
    }
}

impl Shared {
    /// Queues a request from the log's own helper threads (a deferred checkpoint's encoding).
    /// After close nobody will take it: the writer already failed that checkpoint's ticket.
    pub fn push_internal(&self, request: Request) {
        let mut queue = self.lock_queue();
        if queue.closed {
            return;
        }
        let wake = queue.push(request);
        drop(queue);
        if wake {
            self.wake.notify_one();
        }
    }
}

/// Counters behind [`crate::WalStats`].
#[derive(Debug, Default)]
pub struct Counters {
    pub records_appended: AtomicU64,
    pub fsyncs: AtomicU64,
    pub dir_fsyncs: AtomicU64,
    pub batches: AtomicU64,
    pub checkpoints: AtomicU64,
    pub bytes_written: AtomicU64,
    pub log_bytes_on_disk: AtomicU64,
    pub last_seq: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
pub struct Shared {
    pub queue: Mutex<Queue>,
    /// Signalled when the queue goes from empty to non-empty, and on close.
    pub wake: Condvar,
    poisoned: AtomicBool,
    poison_cause: Mutex<Option<String>>,
    pub counters: Counters,
}

impl Shared {
    pub fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Marks the log failed for good. Logged once, loudly.
    pub fn poison(&self, error: &WalError) {
        {
            let mut cause = self
                .poison_cause
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if cause.is_none() {
                *cause = Some(error.to_string());
            }
        }
        if !self.poisoned.swap(true, Ordering::AcqRel) {
            tracing::error!(
                error = %error,
                "write-ahead log failed; it is poisoned and accepts no more appends (fsync is never retried)"
            );
        }
    }

    pub fn poisoned_error(&self) -> WalError {
        let cause = self
            .poison_cause
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
            .unwrap_or_else(|| "an earlier write or fsync failed".to_string());
        WalError::Poisoned { cause }
    }
}
