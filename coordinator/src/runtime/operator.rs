//! Operator actions on transactions: gather the evidence about an attempt, let the judge rule,
//! log the audit record (forced) and only then let it take effect. One action at a time, so two
//! operators can never resolve the same attempt two ways. What every action shares (the check
//! of who and why, the audit record) is here too; the actions on sagas are in `saga_operator`.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use protocol::operator::{
    AttemptStatus, AuditAction, AuditEntry, Evidence, ParticipantEvidence, RefusalBody,
    ResolveRequest, ResolveResponse, RetryRequest, RetryResponse,
};
use protocol::{ErrorCode, GlobalTxId, ParticipantName, TxId, routes};
use wal::{Durability, RecordType};

use super::{Core, now_ms};
use crate::engine::Event;
use crate::engine::judge::{OwnAnswer, Refusal, attempt_participants, judge};
use crate::records::LogRecord;

/// How long one participant may take to give its evidence.
pub(super) const EVIDENCE_TIMEOUT: Duration = Duration::from_secs(3);

/// Why an operator action was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The judge refused it; the evidence it ruled on goes back to the operator.
    #[error("{}: {}", .0.error, .0.message)]
    Refused(Box<RefusalBody>),
    #[error("{code}: {message}")]
    Rejected { code: ErrorCode, message: String },
    #[error("the audit record could not be made durable: {0}")]
    LogFailed(String),
}

pub(super) fn rejected(code: ErrorCode, message: impl Into<String>) -> OperatorError {
    OperatorError::Rejected {
        code,
        message: message.into(),
    }
}

/// Who acts and why: both required (not blank), bounded in characters (what the OpenAPI
/// document's `maxLength` counts), for the audit trail.
pub fn check_operator(operator: &str, reason: &str) -> Result<(), OperatorError> {
    match protocol::operator::operator_fields_problem(operator, reason) {
        Some(problem) => Err(rejected(ErrorCode::InvalidOperator, problem)),
        None => Ok(()),
    }
}

/// Everything known about one attempt, for the judge and the operator.
struct Gathered {
    evidence: Evidence,
    own: OwnAnswer,
    /// The attempt's participants as the attempt itself says (`judge::attempt_participants`),
    /// or why the evidence contradicts itself or the operator's list.
    named: Result<Option<Vec<ParticipantName>>, Refusal>,
    /// Why the attempt cannot be claimed under the request's id at all.
    claim: Option<Refusal>,
}

/// What a retry is for.
#[derive(Debug, Clone)]
pub enum RetryTarget {
    Transaction(TxId),
    Participant(ParticipantName),
}

impl Core {
    /// Resolves an attempt of `txid` that the coordinator cannot decide on its own, if the
    /// evidence allows `request.decision`.
    pub async fn resolve(
        self: &Arc<Self>,
        txid: TxId,
        request: ResolveRequest,
    ) -> Result<ResolveResponse, OperatorError> {
        check_operator(&request.operator, &request.reason)?;
        if let Some(named) = &request.participants {
            if named.is_empty() {
                return Err(rejected(
                    ErrorCode::NoParticipants,
                    "\"participants\", when given, names every participant of the attempt",
                ));
            }
            if let Some(unknown) = named.iter().find(|p| !self.knows_participant(p)) {
                return Err(rejected(
                    ErrorCode::UnknownParticipant,
                    format!("participant {unknown} is not in this coordinator's configuration"),
                ));
            }
        }
        let _one_at_a_time = self.operator_lock.lock().await;
        let Gathered {
            evidence,
            own,
            named,
            claim,
        } = self
            .gather(&txid, request.gtid.clone(), request.participants.clone())
            .await?;
        let gtid = evidence.gtid.clone();
        let ruling = match (claim, named) {
            (Some(refusal), _) | (None, Err(refusal)) => Err(refusal),
            (None, Ok(named)) => judge(
                request.decision,
                &txid,
                &own,
                named.as_deref(),
                &evidence.participants,
            ),
        };
        if let Err(refusal) = ruling {
            warn!(%txid, %gtid, operator = %request.operator, code = %refusal.code,
                  why = %refusal.message, "resolve refused");
            return Err(OperatorError::Refused(Box::new(RefusalBody {
                error: refusal.code,
                message: refusal.message,
                evidence,
            })));
        }
        let entry = self
            .log_audit(
                request.operator,
                request.reason,
                AuditAction::Resolve {
                    id: txid.clone(),
                    gtid: gtid.clone(),
                    decision: request.decision,
                    evidence: evidence.clone(),
                },
            )
            .await?;
        info!(%txid, %gtid, decision = ?request.decision, operator = %entry.operator,
              seq = entry.seq, "attempt resolved by an operator; participants in doubt hear it when they ask");
        Ok(ResolveResponse {
            id: txid,
            gtid,
            decision: request.decision,
            audit_seq: entry.seq,
            evidence,
        })
    }

