//! What operators did, as the engine keeps it: the attempts they resolved by hand (answered to
//! participants in doubt like a logged decision, for ever) and the newest audit entries.
//!
//! Nothing here decides whether an action is allowed (that is `judge`); this only applies
//! audit entries that are already durable, in log order, so replay gives the same state.

use std::collections::{BTreeMap, VecDeque};

use protocol::operator::{AuditAction, AuditEntry, HandResolution};
use protocol::{Decision, GlobalTxId, TxId};

use crate::records::ResolvedAttempt;

/// Audit entries kept (in memory and in each checkpoint); older ones leave with the log
/// segments a checkpoint lets go. Operator actions are rare: this is months of them.
pub const AUDIT_KEPT: usize = 10_000;

/// What a checkpoint keeps of the operator state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorSnapshot {
    pub resolved: Vec<ResolvedAttempt>,
    pub audit: Vec<AuditEntry>,
    pub next_seq: u64,
    pub hand_resolved: Vec<(TxId, HandResolution)>,
}

#[derive(Debug, Clone, Default)]
pub struct OperatorState {
    /// Kept for ever: a participant may ask about a resolved attempt at any time, and a
    /// resolution is a handful of bytes per manual action.
    resolved: BTreeMap<GlobalTxId, ResolvedAttempt>,
    audit: VecDeque<AuditEntry>,
    next_seq: u64,
    /// `needs_attention` sagas settled by hand (kept for ever: few, and they stay listed).
    hand_resolved: BTreeMap<TxId, HandResolution>,
}

impl OperatorState {
    /// Applies a durable audit entry; `false` when it was applied before (replaying the same
    /// entry again changes nothing).
    pub fn apply(&mut self, entry: AuditEntry) -> bool {
        if entry.seq < self.next_seq {
            return false;
        }
        self.next_seq = entry.seq + 1;
        if let AuditAction::Resolve {
            id, gtid, decision, ..
        } = &entry.action
        {
            let previous = self.resolved.insert(
                gtid.clone(),
                ResolvedAttempt {
                    gtid: gtid.clone(),
                    txid: id.clone(),
                    decision: *decision,
                    audit_seq: entry.seq,
                    at_ms: entry.at_ms,
                    operator: entry.operator.clone(),
                    reason: entry.reason.clone(),
                },
            );
            assert!(
                previous.is_none(),
                "attempt {gtid} was resolved twice; the judge refuses a second resolution"
            );
        }
        if let AuditAction::ResolveSagaByHand { id } = &entry.action {
            self.hand_resolved.insert(
                id.clone(),
                HandResolution {
                    operator: entry.operator.clone(),
                    reason: entry.reason.clone(),
                    at_ms: entry.at_ms,
                    audit_seq: entry.seq,
                },
            );
        }
        self.audit.push_back(entry);
        while self.audit.len() > AUDIT_KEPT {
            self.audit.pop_front();
        }
        true
    }

    pub fn resolved(&self, gtid: &GlobalTxId) -> Option<&ResolvedAttempt> {
        self.resolved.get(gtid)
    }

    /// The newest resolution of an attempt of `txid` (a scan: resolutions are manual, few).
    pub fn resolved_for(&self, txid: &TxId) -> Option<&ResolvedAttempt> {
        self.resolved
            .values()
            .filter(|r| r.txid == *txid)
            .max_by_key(|r| r.audit_seq)
    }

