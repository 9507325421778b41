//! The thin shell around the engine: it owns the log, executes the engine's commands in order
//! (log appends before the reply that depends on them) and exposes async calls for the HTTP
//! routes and for embedding services.
//!
//! The engine and the log are kept in the same order by submitting every record while the
//! engine's mutex is held (`Wal::submit` never blocks); waiting for durability happens after
//! the mutex is released, so concurrent requests share one fsync (group commit).
//!
//! A prepare that queues for locks leaves a oneshot sender in `State::waiters`, registered in
//! the very step that queued it (so whichever later step answers it finds it), and awaits it
//! without the mutex. The later step's `Deliver` is sent by a task of its own once the forced
//! records before it are durable, so the answer does not depend on the request that happened
//! to free the lock staying connected. A prepare whose HTTP client went away stays queued until
//! it is granted or its deadline passes (bounded by `lock_wait_max_ms`); its answer is dropped.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use protocol::kv::PreparedEntry;
use protocol::{DecisionQuery, DecisionQueryResponse, DecisionRequest, PrepareRequest, TxId, Vote};
use wal::{AppendTicket, Durability, Wal, WalError};

use crate::config::ParticipantConfig;
use crate::crash::{self, crash_point};
use crate::engine::{Command, Engine, Event, Reply};
use crate::metrics::Metrics;
use crate::record::Record;
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

/// How soon a queued prepare past its deadline ticks again if the engine has not answered it.
const LOCK_RETICK_MS: u64 = 5;

/// Where a queued prepare's answer goes.
type Pending = tokio::sync::oneshot::Sender<Result<Reply, RequestError>>;

/// A deferred answer with the forced records it must wait for.
struct Delivery {
    pending: Pending,
    reply: Reply,
    tickets: Vec<AppendTicket>,
}

/// What one step left for the caller: its own reply, the tickets that reply waits for, the
/// decision queries to send.
struct Stepped {
    reply: Option<Reply>,
    asks: Vec<(TxId, DecisionQuery)>,
}

pub(crate) struct Inner<R: Resource> {
    pub(crate) state: Mutex<State<R>>,
    pub(crate) wal: Wal,
    pub(crate) config: ParticipantConfig,
    pub(crate) metrics: Metrics,
    pub(crate) fatal: AtomicBool,
    /// Set by `close`: appends that fail with `Closed` after it are expected, not a log failure.
    pub(crate) closing: AtomicBool,
    pub(crate) fatal_notify: tokio::sync::Notify,
    pub(crate) client: reqwest::Client,
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
        client: reqwest::Client,
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
                client,
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

    /// Phase one. `Ok(Vote::Yes)` only after the prepared record is durable. A prepare that
    /// meets keys locked by older attempts may wait here (up to the lock-wait deadline).
    pub async fn prepare(&self, request: PrepareRequest) -> Result<Vote, RequestError> {
        crash_point(crash::BEFORE_PREPARED_DURABLE);
        let (txid, gtid) = (request.txid.clone(), request.gtid.clone());
        let now = now_ms();
        // The engine answers a waiter at its deadline on any step; this prepare's own timer
        // feeds a tick then, so the no comes on time with no other traffic and no resolver.
        let wait_max_ms = self.inner.config.engine.lock_wait_max_ms;
        let wait_ms = request.lock_wait_ms.unwrap_or(wait_max_ms).min(wait_max_ms);
        let (pending, mut answer) = tokio::sync::oneshot::channel();
        let stepped = self
            .run_step(
                |waiter| Event::Prepare {
                    request,
                    now_ms: now,
                    waiter,
                },
                Some(pending),
            )
            .await?;
        let reply = match stepped.reply {
            Some(reply) => Some(reply),
            None => {
                self.metrics().count_lock_wait();
                tracing::debug!(%txid, %gtid, "queued for a lock");
                let waited = Instant::now();
                let mut sleep_ms = wait_ms.saturating_add(1);
                let reply = loop {
                    let timer = tokio::time::sleep(Duration::from_millis(sleep_ms));
                    tokio::select! {
                        // Dropped unanswered only if the engine forgot the waiter (a bug);
                        // the coordinator then sees an error, which counts as no.
                        answered = &mut answer => break answered
                            .map_err(|_| internal("a queued prepare was dropped unanswered"))??,
                        () = timer => {
                            // Past the deadline by this clock; the engine's (wall) clock may
                            // lag a little, so tick again shortly until it answers.
                            self.tick_now().await;
                            sleep_ms = LOCK_RETICK_MS;
                        }
                    }
                };
                self.metrics().observe_lock_wait(waited.elapsed());
                Some(reply)
            }
        };
        if let Some(Reply::Vote(Vote::No { reason })) = &reply {
            if reason.starts_with("lock_timeout:") {
                self.metrics().count_lock_timeout();
            } else if reason.starts_with("lock_conflict:") {
                self.metrics().count_lock_conflict();
            }
        }
        let result = match reply {
            Some(Reply::Vote(vote)) => Ok(vote),
            Some(Reply::Reject(rejection)) => Err(RequestError::Rejected(rejection)),
            Some(Reply::Ack | Reply::Fenced(_) | Reply::FenceReset(_)) | None => {
                Err(internal("prepare produced no vote"))
            }
        };
        match &result {
            Ok(Vote::Yes) => {
                crash_point(crash::AFTER_PREPARED_DURABLE);
                self.metrics().count_vote(true);
                tracing::debug!(%txid, %gtid, "prepared, voting yes");
            }
            Ok(Vote::No { reason }) => {
                self.metrics().count_vote(false);
                tracing::info!(%txid, %gtid, %reason, "voting no");
            }
            Err(error) => {
                self.metrics().count_rejected();
                tracing::info!(%txid, %gtid, %error, "prepare refused");
            }
        }
        result
    }

