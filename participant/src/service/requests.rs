//! The protocol's calls on a running participant (prepare, commit, abort, fenced writes,
//! fence resets, ticks) and what each engine reply means to the caller: a vote or ack only
//! once the record behind it is durable, the refusals as errors, and the metrics and logs of
//! each outcome.

use std::time::{Duration, Instant};

use protocol::{DecisionQuery, DecisionQueryResponse, DecisionRequest, PrepareRequest, TxId, Vote};

use super::{Participant, RequestError, now_ms};
use crate::crash::{self, crash_point};
use crate::engine::{Event, Reply};
use crate::resource::Resource;

/// How soon a queued prepare past its deadline ticks again if the engine has not answered it.
const LOCK_RETICK_MS: u64 = 5;

impl<R: Resource> Participant<R> {
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
            Some(Reply::Ack | Reply::Fenced(_) | Reply::FenceReset(_) | Reply::Intent(_))
            | None => Err(internal("prepare produced no vote")),
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
            Some(Reply::Vote(_) | Reply::Ack | Reply::FenceReset(_) | Reply::Intent(_)) | None => {
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
            Some(Reply::Vote(_) | Reply::Ack | Reply::Fenced(_) | Reply::Intent(_)) | None => {
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
}

fn ack_or_reject(reply: Option<Reply>) -> Result<(), RequestError> {
    match reply {
        Some(Reply::Ack) => Ok(()),
        Some(Reply::Reject(rejection)) => Err(RequestError::Rejected(rejection)),
        Some(Reply::Vote(_) | Reply::Fenced(_) | Reply::FenceReset(_) | Reply::Intent(_))
        | None => Err(internal("decision produced no ack")),
    }
}

fn internal(what: &'static str) -> RequestError {
    RequestError::Internal(what)
}
