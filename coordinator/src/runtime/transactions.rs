//! A client's transactions: a submit (the outcome index looked up first, outside the engine
//! lock, so an id only the index remembers is answered without a new attempt), a status and a
//! listing across the engine, the index and what is staged between them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;
use tracing::error;

use protocol::{Decision, GlobalTxId, TransactionState, TransactionStatus, TxId};

use super::{Core, NewTransaction, now_ms};
use crate::engine::{Event, Reply};
use crate::outcomes::{Cursor, OutcomeError};

impl Core {
    /// Starts (or joins) a transaction and waits for the answer the request asked for.
    /// `None` means the process is shutting down before an answer came.
    ///
    /// The index is looked up first, outside the engine lock, and what it held goes into the
    /// `Submit` event, so an id whose outcome is only in the index is answered without a new
    /// attempt. The lookup races with the archiver; the generation read before it lets the
    /// engine tell (`Reply::LookAgain`) when an outcome may have left staging after the lookup
    /// missed it, and then it is simply done again.
    pub async fn submit(self: &Arc<Self>, tx: NewTransaction) -> Option<Reply> {
        // Moved into the event once; kept while a stale lookup has to be done again.
        let mut participants = Some(tx.participants);
        loop {
            let generation = self.archive_generation.load(Ordering::Acquire);
            let now = now_ms();
            let archived = match self.outcomes.get(&tx.txid, now, self.config.retention_ms) {
                Ok(found) => found,
                Err(e) => {
                    self.metrics
                        .index_read_failures
                        .fetch_add(1, Ordering::Relaxed);
                    error!(txid = %tx.txid, error = %e, "outcome index lookup failed");
                    return Some(Reply::IndexUnavailable {
                        error: e.to_string(),
                    });
                }
            };
            let waiter = self.next_waiter.fetch_add(1, Ordering::Relaxed);
            let (sender, receiver) = oneshot::channel();
            self.lock_waiters().insert(waiter, sender);
            let mut stale = false;
            self.apply_with(|engine| {
                // The engine would answer `LookAgain` to a stale lookup; checking here, under
                // the same lock, keeps the payloads for the next try instead of cloning them.
                if engine.archive_generation() != generation {
                    stale = true;
                    return Vec::new();
                }
                engine.step(Event::Submit {
                    waiter,
                    wait: tx.wait,
                    txid: tx.txid.clone(),
                    digest: tx.digest,
                    participants: participants.take().unwrap_or_default(),
                    timeout_ms: tx.timeout_ms,
                    now_ms: now,
                    archived,
                    archive_generation: generation,
                    client: tx.client.clone(),
                })
            });
            if stale {
                self.lock_waiters().remove(&waiter);
                continue;
            }
            return match receiver.await.ok()? {
                // Cannot happen after the check above; an answer all the same.
                Reply::LookAgain => Some(Reply::IndexUnavailable {
                    error: "the outcome lookup raced with the archiver".to_string(),
                }),
                reply => Some(reply),
            };
        }
    }

    /// A transaction's status: the engine (live and staged), then the index. In that order,
    /// because an outcome leaves staging only once the index holds it, so a miss in the engine
    /// followed by the lookup never misses an outcome in between.
    pub fn status(&self, txid: &TxId) -> Result<Option<TransactionStatus>, OutcomeError> {
        if let Some(status) = self.lock_engine().status(txid) {
            return Ok(Some(status));
        }
        if let Some(retained) = self
            .outcomes
            .get(txid, now_ms(), self.config.retention_ms)?
        {
            return Ok(Some(crate::engine::view::retained_status(&retained)));
        }
        Ok(self.lock_engine().resolved_status(txid))
    }

    /// A listing page: without a cursor, live transactions first (from the engine, bounded by
    /// `limit`); then ended ones from the index, oldest ended first, one page of it; once the
    /// index has no more, the staged outcomes not in it yet. `next` continues the index pages.
    pub fn list(
        &self,
        state: Option<TransactionState>,
        limit: usize,
        after: Option<Cursor>,
    ) -> Result<(Vec<TransactionStatus>, Option<Cursor>), OutcomeError> {
        let ended = match state {
            None => Some(None),
            Some(TransactionState::Committed) => Some(Some(Decision::Commit)),
            Some(TransactionState::Aborted) => Some(Some(Decision::Abort)),
            Some(
                TransactionState::Preparing
                | TransactionState::Committing
                | TransactionState::Aborting,
            ) => None,
        };
        let mut out = match after {
            None => self.lock_engine().list_live(state, limit),
            Some(_) => Vec::new(),
        };
        let mut next = None;
        if let Some(decision) = ended {
            if out.len() < limit {
                let page = self.outcomes.list(
                    decision,
                    limit - out.len(),
                    after,
                    now_ms(),
                    self.config.retention_ms,
                )?;
                out.extend(
                    page.outcomes
                        .iter()
                        .map(crate::engine::view::retained_status),
                );
                next = page.next;
            }
            if next.is_none() && out.len() < limit {
                let shown: std::collections::HashSet<TxId> =
                    out.iter().map(|s| s.id.clone()).collect();
                let staged = self
                    .lock_engine()
                    .list_staged(state, limit - out.len(), &shown);
                out.extend(staged);
            }
        }
        Ok((out, next))
    }

    /// The archiver made these outcomes durable in the index: they leave staging.
    pub(crate) fn archived(self: &Arc<Self>, archived: Vec<(TxId, GlobalTxId)>) {
        self.apply_with(|engine| {
            let commands = engine.step(Event::Archived { archived });
            self.archive_generation
                .store(engine.archive_generation(), Ordering::Release);
            commands
        });
    }

    /// The index's numbers (metrics, `/readyz`).
    pub fn index_stats(&self) -> Result<crate::outcomes::IndexStats, OutcomeError> {
        self.outcomes.stats(now_ms(), self.config.retention_ms)
    }
}