    /// The sequence number the next action gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.max(1)
    }

    /// The newest entries first, at most `limit`, only those with `seq < before` if given.
    pub fn audit(&self, limit: usize, before: Option<u64>) -> Vec<AuditEntry> {
        self.audit
            .iter()
            .rev()
            .filter(|e| before.is_none_or(|b| e.seq < b))
            .take(limit)
            .cloned()
            .collect()
    }

    /// For a checkpoint: every resolution and the kept audit entries.
    pub fn snapshot(&self) -> OperatorSnapshot {
        OperatorSnapshot {
            resolved: self.resolved.values().cloned().collect(),
            audit: self.audit.iter().cloned().collect(),
            next_seq: self.next_seq,
            hand_resolved: self
                .hand_resolved
                .iter()
                .map(|(id, h)| (id.clone(), h.clone()))
                .collect(),
        }
    }

    pub fn restore(snapshot: OperatorSnapshot) -> OperatorState {
        OperatorState {
            resolved: snapshot
                .resolved
                .into_iter()
                .map(|r| (r.gtid.clone(), r))
                .collect(),
            audit: snapshot.audit.into_iter().collect(),
            next_seq: snapshot.next_seq,
            hand_resolved: snapshot.hand_resolved.into_iter().collect(),
        }
    }

    pub fn hand_resolution(&self, id: &TxId) -> Option<&HandResolution> {
        self.hand_resolved.get(id)
    }
}

impl super::Engine {
    /// Applies an operator action whose audit record is durable (live, and in replay).
    pub fn apply_audit(&mut self, entry: AuditEntry) {
        self.audit_in_flight.retain(|e| e.seq != entry.seq);
        let clears = matches!(entry.action, AuditAction::ClearBehind { .. });
        if self.operator.apply(entry) && clears {
            self.clear_behind();
        }
    }

    /// The sequence number the next operator action gets (after those still in flight).
    pub fn next_audit_seq(&self) -> u64 {
        let after_in_flight = self.audit_in_flight.iter().map(|e| e.seq + 1).max();
        self.operator.next_seq().max(after_in_flight.unwrap_or(0))
    }

    /// An operator action's record was submitted to the log under the engine lock; it is
    /// applied (`apply_audit`) once durable, and a checkpoint taken before that includes it.
    pub fn audit_submitted(&mut self, entry: AuditEntry) {
        self.audit_in_flight.push(entry);
    }

    /// The operator state a checkpoint covers: what is applied, plus the actions whose
    /// records are in the log ahead of the checkpoint but not yet durable; and whether one of
    /// them clears the log-behind mark.
    pub(super) fn operator_covered(&self) -> (OperatorSnapshot, bool) {
        let mut covered = self.operator.clone();
        let mut clears = false;
        for entry in &self.audit_in_flight {
            clears |= matches!(entry.action, AuditAction::ClearBehind { .. });
            covered.apply(entry.clone());
        }
        (covered.snapshot(), clears)
    }

    /// The attempt of `txid` an operator resolved last, if any.
    pub fn resolved_gtid_of(&self, txid: &TxId) -> Option<GlobalTxId> {
        self.operator.resolved_for(txid).map(|r| r.gtid.clone())
    }

    /// The status of `txid` as its operator resolution says, for an id the log and the
    /// outcome index no longer hold (the restore case). Participants are not listed: the log
    /// lost which ones the attempt named (the audit entry's evidence has what was asked).
    pub fn resolved_status(&self, txid: &TxId) -> Option<protocol::TransactionStatus> {
        use protocol::{Outcome, TransactionState, TransactionStatus};
        let r = self.operator.resolved_for(txid)?;
        let (state, outcome) = match r.decision {
            Decision::Commit => (TransactionState::Committed, Outcome::Committed),
            Decision::Abort => (TransactionState::Aborted, Outcome::Aborted),
        };
        Some(TransactionStatus {
            id: r.txid.clone(),
            gtid: r.gtid.clone(),
            state,
            outcome: Some(outcome),
            reason: Some(format!(
                "resolved by operator {} (audit #{}): {}",
                r.operator, r.audit_seq, r.reason
            )),
            participants: Vec::new(),
            created_at_ms: r.at_ms,
            decided_at_ms: Some(r.at_ms),
            ended_at_ms: Some(r.at_ms),
            client: None,
        })
    }

    /// The audit trail, newest first.
    pub fn audit(&self, limit: usize, before: Option<u64>) -> Vec<AuditEntry> {
        self.operator.audit(limit, before)
    }

