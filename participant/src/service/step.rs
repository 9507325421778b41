//! One engine step against the log, which every call of the participant goes through.
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
//!
//! The step also takes the checkpoints, paced by the live state's size.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use protocol::{DecisionQuery, TxId};
use wal::{AppendTicket, Durability, WalError};

use super::{Participant, Pending, RequestError, State};
use crate::crash;
use crate::engine::{Command, Event, Reply};
use crate::record::Record;
use crate::resource::Resource;

/// A deferred answer with the forced records it must wait for.
struct Delivery {
    pending: Pending,
    reply: Reply,
    tickets: Vec<AppendTicket>,
}

/// What one step left for the caller: its own reply, the tickets that reply waits for, the
/// decision queries to send.
pub(super) struct Stepped {
    pub(super) reply: Option<Reply>,
    pub(super) asks: Vec<(TxId, DecisionQuery)>,
}

impl<R: Resource> Participant<R> {
    /// One engine step for a request that cannot queue.
    pub(super) async fn run(&self, event: Event) -> Result<Option<Reply>, RequestError> {
        Ok(self.run_step(|_| event, None).await?.reply)
    }

    /// One engine step: submit its records under the mutex, then wait for the forced ones.
    /// `event` gets a fresh waiter id; when the step queues the request (no reply),
    /// `pending` is registered under it before any `Deliver` of the same step is executed.
    pub(super) async fn run_step(
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
                let live = engine.prepared_len()
                    + engine.tombstones_len()
                    + engine.resource().entries()
                    + engine.outbox().len();
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
                | Record::FencedStale { .. }
                | Record::Intent { .. },
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
        let size = Arc::clone(&self.inner.snapshot_bytes);
        let ticket = self.inner.wal.checkpoint_with(move || {
            if crash::checkpoint_unencodable() {
                return Err(format!("fault point {}", crash::CHECKPOINT_UNENCODABLE));
            }
            // Room for the state's growth since the last one, so one allocation nearly always.
            let last = size.load(Ordering::Relaxed);
            let snapshot = snapshot.map_err(|error| error.to_string())?;
            let mut bytes = Vec::with_capacity(last.saturating_add(last / 4));
            serde_json::to_writer(&mut bytes, &snapshot).map_err(|error| error.to_string())?;
            size.store(bytes.len(), Ordering::Relaxed);
            Ok(bytes)
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
}
