//! What a participant in doubt about an attempt is told: the engine's answer, outranked by
//! the outcome index when the engine has no record of its own; counted, and logged when
//! unknown. Nothing is written.

use std::sync::atomic::Ordering;

use tracing::{error, warn};

use protocol::{DecisionQuery, DecisionQueryResponse, DecisionStatus, TxId};

use super::{Core, now_ms};
use crate::engine::{AnswerSource, DecisionAnswer};

impl Core {
    /// What a participant in doubt about an attempt of `txid` is told (see
    /// `Engine::decision_for`). Nothing is written: an attempt's id is never reused, so a
    /// presumed abort cannot be contradicted later.
    pub fn decision_query(
        &self,
        txid: &TxId,
        query: Option<&DecisionQuery>,
    ) -> DecisionQueryResponse {
        let mut answer = self.lock_engine().decision_for(txid, query);
        // Not answered from the engine's own record: the attempt may be in the index, archived
        // after the engine let go of it, under this id or another. The index outranks a
        // resolution, a presumption and an `unknown`; an attempt leaves staging only once the
        // index holds it, so nothing falls between the two lookups.
        if let (false, Some(query)) = (answer.source == AnswerSource::Record, query) {
            match self
                .outcomes
                .get_attempt(&query.gtid, now_ms(), self.config.retention_ms)
            {
                Ok(Some(retained)) => {
                    answer = DecisionAnswer::from_index(
                        txid,
                        &retained.decision.txid,
                        &query.gtid,
                        retained.decision.decision.into(),
                    );
                }
                Ok(None) => {}
                Err(e) => {
                    // Presumed abort is only safe if no decision exists: unknown it is.
                    error!(%txid, error = %e, "outcome index lookup failed (decision query)");
                    answer =
                        DecisionAnswer::unknown(format!("the outcome index cannot be read: {e}"));
                }
            }
        }
        if answer.unknown_run {
            self.metrics
                .unknown_run_queries
                .fetch_add(1, Ordering::Relaxed);
        }
        match answer.decision {
            DecisionStatus::Abort if answer.source == AnswerSource::Presumed => {
                self.metrics.presumed_aborts.fetch_add(1, Ordering::Relaxed);
            }
            DecisionStatus::Unknown => {
                self.metrics.unknown_answers.fetch_add(1, Ordering::Relaxed);
                warn!(%txid, gtid = query.map_or("", |q| q.gtid.as_str()),
                      reason = answer.reason.as_deref().unwrap_or(""),
                      "decision query answered unknown");
            }
            DecisionStatus::Abort | DecisionStatus::Commit | DecisionStatus::Pending => {}
        }
        DecisionQueryResponse {
            decision: answer.decision,
            coordinator_id: Some(self.identity.coordinator_id.clone()),
            epoch: Some(self.epoch()),
            incarnation: Some(self.identity.incarnation),
            reason: answer.reason,
        }
    }
}