    /// How an operator settled saga `id` by hand, if one did.
    pub fn hand_resolution(&self, id: &TxId) -> Option<HandResolution> {
        self.operator.hand_resolution(id).cloned()
    }

    /// Sagas settled by hand so far.
    pub fn hand_resolved_count(&self) -> u64 {
        self.operator.hand_resolved.len() as u64
    }

    /// Deliveries of `txid` (or to `participant`, or both) waiting for their backoff timer:
    /// what an operator's retry would start now.
    pub fn waiting_deliveries(
        &self,
        txid: Option<&TxId>,
        participant: Option<&protocol::ParticipantName>,
    ) -> u64 {
        self.live
            .values()
            .filter(|tx| txid.is_none_or(|t| *t == tx.id))
            .filter(|tx| matches!(tx.phase, super::Phase::Decided(_)))
            .flat_map(|tx| &tx.parts)
            .filter(|p| {
                !p.acked
                    && p.delivery == super::Delivery::RetryArmed
                    && participant.is_none_or(|n| *n == p.name)
            })
            .count() as u64
    }

    /// The attempt this engine holds for `txid` (live or staged) and the participants it
    /// named; `None` when it holds none (ended and archived, or never begun here).
    pub fn attempt_of(&self, txid: &TxId) -> Option<(GlobalTxId, Vec<protocol::ParticipantName>)> {
        if let Some(tx) = self.live.get(txid) {
            let named = tx.parts.iter().map(|p| p.name.clone()).collect();
            return Some((tx.attempt.gtid.clone(), named));
        }
        self.retained.get(txid).map(|r| {
            let named = r.decision.votes.iter().map(|(p, _)| p.clone()).collect();
            (r.decision.attempt.gtid.clone(), named)
        })
    }

    /// Whether an operator may claim attempt `gtid` as an attempt of `txid` at all: it must be
    /// this coordinator's, and no record here (live, staged, `indexed_owner` from the outcome
    /// index, an earlier resolution) may hold it under another id, and this run must have
    /// given it out if it is this run's. A resolution that passes this still goes to the
    /// judge with the participants' evidence.
    pub fn claim_refusal(
        &self,
        txid: &TxId,
        gtid: &GlobalTxId,
        indexed_owner: Option<&TxId>,
    ) -> Option<super::judge::Refusal> {
        use super::judge::Refusal;
        use protocol::ErrorCode;
        let identity = self.identity.as_ref()?;
        let ours = gtid
            .parts()
            .filter(|(owner, _, _)| *owner == identity.coordinator_id.as_str());
        let Some((_, incarnation, position)) = ours else {
            return Some(Refusal {
                code: ErrorCode::ForeignAttempt,
                message: format!(
                    "{gtid} is not an attempt id of coordinator {} (<coordinator>:<run>:<position>)",
                    identity.coordinator_id
                ),
            });
        };
        let held_as = self
            .owner_of(gtid)
            .map(|owner| owner.txid)
            .or_else(|| indexed_owner.cloned())
            .or_else(|| self.operator.resolved(gtid).map(|r| r.txid.clone()));
        if let Some(owner) = held_as.filter(|owner| owner != txid) {
            return Some(Refusal {
                code: ErrorCode::AttemptIdMismatch,
                message: format!(
                    "attempt {gtid} belongs to transaction {owner}, not {txid}: resolve it under \
                     its own id, if at all"
                ),
            });
        }
        let given_out = self.next_position.saturating_sub(1);
        if position == 0 {
            return Some(Refusal {
                code: ErrorCode::AttemptNotIssued,
                message: format!(
                    "{gtid} is a probe id (position 0): no attempt is ever begun under it, so \
                     nothing is in doubt under it"
                ),
            });
        }
        if incarnation == identity.incarnation && position > given_out {
            return Some(Refusal {
                code: ErrorCode::AttemptNotIssued,
                message: format!(
                    "this run has given out attempts up to position {given_out}; {gtid} was \
                     never given out, so nothing is in doubt under it"
                ),
            });
        }
        None
    }

