//! What participants' refusals prove, and acting on it: the "log behind" mark, the raise of
//! this run's epoch past a run that claimed it (`engine::epoch` decides; this carries it out),
//! the probe at start that asks every participant whether another run passed this one, and
//! the audited operator action that clears a mark.
//!
//! Only a refusal of a message this run sent counts. A decision query is a claim, not
//! evidence: one that names an unknown run is answered `unknown` and counted, nothing more.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{error, info, warn};

use protocol::operator::{AuditAction, ClearBehindRequest, ClearBehindResponse};
use protocol::{Decision, DecisionRequest, Epoch, ErrorCode, ParticipantName, TxId};
use wal::AppendTicket;

use super::operator::{OperatorError, check_operator, rejected};
use super::participants::{self, DeliveryError, FenceRefusal};
use super::{Core, now_ms};
use crate::engine::{Event, Fenced};
use crate::http_client::Endpoint;
use crate::records::EpochRecord;

/// The client id probes are sent under (participants show it in their logs; nothing is ever
/// begun under a probe's attempt id).
pub const PROBE_TXID: &str = "twopc-epoch-probe";

impl Core {
    /// A participant refused `what` (a prepare, a commit, an abort), sent at `sent_epoch`,
    /// as `stale_epoch` or `incarnation_conflict`.
    pub(super) fn fenced(
        self: &Arc<Self>,
        participant: &ParticipantName,
        what: &str,
        sent_epoch: Epoch,
        refusal: FenceRefusal,
    ) {
        let was_behind = self.behind.load(Ordering::Relaxed);
        let evidence = format!("refused {what} sent at epoch {sent_epoch}: {refusal}");
        let mut not_believed = None;
        self.apply_with(|engine| {
            not_believed = engine.raise_refused_why(refusal.highest);
            engine.step(Event::Fenced(Fenced {
                participant: participant.clone(),
                evidence: evidence.clone(),
                sent_epoch,
                highest: refusal.highest,
                now_ms: now_ms(),
            }))
        });
        self.mirror_behind();
        if !was_behind && self.behind.load(Ordering::Relaxed) {
            error!(coordinator_id = %self.identity.coordinator_id, epoch = %sent_epoch,
                   incarnation = %self.identity.incarnation, %participant, evidence = %evidence,
                   "LOG BEHIND: a participant has seen a run of this coordinator that this log \
                    does not hold (was the data directory restored from a backup?); refusing new \
                    transactions; raising this run's epoch past it so decisions and resolutions \
                    reach participants; see docs/operations.md, \"Restores and rolled-back logs\"");
        } else {
            warn!(%participant, evidence = %evidence, "more evidence that this log is behind");
        }
        if let Some(why) = not_believed {
            error!(%participant, why = %why, "this run's epoch is not raised");
        }
    }

    /// Makes the hot path's flag and the metric follow the engine's mark.
    pub(super) fn mirror_behind(&self) {
        let behind = self.lock_engine().behind().is_some();
        self.behind.store(behind, Ordering::Relaxed);
        self.metrics
            .log_behind
            .store(u64::from(behind), Ordering::Relaxed);
    }

    /// Waits for a raised epoch's record; only then do messages carry it.
    pub(super) async fn raise_when_durable(
        self: Arc<Self>,
        raised: EpochRecord,
        ticket: AppendTicket,
    ) {
        match ticket.wait().await {
            Ok(_) => {
                self.epoch.store(raised.epoch.0, Ordering::Release);
                self.metrics.epoch_raises.fetch_add(1, Ordering::Relaxed);
                warn!(epoch = %raised.epoch, incarnation = %raised.incarnation,
                      "this run's epoch is raised past the run a participant holds; pending \
                       deliveries go again now");
                self.apply(Event::EpochDurable { identity: raised });
                // A participant holding the new epoch under another run has nothing pending
                // from this run to refuse; only a message at the new epoch lets it say so.
                self.probe_epochs();
            }
            Err(e) => {
                error!(epoch = %raised.epoch, error = %e,
                       "the raised epoch could not be made durable; this run keeps its epoch");
            }
        }
    }

    /// Asks every participant, at start and after each raise, whether another run of this coordinator id
    /// passed this one: an abort for this run's probe attempt (position 0, which no attempt is
    /// ever begun under). An acknowledgement says no; a fencing refusal is evidence
    /// (`fenced`). A participant that cannot be reached is asked again with backoff until it
    /// answers, or until this core is gone (the task holds it only while a call is out).
    pub fn probe_epochs(self: &Arc<Self>) {
        for (participant, endpoint) in &self.participants {
            tokio::spawn(probe(
                Arc::downgrade(self),
                participant.clone(),
                Arc::clone(endpoint),
            ));
        }
    }

    /// An operator clears the "log behind" mark (audited): new transactions are taken again.
    /// For a mark set by mistake (a coordinator of an older version believed a query), or once
    /// an operator accepts that this log lost a run (docs/operations.md).
    pub async fn clear_behind(
        self: &Arc<Self>,
        request: ClearBehindRequest,
    ) -> Result<ClearBehindResponse, OperatorError> {
        check_operator(&request.operator, &request.reason)?;
        let _one_at_a_time = self.operator_lock.lock().await;
        let Some(evidence) = self.lock_engine().behind().map(|b| b.evidence.clone()) else {
            return Err(rejected(
                ErrorCode::NotPending,
                "this coordinator's log is not marked behind: nothing to clear",
            ));
        };
        let entry = self
            .log_audit(
                request.operator,
                request.reason,
                AuditAction::ClearBehind {
                    cleared: evidence.clone(),
                },
            )
            .await?;
        self.mirror_behind();
        info!(seq = entry.seq, operator = %entry.operator, evidence = %evidence,
              "log-behind mark cleared by an operator; new transactions are taken again");
        Ok(ClearBehindResponse {
            cleared: evidence,
            audit_seq: entry.seq,
        })
    }
}

async fn probe(core: Weak<Core>, participant: ParticipantName, endpoint: Arc<Endpoint>) {
    let Ok(txid) = TxId::new(PROBE_TXID) else {
        return;
    };
    let mut tries = 0u32;
    loop {
        tries = tries.saturating_add(1);
        let Some(strong) = core.upgrade() else {
            return;
        };
        let Some(attempt) = strong.lock_engine().probe_attempt() else {
            return;
        };
        let request: DecisionRequest = strong.decision_request(&txid, attempt.gtid);
        let timeout = Duration::from_millis(strong.config.delivery_timeout_ms);
        let (retry_base_ms, retry_max_ms) =
            (strong.config.retry_base_ms, strong.config.retry_max_ms);
        drop(strong);
        let sent_epoch = request.epoch;
        let answer = participants::deliver(&endpoint, Decision::Abort, &request, timeout).await;
        match answer {
            Ok(()) => {
                tracing::debug!(%participant, epoch = %sent_epoch, "epoch probe acknowledged");
                return;
            }
            Err(DeliveryError::Fenced(refusal)) => {
                // The raise (if believed) follows once durable; every later exchange with this
                // participant is evidence again if it does not suffice.
                if let Some(strong) = core.upgrade() {
                    strong.fenced(&participant, "the epoch probe", sent_epoch, refusal);
                }
                return;
            }
            Err(e) => {
                let delay = crate::engine::retry_delay_ms(
                    tries,
                    retry_base_ms,
                    retry_max_ms,
                    fastrand::u64(..),
                );
                tracing::debug!(%participant, error = %e, delay_ms = delay,
                                "epoch probe not answered; asking again");
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
        }
    }
}