    /// Starts every pending delivery of the target now instead of at its backoff timer.
    pub async fn retry(
        self: &Arc<Self>,
        target: RetryTarget,
        request: RetryRequest,
    ) -> Result<RetryResponse, OperatorError> {
        let operator = request
            .operator
            .unwrap_or_else(|| "unnamed operator".to_string());
        let reason = request.reason.unwrap_or_else(|| "retry now".to_string());
        check_operator(&operator, &reason)?;
        let _one_at_a_time = self.operator_lock.lock().await;
        let event = match &target {
            RetryTarget::Participant(name) => {
                if !self.knows_participant(name) {
                    return Err(rejected(
                        ErrorCode::NotFound,
                        format!(
                            "participant \"{name}\" is not in this coordinator's configuration"
                        ),
                    ));
                }
                Event::RetryNow {
                    txid: None,
                    participant: Some(name.clone()),
                }
            }
            RetryTarget::Transaction(txid) => {
                self.pending_or_why(txid)?;
                Event::RetryNow {
                    txid: Some(txid.clone()),
                    participant: None,
                }
            }
        };
        // The audit record names what waits now; it is durable before anything starts.
        let waiting = match &event {
            Event::RetryNow { txid, participant } => self
                .lock_engine()
                .waiting_deliveries(txid.as_ref(), participant.as_ref()),
            _ => 0,
        };
        let action = match target {
            RetryTarget::Transaction(id) => AuditAction::RetryTransaction {
                id,
                retried: waiting,
            },
            RetryTarget::Participant(participant) => AuditAction::RetryParticipant {
                participant,
                retried: waiting,
            },
        };
        let entry = self.log_audit(operator, reason, action).await?;
        let mut retried = 0u64;
        self.apply_with(|engine| {
            let commands = engine.step(event);
            retried = commands.len() as u64;
            commands
        });
        self.metrics
            .operator_retries
            .fetch_add(retried, std::sync::atomic::Ordering::Relaxed);
        info!(seq = entry.seq, retried, operator = %entry.operator, "deliveries retried now by an operator");
        Ok(RetryResponse {
            retried,
            audit_seq: entry.seq,
        })
    }

    /// The evidence view of `txid`'s attempt (`gtid`, or the one the log or the participants
    /// hold): the coordinator's own word and each participant's.
    pub async fn evidence(
        self: &Arc<Self>,
        txid: TxId,
        gtid: Option<GlobalTxId>,
    ) -> Result<Evidence, OperatorError> {
        Ok(self.gather(&txid, gtid, None).await?.evidence)
    }

