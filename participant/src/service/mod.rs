//! The thin shell around the engine: it owns the log, executes the engine's commands in order
//! (log appends before the reply that depends on them) and exposes async calls for the HTTP
//! routes and for embedding services.
//!
//! - here: what a running participant is made of (the engine under its mutex, the log, the
//!   configuration, the metrics), its clock, and how a log failure stops it;
//! - `requests`: the protocol's calls (prepare, commit, abort, fenced writes, fence resets,
//!   ticks) and what each reply means to the caller;
//! - `outbox`: writes with their next intents, relays' reports and operators' actions on
//!   intents, and the durable reads of the outbox;
//! - `step`: one engine step against the log, which every call goes through.

mod outbox;
mod requests;
mod step;

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use protocol::kv::PreparedEntry;
use wal::{Wal, WalError};

use crate::config::ParticipantConfig;
use crate::engine::{Engine, Reply};
use crate::metrics::Metrics;
use crate::rejection::Rejection;
use crate::resource::Resource;

/// Why a protocol request got no vote or ack.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The log failed; the process takes no more writes and shuts down.
    #[error("the participant's log failed: {0}")]
    LogFailed(#[source] WalError),
    /// A bug: the engine answered a request with the wrong kind of reply.
    #[error("internal error: {0}")]
    Internal(&'static str),
}

pub(crate) struct State<R: Resource> {
    pub(crate) engine: Engine<R>,
    records_since_checkpoint: u64,
    /// The live state's size (prepared, tombstones, resource entries) at the last checkpoint.
    live_at_checkpoint: u64,
    /// Prepares queued for locks, by the waiter id their `Event::Prepare` carried.
    waiters: HashMap<u64, Pending>,
    next_waiter: u64,
}

/// Where a queued prepare's answer goes.
type Pending = tokio::sync::oneshot::Sender<Result<Reply, RequestError>>;

pub(crate) struct Inner<R: Resource> {
    pub(crate) state: Mutex<State<R>>,
    pub(crate) wal: Wal,
    pub(crate) config: ParticipantConfig,
    pub(crate) metrics: Metrics,
    pub(crate) fatal: AtomicBool,
    /// Set by `close`: appends that fail with `Closed` after it are expected, not a log failure.
    pub(crate) closing: AtomicBool,
    pub(crate) fatal_notify: tokio::sync::Notify,
    /// The last checkpoint's encoded size: the next one's buffer starts that large, instead of
    /// growing by doubling through megabytes (each step a copy and fresh pages to fault in).
    pub(crate) snapshot_bytes: Arc<AtomicUsize>,
    /// Whom in-doubt transactions are asked about (`decision_client`).
    pub(crate) coordinators: crate::decision_client::Coordinators,
    /// Held for the life of the process: the exclusive lock on `<data-dir>/LOCK`.
    pub(crate) _dir_lock: File,
}

/// A running participant: a resource plus everything that makes its votes promises.
/// Cheap to clone (all clones share one engine and one log).
pub struct Participant<R: Resource> {
    pub(crate) inner: Arc<Inner<R>>,
}

impl<R: Resource> Clone for Participant<R> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<R: Resource> std::fmt::Debug for Participant<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Participant")
            .field("data_dir", &self.inner.config.data_dir)
            .finish_non_exhaustive()
    }
}

/// The participant's clock, in Unix milliseconds: the wall clock read once, at first use,
/// then advanced by the monotonic clock. Retention (tombstones, fence answers) is measured on
/// it, so a wall clock stepped while the process runs cannot age an entry early and let a
/// late duplicate apply twice; a step while it is down counts as time passed
/// (docs/leases.md, "Retention").
pub(crate) fn now_ms() -> u64 {
    static START: std::sync::OnceLock<(u64, Instant)> = std::sync::OnceLock::new();
    let (base_ms, started) = START.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        (wall, Instant::now())
    });
    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    base_ms.saturating_add(elapsed)
}

impl<R: Resource> Participant<R> {
    pub(crate) fn from_parts(
        engine: Engine<R>,
        wal: Wal,
        config: ParticipantConfig,
        dir_lock: File,
        coordinators: crate::decision_client::Coordinators,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    engine,
                    records_since_checkpoint: 0,
                    live_at_checkpoint: 0,
                    waiters: HashMap::new(),
                    next_waiter: 0,
                }),
                wal,
                config,
                metrics: Metrics::default(),
                fatal: AtomicBool::new(false),
                closing: AtomicBool::new(false),
                fatal_notify: tokio::sync::Notify::new(),
                snapshot_bytes: Arc::new(AtomicUsize::new(0)),
                coordinators,
                _dir_lock: dir_lock,
            }),
        }
    }

    pub fn config(&self) -> &ParticipantConfig {
        &self.inner.config
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State<R>> {
        // A panic while holding the lock leaves the engine as it was at the last complete
        // step (steps do not panic by design); keep serving rather than poisoning everything.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reads the committed state of the resource (prepared data is never visible here).
    pub fn read<T>(&self, f: impl FnOnce(&R) -> T) -> T {
        f(self.lock().engine.resource())
    }

    /// Runs `f` on the engine (for tests, metrics and operators).
    pub fn with_engine<T>(&self, f: impl FnOnce(&Engine<R>) -> T) -> T {
        f(&self.lock().engine)
    }

    /// In-doubt transactions.
    pub fn prepared_list(&self) -> Vec<PreparedEntry> {
        self.lock().engine.prepared_list()
    }

    /// Whether the log failed (the process must stop taking writes).
    pub fn is_failed(&self) -> bool {
        self.inner.fatal.load(Ordering::SeqCst) || self.inner.wal.is_poisoned()
    }

    /// Resolves when the log has failed; the service should shut down (exit code 1).
    pub async fn failed(&self) {
        loop {
            let notified = self.inner.fatal_notify.notified();
            if self.is_failed() {
                return;
            }
            notified.await;
        }
    }

    /// Blocking: makes everything submitted durable and closes the log (graceful shutdown).
    pub fn close(&self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        self.inner.wal.close();
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The log's counters (records, fsyncs, bytes on disk).
    pub fn wal_stats(&self) -> wal::WalStats {
        self.inner.wal.stats()
    }

    pub(crate) fn wal(&self) -> &Wal {
        &self.inner.wal
    }

    /// Marks the log failed: every later write is refused and the service shuts down.
    pub(crate) fn fail(&self, error: &WalError) {
        if self.inner.closing.load(Ordering::SeqCst) && matches!(error, WalError::Closed) {
            tracing::debug!("an append raced the shutdown and was not written");
            return;
        }
        if !self.inner.fatal.swap(true, Ordering::SeqCst) {
            tracing::error!(%error, "the log failed: refusing all writes and shutting down");
        }
        self.inner.fatal_notify.notify_waiters();
    }
}