    /// A write outside 2PC guarded by a fencing token (`crate::fence`): applied only if its
    /// token is no lower than any accepted for its resource, logged with that check and its
    /// answer in one forced record, and answered once durable. A repeated `op_id` gets the
    /// first answer and applies nothing.
    pub async fn fenced_write(
        &self,
        write: crate::fence::FencedWrite,
    ) -> Result<crate::fence::FencedAnswer, RequestError> {
        let reply = self
            .run(Event::FencedWrite {
                write,
                now_ms: now_ms(),
            })
            .await?;
        match reply {
            Some(Reply::Fenced(answer)) => {
                if matches!(answer, crate::fence::FencedAnswer::Applied { .. }) {
                    crash_point(crash::AFTER_FENCED_WRITE_LOGGED);
                }
                Ok(answer)
            }
            Some(Reply::Reject(rejection)) => Err(RequestError::Rejected(rejection)),
            Some(Reply::Vote(_) | Reply::Ack | Reply::FenceReset(_)) | None => {
                Err(internal("a fenced write produced no answer"))
            }
        }
    }

    /// An operator lowers a fenced resource's highest token (`crate::fence::table`): answered
    /// with the reset as logged, once its record is durable.
    pub async fn reset_fence(
        &self,
        request: crate::fence::FenceResetRequest,
    ) -> Result<crate::fence::FenceReset, RequestError> {
        let reply = self
            .run(Event::ResetFence {
                request,
                now_ms: now_ms(),
            })
            .await?;
        match reply {
            Some(Reply::FenceReset(reset)) => {
                crash_point(crash::AFTER_FENCE_RESET_LOGGED);
                tracing::warn!(
                    resource = %reset.resource, from = reset.from, to = reset.to,
                    operator = %reset.operator, reason = %reset.reason,
                    "fence reset by an operator"
                );
                Ok(reset)
            }
            Some(Reply::Reject(rejection)) => Err(RequestError::Rejected(rejection)),
            Some(Reply::Vote(_) | Reply::Ack | Reply::Fenced(_)) | None => {
                Err(internal("a fence reset produced no answer"))
            }
        }
    }

    /// Phase two, commit. `Ok` only after the commit record is durable.
    pub async fn commit(&self, request: DecisionRequest) -> Result<(), RequestError> {
        let gtid = request.gtid.clone();
        let reply = self
            .run(Event::Commit {
                request,
                now_ms: now_ms(),
            })
            .await?;
        let result = ack_or_reject(reply);
        match &result {
            Ok(()) => {
                crash_point(crash::AFTER_COMMIT_LOGGED);
                self.metrics().count_commit();
                tracing::debug!(%gtid, "committed");
            }
            Err(error) => {
                self.metrics().count_rejected();
                tracing::warn!(%gtid, %error, "commit refused");
            }
        }
        result
    }

    /// Phase two, abort. `Ok` only after the abort record (or tombstone) is durable.
    pub async fn abort(&self, request: DecisionRequest) -> Result<(), RequestError> {
        let gtid = request.gtid.clone();
        let reply = self
            .run(Event::Abort {
                request,
                now_ms: now_ms(),
            })
            .await?;
        let result = ack_or_reject(reply);
        match &result {
            Ok(()) => {
                self.metrics().count_abort();
                tracing::debug!(%gtid, "aborted");
            }
            Err(error) => {
                self.metrics().count_rejected();
                tracing::warn!(%gtid, %error, "abort refused");
            }
        }
        result
    }

    /// Feeds the coordinator's answer to a decision query (or `None`: no usable answer).
    pub(crate) async fn decision_answer(
        &self,
        gtid: protocol::GlobalTxId,
        answer: Option<DecisionQueryResponse>,
    ) -> Result<(), RequestError> {
        self.run(Event::DecisionAnswer {
            gtid,
            answer,
            now_ms: now_ms(),
            entropy: fastrand::u64(..),
        })
        .await
        .map(|_| ())
    }

