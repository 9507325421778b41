//! Operator actions on sagas: retry one that waits for its backoff now, settle a
//! `needs_attention` saga by hand, and gather a saga's evidence from its participants. Each
//! action is audited first, one at a time, as for transactions (`operator`).

use std::sync::Arc;

use tracing::info;

use protocol::operator::{AuditAction, RetryRequest, RetryResponse, SagaResolveRequest};
use protocol::{ErrorCode, TxId, routes};

use super::Core;
use super::operator::{EVIDENCE_TIMEOUT, OperatorError, check_operator, rejected};

impl Core {
    /// Tries a saga that waits for its backoff timer (a failing compensation, a step to ask
    /// about) now. Audited first, like every action.
    pub async fn retry_saga(
        self: &Arc<Self>,
        id: TxId,
        request: RetryRequest,
    ) -> Result<RetryResponse, OperatorError> {
        let operator = request
            .operator
            .unwrap_or_else(|| "unnamed operator".to_string());
        let reason = request.reason.unwrap_or_else(|| "retry now".to_string());
        check_operator(&operator, &reason)?;
        let _one_at_a_time = self.operator_lock.lock().await;
        let Some(saga) = self.saga_status(&id) else {
            return Err(rejected(
                ErrorCode::NotFound,
                format!("no saga {id} is known"),
            ));
        };
        if saga.state.is_terminal() {
            return Err(rejected(
                ErrorCode::NotPending,
                format!(
                    "saga {id} has ended ({}): nothing to retry",
                    saga.state.as_str()
                ),
            ));
        }
        let entry = self
            .log_audit(operator, reason, AuditAction::RetrySaga { id: id.clone() })
            .await?;
        let waiting = self.sagas.lock().is_waiting(&id);
        if waiting {
            self.apply_saga(crate::saga::engine::SagaEvent::RetryDue {
                id: id.clone(),
                now_ms: self.sagas.now_ms(),
            });
            self.metrics
                .operator_retries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        info!(%id, seq = entry.seq, waiting, "saga retried now by an operator");
        Ok(RetryResponse {
            retried: u64::from(waiting),
            audit_seq: entry.seq,
        })
    }

    /// Marks a `needs_attention` saga as settled by hand (outside twopc). It stays listed, with
    /// who, why and when; nothing is deleted or compensated.
    pub async fn resolve_saga_by_hand(
        self: &Arc<Self>,
        id: TxId,
        request: SagaResolveRequest,
    ) -> Result<protocol::saga::SagaResponse, OperatorError> {
        check_operator(&request.operator, &request.reason)?;
        let _one_at_a_time = self.operator_lock.lock().await;
        let Some(saga) = self.saga_status(&id) else {
            return Err(rejected(
                ErrorCode::NotFound,
                format!("no saga {id} is known"),
            ));
        };
        if let Some(done) = &saga.resolved_by_hand {
            return Err(rejected(
                ErrorCode::NotInDoubt,
                format!(
                    "saga {id} was settled by hand already, by {} (audit #{})",
                    done.operator, done.audit_seq
                ),
            ));
        }
        if saga.state != protocol::saga::SagaState::NeedsAttention {
            return Err(rejected(
                ErrorCode::NotInDoubt,
                format!(
                    "saga {id} is {}: only a needs_attention saga is settled by hand; the \
                     coordinator finishes the others itself",
                    saga.state.as_str()
                ),
            ));
        }
        let entry = self
            .log_audit(
                request.operator,
                request.reason,
                AuditAction::ResolveSagaByHand { id: id.clone() },
            )
            .await?;
        info!(%id, seq = entry.seq, operator = %entry.operator, "saga settled by hand");
        self.saga_status(&id).ok_or_else(|| {
            rejected(
                ErrorCode::Internal,
                format!("saga {id} vanished while it was being settled"),
            )
        })
    }

    /// The saga's evidence: its status, and each step's action as its participant reports it
    /// (`GET {base}/saga/ops/{op_id}`), asked now.
    pub async fn saga_evidence(
        self: &Arc<Self>,
        id: TxId,
    ) -> Result<protocol::operator::SagaEvidence, OperatorError> {
        let Some(saga) = self.saga_status(&id) else {
            return Err(rejected(
                ErrorCode::NotFound,
                format!("no saga {id} is known"),
            ));
        };
        // The actions as sent: a participant answers only about this coordinator's op, and
        // only if it was recorded with that payload (`OpQuery`).
        let actions: Vec<serde_json::Value> = self
            .sagas
            .lock()
            .get(&id)
            .map(|s| {
                s.begin
                    .request
                    .steps
                    .iter()
                    .map(|s| s.action.clone())
                    .collect()
            })
            .unwrap_or_default();
        let mut steps = Vec::with_capacity(saga.steps.len());
        for (i, step) in saga.steps.iter().enumerate() {
            let op_id = protocol::saga::op_id(&id, &step.name, protocol::saga::OpKind::Action);
            let (says, error) = match self.participants.get(&step.participant) {
                None => (
                    None,
                    Some("not in this coordinator's configuration".to_string()),
                ),
                Some(endpoint) => {
                    let query = protocol::saga::OpQuery::from_coordinator(
                        &self.identity.coordinator_id,
                        actions.get(i),
                    );
                    let path = routes::saga_op_query_path(&op_id, &query);
                    match endpoint.get(&path, EVIDENCE_TIMEOUT).await {
                        Ok(answer) if answer.status == 200 => {
                            match serde_json::from_slice::<protocol::saga::OpStatusResponse>(
                                &answer.body,
                            ) {
                                Ok(status) => (Some(status.status), None),
                                Err(e) => (None, Some(format!("malformed answer: {e}"))),
                            }
                        }
                        Ok(answer) => (
                            None,
                            Some(
                                match serde_json::from_slice::<protocol::ErrorBody>(&answer.body) {
                                    Ok(refused) => format!(
                                        "HTTP {} {}: {}",
                                        answer.status, refused.error, refused.message
                                    ),
                                    Err(_) => format!("HTTP {}", answer.status),
                                },
                            ),
                        ),
                        Err(e) => (None, Some(e.to_string())),
                    }
                }
            };
            steps.push(protocol::operator::SagaStepEvidence {
                name: step.name.clone(),
                participant: step.participant.clone(),
                op_id,
                coordinator_says: step.status,
                participant_says: says,
                error,
            });
        }
        Ok(protocol::operator::SagaEvidence { saga, steps })
    }
}