    /// What this engine itself says about attempt `gtid` of `txid`, for the resolve judge.
    /// The outcome index is the runtime's to consult (before this).
    pub fn own_answer(&self, txid: &TxId, gtid: &GlobalTxId) -> super::judge::OwnAnswer {
        use super::judge::OwnAnswer;
        use protocol::{DecisionQuery, DecisionStatus, Epoch};
        if let Some(resolved) = self.operator.resolved(gtid) {
            return OwnAnswer::Resolved(resolved.decision);
        }
        let Some((_, incarnation, position)) = gtid.parts() else {
            return OwnAnswer::Unknown(format!("{gtid} is not an attempt id of a coordinator"));
        };
        let query = DecisionQuery {
            gtid: gtid.clone(),
            incarnation,
            // Only named in the answer's words; the rule does not depend on it.
            epoch: Epoch(0),
            position,
        };
        let answer = self.decision_for(txid, Some(&query));
        match (answer.decision, answer.reason) {
            (DecisionStatus::Commit, None) => OwnAnswer::Decided(Decision::Commit),
            (DecisionStatus::Abort, None) => OwnAnswer::Decided(Decision::Abort),
            (DecisionStatus::Abort, Some(why)) => OwnAnswer::PresumedAbort(why),
            (DecisionStatus::Pending, _) => OwnAnswer::Pending,
            (DecisionStatus::Unknown, why) | (DecisionStatus::Commit, why @ Some(_)) => {
                OwnAnswer::Unknown(why.unwrap_or_default())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::ParticipantName;
    use protocol::operator::Evidence;

    fn resolve(seq: u64, gtid: &str) -> AuditEntry {
        AuditEntry {
            seq,
            at_ms: 1,
            operator: "ana".into(),
            reason: "restore".into(),
            action: AuditAction::Resolve {
                id: TxId::new("t").unwrap(),
                gtid: GlobalTxId::new(gtid).unwrap(),
                decision: Decision::Abort,
                evidence: Evidence {
                    id: TxId::new("t").unwrap(),
                    gtid: GlobalTxId::new(gtid).unwrap(),
                    coordinator: "unknown".into(),
                    named: None,
                    participants: vec![],
                },
            },
        }
    }

    fn retry(seq: u64) -> AuditEntry {
        AuditEntry {
            seq,
            at_ms: 2,
            operator: "ana".into(),
            reason: "back".into(),
            action: AuditAction::RetryParticipant {
                participant: ParticipantName::new("p").unwrap(),
                retried: 3,
            },
        }
    }

    #[test]
    fn entries_apply_once_in_order_and_resolutions_are_answerable() {
        let mut state = OperatorState::default();
        assert_eq!(state.next_seq(), 1);
        state.apply(resolve(1, "g1"));
        state.apply(retry(2));
        state.apply(resolve(1, "g1")); // replayed again: nothing changes
        assert_eq!(state.next_seq(), 3);
        assert_eq!(
            state
                .resolved(&GlobalTxId::new("g1").unwrap())
                .map(|r| r.decision),
            Some(Decision::Abort)
        );
        let seqs: Vec<u64> = state.audit(10, None).iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![2, 1], "newest first");
        assert_eq!(state.audit(10, Some(2)).len(), 1);
        let back = OperatorState::restore(state.snapshot());
        assert_eq!(back.next_seq(), 3);
        assert!(back.resolved(&GlobalTxId::new("g1").unwrap()).is_some());
    }

    #[test]
    fn the_audit_trail_keeps_the_newest_entries() {
        let mut state = OperatorState::default();
        for seq in 1..=(AUDIT_KEPT as u64 + 5) {
            state.apply(retry(seq));
        }
        let kept = state.audit(usize::MAX, None);
        assert_eq!(kept.len(), AUDIT_KEPT);
        assert_eq!(kept[0].seq, AUDIT_KEPT as u64 + 5);
    }
}