    async fn gather(
        &self,
        txid: &TxId,
        gtid: Option<GlobalTxId>,
        named_by_operator: Option<Vec<ParticipantName>>,
    ) -> Result<Gathered, OperatorError> {
        let archived = self
            .outcomes
            .get(txid, now_ms(), self.config.retention_ms)
            .map_err(|e| {
                rejected(
                    ErrorCode::NotReady,
                    format!("the outcome index cannot be read: {e}"),
                )
            })?;
        let resolved = self.lock_engine().resolved_gtid_of(txid);
        let logged = self.lock_engine().attempt_of(txid).or_else(|| {
            archived.as_ref().map(|r| {
                let named = r.decision.votes.iter().map(|(p, _)| p.clone()).collect();
                (r.decision.attempt.gtid.clone(), named)
            })
        });
        let gtid = match (gtid, &logged, resolved) {
            (Some(gtid), _, _) => gtid,
            (None, Some((gtid, _)), _) => gtid.clone(),
            (None, None, Some(gtid)) => gtid,
            (None, None, None) => self.attempt_held_for(txid).await?,
        };
        // The attempt itself, whatever id the request names: the index knows it by its own id.
        let indexed = self
            .outcomes
            .get_attempt(&gtid, now_ms(), self.config.retention_ms)
            .map_err(|e| {
                rejected(
                    ErrorCode::NotReady,
                    format!("the outcome index cannot be read: {e}"),
                )
            })?;
        let claim = self.lock_engine().claim_refusal(
            txid,
            &gtid,
            indexed.as_ref().map(|r| &r.decision.txid),
        );
        let from_log = match (&logged, &indexed) {
            (Some((held, named)), _) if *held == gtid => Some(named.clone()),
            (_, Some(r)) if r.decision.txid == *txid => {
                Some(r.decision.votes.iter().map(|(p, _)| p.clone()).collect())
            }
            _ => None,
        };
        let participants = self.evidence_for(&gtid).await;
        let named = attempt_participants(
            from_log.as_deref(),
            named_by_operator.as_deref(),
            &participants,
        );
        let own = match &indexed {
            Some(r) if r.decision.txid == *txid => OwnAnswer::Decided(r.decision.decision),
            _ => self.lock_engine().own_answer(txid, &gtid),
        };
        Ok(Gathered {
            evidence: Evidence {
                id: txid.clone(),
                gtid,
                coordinator: describe(&own),
                named: named.as_ref().ok().cloned().flatten(),
                participants,
            },
            own,
            named,
            claim,
        })
    }

    /// The audit trail, newest first.
    pub fn audit(&self, limit: usize, before: Option<u64>) -> Vec<AuditEntry> {
        self.lock_engine().audit(limit, before)
    }

