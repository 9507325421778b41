//! Sending what the engine decided to send: each prepare and each phase-two message in its
//! own task, its result fed back as an event (a vote, an acknowledgement, a failed delivery),
//! and a fencing refusal reported to `fencing`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{error, warn};

use protocol::{
    Decision, DecisionRequest, GlobalTxId, ParticipantName, PrepareRequest, TxId, VoteKind,
};

use super::participants::{self, DeliveryError};
use super::{Core, now_ms};
use crate::engine::Event;
use crate::records::Attempt;

/// One prepare to send (`Command::SendPrepare`).
#[derive(Debug)]
pub(super) struct PrepareJob {
    pub(super) txid: TxId,
    pub(super) attempt: Attempt,
    pub(super) participant: ParticipantName,
    pub(super) payload: serde_json::Value,
    pub(super) timeout_ms: u64,
    pub(super) started_at_ms: u64,
    pub(super) named: Vec<ParticipantName>,
}

impl Core {
    pub(super) async fn prepare(self: Arc<Self>, job: PrepareJob) {
        let PrepareJob {
            txid,
            attempt,
            participant,
            payload,
            timeout_ms,
            started_at_ms,
            named,
        } = job;
        let started = Instant::now();
        let (vote, reason) = match self.participants.get(&participant) {
            Some(endpoint) => {
                let request = PrepareRequest {
                    txid: txid.clone(),
                    gtid: attempt.gtid,
                    coordinator_id: self.identity.coordinator_id.clone(),
                    epoch: self.epoch(),
                    incarnation: self.identity.incarnation,
                    position: attempt.position,
                    payload,
                    started_at_ms: Some(started_at_ms),
                    // A quarter of the deadline is left for the no vote to travel back before
                    // the coordinator stops waiting (and records a timeout instead).
                    lock_wait_ms: Some(timeout_ms.saturating_mul(3) / 4),
                    participants: Some(named),
                };
                let outcome =
                    participants::prepare(endpoint, &request, Duration::from_millis(timeout_ms))
                        .await;
                if let Some(refusal) = outcome.fenced {
                    self.fenced(&participant, "a prepare", request.epoch, refusal);
                }
                (outcome.vote, outcome.reason)
            }
            None => (
                VoteKind::Error,
                Some(format!("{participant} is not configured")),
            ),
        };
        self.metrics.prepare_latency.observe(started.elapsed());
        match vote {
            VoteKind::Yes => tracing::debug!(%txid, %participant, "voted yes"),
            VoteKind::No | VoteKind::Timeout | VoteKind::Error => {
                tracing::info!(%txid, %participant, ?vote, reason = reason.as_deref().unwrap_or(""), "prepare not granted")
            }
        }
        crash_point!("coordinator::during_prepare_fanout");
        self.apply(Event::VoteReceived {
            txid,
            participant,
            vote,
            reason,
            now_ms: now_ms(),
        });
    }

    /// An abort nobody waits for (see `rules::send_decisions`): sent once so that a participant
    /// that prepared after all releases its locks now rather than when it next asks.
    pub(super) async fn notify_once(
        self: Arc<Self>,
        txid: TxId,
        gtid: GlobalTxId,
        participant: ParticipantName,
        decision: Decision,
    ) {
        let Some(endpoint) = self.participants.get(&participant) else {
            return;
        };
        let request = self.decision_request(&txid, gtid);
        self.metrics
            .untracked_aborts
            .fetch_add(1, Ordering::Relaxed);
        let timeout = Duration::from_millis(self.config.delivery_timeout_ms);
        if let Err(e) = participants::deliver(endpoint, decision, &request, timeout).await {
            tracing::debug!(%txid, %participant, error = %e,
                "untracked abort not delivered; the participant asks if it prepared");
        }
    }

    /// A phase-two message for attempt `gtid` of `txid`, from this run.
    pub(super) fn decision_request(&self, txid: &TxId, gtid: GlobalTxId) -> DecisionRequest {
        DecisionRequest {
            txid: txid.clone(),
            gtid,
            coordinator_id: self.identity.coordinator_id.clone(),
            epoch: self.epoch(),
            incarnation: self.identity.incarnation,
        }
    }

    pub(super) async fn deliver(
        self: Arc<Self>,
        txid: TxId,
        gtid: GlobalTxId,
        participant: ParticipantName,
        decision: Decision,
        attempt: u32,
        from_recovery: bool,
    ) {
        if attempt > 1 {
            self.metrics
                .phase_two_retries
                .fetch_add(1, Ordering::Relaxed);
        }
        let request = self.decision_request(&txid, gtid);
        let sent_epoch = request.epoch;
        let result = match self.participants.get(&participant) {
            Some(endpoint) => {
                participants::deliver(
                    endpoint,
                    decision,
                    &request,
                    Duration::from_millis(self.config.delivery_timeout_ms),
                )
                .await
            }
            None => Err(DeliveryError::Transport(format!(
                "{participant} is not in this coordinator's configuration any more; \
                 add it back to deliver the decision"
            ))),
        };
        match result {
            Ok(()) => {
                crash_point!("coordinator::after_some_phase_two");
                if from_recovery {
                    crash_point!("coordinator::during_recovery");
                }
                tracing::debug!(%txid, %participant, ?decision, attempt, "acknowledged");
                self.apply(Event::Acked {
                    txid,
                    participant,
                    now_ms: now_ms(),
                });
            }
            Err(e) => {
                let mut refused = None;
                match &e {
                    DeliveryError::Fenced(refusal) => {
                        self.metrics
                            .stale_epoch_answers
                            .fetch_add(1, Ordering::Relaxed);
                        error!(%txid, %participant, ?decision, attempt, epoch = %sent_epoch, error = %e,
                            "FENCED: a participant has seen a newer or another run of this coordinator id; \
                             delivery stays pending until this run's epoch is raised past it");
                        refused = Some(refusal.clone());
                    }
                    DeliveryError::NotPrepared(_) => {
                        error!(%txid, %participant, ?decision, attempt, error = %e,
                            "participant never prepared a transaction we decided to commit; \
                             it stays pending and visible (GET /v1/transactions?state=committing)");
                    }
                    DeliveryError::Transport(_)
                    | DeliveryError::Status { .. }
                    | DeliveryError::Malformed(_) => {
                        warn!(%txid, %participant, ?decision, attempt, error = %e, "phase two not acknowledged; will retry");
                    }
                }
                self.apply(Event::DeliveryFailed {
                    txid,
                    participant: participant.clone(),
                    error: e.to_string(),
                    jitter: fastrand::u64(..),
                });
                // After the retry is armed: a raise, once durable, starts it again at once.
                if let Some(refusal) = refused {
                    let what = match decision {
                        Decision::Commit => "a commit",
                        Decision::Abort => "an abort",
                    };
                    self.fenced(&participant, what, sent_epoch, refusal);
                }
            }
        }
    }
}
