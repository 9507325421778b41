//! Sending what the engine decided to send, one message at a time: a prepare or a phase-two
//! message in its own task, its result fed back as an event (a vote, an acknowledgement, a
//! failed delivery), and a fencing refusal reported to `fencing`. `batches` sends many of them
//! in one request and feeds each answer back through the same `voted` and `delivered`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{error, warn};

use protocol::{
    Decision, DecisionRequest, Epoch, GlobalTxId, ParticipantName, PrepareRequest, TxId, VoteKind,
};

use super::participants::{self, DeliveryError, PrepareOutcome};
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

impl PrepareJob {
    /// What the participant is sent for this job. The payload moves into it: a job's answer
    /// needs only its ids, and a payload is the largest thing a transaction carries.
    pub(super) fn request(&mut self, core: &Core) -> PrepareRequest {
        PrepareRequest {
            txid: self.txid.clone(),
            gtid: self.attempt.gtid.clone(),
            coordinator_id: core.identity.coordinator_id.clone(),
            epoch: core.epoch(),
            incarnation: core.identity.incarnation,
            position: self.attempt.position,
            payload: std::mem::take(&mut self.payload),
            started_at_ms: Some(self.started_at_ms),
            // A quarter of the deadline is left for the no vote to travel back before the
            // coordinator stops waiting (and records a timeout instead).
            lock_wait_ms: Some(self.timeout_ms.saturating_mul(3) / 4),
            participants: Some(self.named.clone()),
        }
    }
}

/// One tracked phase-two message to send (`Command::SendDecision`).
#[derive(Debug)]
pub(super) struct DecisionJob {
    pub(super) txid: TxId,
    pub(super) gtid: GlobalTxId,
    pub(super) participant: ParticipantName,
    pub(super) decision: Decision,
    pub(super) attempt: u32,
    pub(super) from_recovery: bool,
}

impl Core {
    /// A prepare as a message of its own.
    pub(super) async fn prepare(self: Arc<Self>, mut job: PrepareJob) {
        let started = Instant::now();
        let request = job.request(&self);
        let outcome = match self.participants.get(&job.participant) {
            Some(endpoint) => {
                participants::prepare(endpoint, &request, Duration::from_millis(job.timeout_ms))
                    .await
            }
            None => PrepareOutcome {
                vote: VoteKind::Error,
                reason: Some(format!("{} is not configured", job.participant)),
                fenced: None,
            },
        };
        self.voted(job, request.epoch, outcome, started);
    }

    /// A prepare's answer, alone or in a batch: a fencing refusal is reported, and the vote
    /// goes to the engine.
    pub(super) fn voted(
        self: &Arc<Self>,
        job: PrepareJob,
        sent_epoch: Epoch,
        outcome: PrepareOutcome,
        started: Instant,
    ) {
        let PrepareJob {
            txid, participant, ..
        } = job;
        if let Some(refusal) = outcome.fenced {
            self.fenced(&participant, "a prepare", sent_epoch, refusal);
        }
        let (vote, reason) = (outcome.vote, outcome.reason);
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

    /// A phase-two message of its own.
    pub(super) async fn deliver(self: Arc<Self>, job: DecisionJob) {
        let request = self.decision_request(&job.txid, job.gtid.clone());
        let sent_epoch = request.epoch;
        let result = match self.participants.get(&job.participant) {
            Some(endpoint) => {
                participants::deliver(
                    endpoint,
                    job.decision,
                    &request,
                    Duration::from_millis(self.config.delivery_timeout_ms),
                )
                .await
            }
            None => Err(DeliveryError::Transport(format!(
                "{} is not in this coordinator's configuration any more; \
                 add it back to deliver the decision",
                job.participant
            ))),
        };
        self.delivered(job, sent_epoch, result);
    }

    /// A phase-two answer, alone or in a batch: an ack goes to the engine; a failure arms
    /// the retry, and a fencing refusal is reported.
    pub(super) fn delivered(
        self: &Arc<Self>,
        job: DecisionJob,
        sent_epoch: Epoch,
        result: Result<(), DeliveryError>,
    ) {
        let DecisionJob {
            txid,
            participant,
            decision,
            attempt,
            from_recovery,
            ..
        } = job;
        if attempt > 1 {
            self.metrics
                .phase_two_retries
                .fetch_add(1, Ordering::Relaxed);
        }
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