    /// A retry is for a live transaction with decisions to deliver.
    fn pending_or_why(&self, txid: &TxId) -> Result<(), OperatorError> {
        let status = self.status(txid).map_err(|e| {
            rejected(
                ErrorCode::NotReady,
                format!("the outcome index cannot be read: {e}"),
            )
        })?;
        match status {
            None => Err(rejected(
                ErrorCode::NotFound,
                format!("no transaction {txid} is known"),
            )),
            Some(status) if status.ended_at_ms.is_some() => Err(rejected(
                ErrorCode::NotPending,
                format!("transaction {txid} has ended: every participant acknowledged it"),
            )),
            Some(status) if status.decided_at_ms.is_none() => Err(rejected(
                ErrorCode::NotPending,
                format!("transaction {txid} is not decided yet: nothing to deliver"),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Logs the audit record (forced), waits until it is durable, then applies it.
    pub(super) async fn log_audit(
        self: &Arc<Self>,
        operator: String,
        reason: String,
        action: AuditAction,
    ) -> Result<AuditEntry, OperatorError> {
        let (entry, ticket) = {
            let mut engine = self.lock_engine();
            let entry = AuditEntry {
                seq: engine.next_audit_seq(),
                at_ms: now_ms(),
                operator,
                reason,
                action,
            };
            let record = LogRecord::Audit(entry.clone());
            let ticket = self.wal.submit(
                RecordType(record.record_type()),
                record.encode(),
                Durability::Forced,
            );
            // Under the engine lock, as the record was submitted: a checkpoint sees both or
            // neither.
            engine.audit_submitted(entry.clone());
            (entry, ticket)
        };
        ticket
            .wait()
            .await
            .map_err(|e| OperatorError::LogFailed(e.to_string()))?;
        crash_point!("coordinator::after_audit_durable");
        self.lock_engine().apply_audit(entry.clone());
        self.metrics
            .operator_actions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(entry)
    }

    /// The one attempt of `txid` that participants hold prepared, when the log holds none.
    async fn attempt_held_for(&self, txid: &TxId) -> Result<GlobalTxId, OperatorError> {
        let mut found: Vec<GlobalTxId> = Vec::new();
        let mut unasked = Vec::new();
        for (name, endpoint) in &self.participants {
            match endpoint.get(routes::PREPARED, EVIDENCE_TIMEOUT).await {
                Ok(answer) if answer.status == 200 => {
                    match serde_json::from_slice::<protocol::kv::PreparedList>(&answer.body) {
                        Ok(list) => found.extend(
                            list.prepared
                                .into_iter()
                                .filter(|p| p.txid == *txid)
                                .map(|p| p.gtid),
                        ),
                        Err(e) => unasked.push(format!("{name}: {e}")),
                    }
                }
                Ok(answer) => unasked.push(format!("{name}: HTTP {}", answer.status)),
                Err(e) => unasked.push(format!("{name}: {e}")),
            }
        }
        found.sort();
        found.dedup();
        match found.len() {
            1 => Ok(found.remove(0)),
            0 if unasked.is_empty() => Err(rejected(
                ErrorCode::NotFound,
                format!(
                    "no attempt of {txid} is in this coordinator's log or held prepared by any \
                     participant"
                ),
            )),
            0 => Err(rejected(
                ErrorCode::InsufficientEvidence,
                format!(
                    "no attempt of {txid} is in the log, and some participants could not be \
                     asked ({}); name the attempt in \"gtid\"",
                    unasked.join("; ")
                ),
            )),
            _ => Err(rejected(
                ErrorCode::InsufficientEvidence,
                format!(
                    "participants hold several attempts of {txid} ({}); name one in \"gtid\"",
                    found
                        .iter()
                        .map(|g| g.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// Every configured participant's word on `gtid`, asked one after another (a handful of
    /// participants, each bounded by `EVIDENCE_TIMEOUT`).
    async fn evidence_for(&self, gtid: &GlobalTxId) -> Vec<ParticipantEvidence> {
        let path = routes::attempt_path(gtid);
        let mut evidence = Vec::with_capacity(self.participants.len());
        for (name, endpoint) in &self.participants {
            let (said, error) = match endpoint.get(&path, EVIDENCE_TIMEOUT).await {
                Ok(answer) if answer.status == 200 => {
                    match serde_json::from_slice::<AttemptStatus>(&answer.body) {
                        Ok(status) if status.gtid == *gtid => (Some(status), None),
                        Ok(status) => (
                            None,
                            Some(format!("answered about another attempt, {}", status.gtid)),
                        ),
                        Err(e) => (None, Some(format!("malformed answer: {e}"))),
                    }
                }
                Ok(answer) => (
                    None,
                    Some(format!(
                        "HTTP {}: {}",
                        answer.status,
                        String::from_utf8_lossy(&answer.body)
                    )),
                ),
                Err(e) => (None, Some(e.to_string())),
            };
            evidence.push(ParticipantEvidence {
                participant: name.clone(),
                state: said.as_ref().map(|s| s.state),
                prepared_at_ms: said.as_ref().and_then(|s| s.prepared_at_ms),
                txid: said.as_ref().and_then(|s| s.txid.clone()),
                participants: said.and_then(|s| s.participants),
                error,
            });
        }
        evidence
    }
}

fn describe(own: &OwnAnswer) -> String {
    match own {
        OwnAnswer::Decided(d) => format!("decided {}", decision_word(*d)),
        OwnAnswer::Resolved(d) => format!("resolved {} by an operator", decision_word(*d)),
        OwnAnswer::Pending => "pending: still deciding".to_string(),
        OwnAnswer::PresumedAbort(why) => format!("abort ({why})"),
        OwnAnswer::Unknown(why) => format!("unknown: {why}"),
    }
}

fn decision_word(decision: protocol::Decision) -> &'static str {
    match decision {
        protocol::Decision::Commit => "commit",
        protocol::Decision::Abort => "abort",
    }
}