    /// Scans for attempts in doubt for too long and for lock waits past their deadline;
    /// returns the queries to send.
    pub(crate) async fn tick(&self) -> Vec<(TxId, DecisionQuery)> {
        let pruned_before = self.with_engine(|engine| engine.fences().pruned());
        match self
            .run_step(|_| Event::Tick { now_ms: now_ms() }, None)
            .await
        {
            Ok(stepped) => {
                let pruned = self.with_engine(|engine| engine.fences().pruned());
                if pruned != pruned_before {
                    // Never silently: what retention took is said here and counted in metrics.
                    tracing::info!(
                        highest_tokens = pruned.highest - pruned_before.highest,
                        op_answers = pruned.answers - pruned_before.answers,
                        "fence retention: idle resources joined the floor, old op answers went"
                    );
                }
                stepped.asks
            }
            Err(error) => {
                tracing::debug!(%error, "tick not run");
                Vec::new()
            }
        }
    }

    /// A tick out of the resolver's rhythm; its decision queries are sent as the resolver's are.
    async fn tick_now(&self) {
        let asks = self.tick().await;
        for (txid, query) in asks {
            let this = self.clone();
            tokio::spawn(async move { this.resolve(txid, query).await });
        }
    }

    /// One engine step for a request that cannot queue.
    async fn run(&self, event: Event) -> Result<Option<Reply>, RequestError> {
        Ok(self.run_step(|_| event, None).await?.reply)
    }

    /// One engine step: submit its records under the mutex, then wait for the forced ones.
    /// `event` gets a fresh waiter id; when the step queues the request (no reply),
    /// `pending` is registered under it before any `Deliver` of the same step is executed.
    async fn run_step(
        &self,
        event: impl FnOnce(u64) -> Event,
        pending: Option<Pending>,
    ) -> Result<Stepped, RequestError> {
        if self.is_failed() {
            return Err(RequestError::LogFailed(WalError::Poisoned {
                cause: "an earlier append failed".into(),
            }));
        }
        // Forced tickets since the last reply or delivery: each answer waits for the forced
        // records before it. The log is written and synced in order, so a later record's
        // durability covers the earlier ones (a grant's yes covers the commit that freed it).
        let mut tickets: Vec<AppendTicket> = Vec::new();
        let mut reply = None;
        let mut reply_tickets = Vec::new();
        let mut deliveries = Vec::new();
        let mut asks = Vec::new();
        {
            let mut state = self.lock();
            let waiter = state.next_waiter;
            state.next_waiter = state.next_waiter.wrapping_add(1);
            let commands = state.engine.step(event(waiter));
            if let Some(pending) = pending
                && !commands.iter().any(|c| matches!(c, Command::Reply(_)))
            {
                state.waiters.insert(waiter, pending);
            }
            for command in commands {
                match command {
                    Command::Log { record, forced } => {
                        let ticket = self.submit(&record, forced);
                        state.records_since_checkpoint += 1;
                        if forced {
                            tickets.push(ticket);
                        }
                    }
                    Command::Reply(r) => {
                        reply = Some(r);
                        reply_tickets.append(&mut tickets);
                    }
                    Command::Deliver { waiter, reply } => {
                        let tickets = std::mem::take(&mut tickets);
                        // Gone only if it was never registered (a bug); nobody to tell.
                        if let Some(pending) = state.waiters.remove(&waiter) {
                            deliveries.push(Delivery {
                                pending,
                                reply,
                                tickets,
                            });
                        }
                    }
                    Command::AskDecision { txid, query } => asks.push((txid, query)),
                }
            }
            // Forced records after the last answer (a queued prepare's fence): the caller's
            // reply, if any, waits for them as it always did.
            reply_tickets.append(&mut tickets);
            // A checkpoint costs time proportional to the live state, so never take one more
            // often than every `live` records, `live` as the last checkpoint measured it: the
            // cost per record stays constant and the log stays within about twice the state.
            // (Not the live state now: it grows with nearly every record, tombstones being
            // kept for a day, and the records since the checkpoint would then never catch up.)
            let every = self
                .inner
                .config
                .checkpoint_every_records
                .max(state.live_at_checkpoint);
            if state.records_since_checkpoint >= every {
                let engine = &state.engine;
                let live =
                    engine.prepared_len() + engine.tombstones_len() + engine.resource().entries();
                state.live_at_checkpoint = u64::try_from(live).unwrap_or(u64::MAX);
                state.records_since_checkpoint = 0;
                self.checkpoint_locked(&state);
            }
        }
        for delivery in deliveries {
            self.spawn_delivery(delivery);
        }
        for ticket in reply_tickets {
            if let Err(error) = ticket.wait().await {
                self.fail(&error);
                return Err(RequestError::LogFailed(error));
            }
        }
        Ok(Stepped { reply, asks })
    }

    /// Sends a queued prepare's answer once its forced records are durable, off the current
    /// request's future (which its client may drop).
    fn spawn_delivery(&self, delivery: Delivery) {
        let this = self.clone();
        let send = async move {
            let Delivery {
                pending,
                reply,
                tickets,
            } = delivery;
            for ticket in tickets {
                if let Err(error) = ticket.wait().await {
                    this.fail(&error);
                    // The waiting prepare may have gone; nothing else to do.
                    let _ = pending.send(Err(RequestError::LogFailed(error)));
                    return;
                }
            }
            let _ = pending.send(Ok(reply));
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(send);
            }
            // A caller driving the futures with another executor: a plain thread waits.
            Err(_) => {
                std::thread::spawn(move || {
                    match tokio::runtime::Builder::new_current_thread().build() {
                        Ok(runtime) => runtime.block_on(send),
                        // The waiting prepare's sender drops with `send`: it sees an error.
                        Err(error) => {
                            tracing::error!(%error, "cannot deliver a queued prepare's answer")
                        }
                    }
                });
            }
        }
    }

    /// Submits a record forced under the held mutex, counted toward the next checkpoint.
    pub(crate) fn submit_counted(&self, state: &mut State<R>, record: &Record) -> AppendTicket {
        state.records_since_checkpoint += 1;
        self.submit(record, true)
    }

    fn submit(&self, record: &Record, forced: bool) -> AppendTicket {
        let durability = match (forced, record) {
            (false, _) => Durability::Lazy,
            // Still durable before the ack; but the ack's waiter (the coordinator's phase two)
            // is off the client's path, so its fsync may wait to be shared with the next
            // prepare, which would otherwise queue behind it.
            (true, Record::Committed { .. } | Record::Aborted { .. }) => Durability::Grouped,
            (
                true,
                Record::Prepared { .. }
                | Record::Refused { .. }
                | Record::Fence { .. }
                | Record::SagaOp { .. }
                | Record::FencedWrite { .. }
                | Record::FencedRepeat { .. }
                | Record::FenceReset(_)
                | Record::FencedStale { .. },
            ) => Durability::Forced,
        };
        self.inner
            .wal
            .submit(record.record_type(), record.encode(), durability)
    }

    /// Checkpoints the engine as it is under the held mutex (ordered with submits): the state
    /// is copied here, and encoded and written by the log off this mutex, so requests keep
    /// flowing meanwhile. A checkpoint that cannot be made (too large, unencodable, another
    /// still running) is logged, counted and tried again after as many records; only a log
    /// failure stops the process.
    fn checkpoint_locked(&self, state: &State<R>) {
        let snapshot = state.engine.snapshot();
        let ticket = self.inner.wal.checkpoint_with(move || {
            if crash::checkpoint_unencodable() {
                return Err(format!("fault point {}", crash::CHECKPOINT_UNENCODABLE));
            }
            serde_json::to_vec(&snapshot).map_err(|error| error.to_string())
        });
        // Weak: a checkpoint in flight must not keep the participant (and its directory lock)
        // alive after its owner dropped it.
        let weak = Arc::downgrade(&self.inner);
        let finished = move |result: Result<u64, WalError>| {
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let this = Participant { inner };
            match result {
                Ok(seq) => {
                    this.metrics().count_checkpoint();
                    tracing::debug!(seq, "checkpoint written");
                }
                // The one before is still being written: this one's records go in the next.
                Err(WalError::CheckpointInProgress) => {
                    tracing::debug!("checkpoint skipped: the previous one is still being written");
                }
                Err(error @ (WalError::SnapshotTooLarge { .. } | WalError::SnapshotEncode(_))) => {
                    this.metrics().count_checkpoint_failure();
                    tracing::error!(%error, "checkpoint not written; the log keeps growing \
                                     until one succeeds (tried again later)");
                }
                Err(error) => this.fail(&error),
            }
        };
        // Waited for off the request path; outside a runtime (a caller driving the futures with
        // another executor) a plain thread waits instead.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move { finished(ticket.wait().await) });
            }
            Err(_) => {
                std::thread::spawn(move || finished(ticket.wait_blocking()));
            }
        }
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

fn ack_or_reject(reply: Option<Reply>) -> Result<(), RequestError> {
    match reply {
        Some(Reply::Ack) => Ok(()),
        Some(Reply::Reject(rejection)) => Err(RequestError::Rejected(rejection)),
        Some(Reply::Vote(_) | Reply::Fenced(_) | Reply::FenceReset(_)) | None => {
            Err(internal("decision produced no ack"))
        }
    }
}

fn internal(what: &'static str) -> RequestError {
    RequestError::Internal(what)
}
