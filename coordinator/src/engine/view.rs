//! Read-only views of the table: status, listing, the decision for participants in doubt, and
//! the counts the metrics show.

use protocol::{
    DecisionQuery, DecisionStatus, GlobalTxId, Outcome, ParticipantStatus, TransactionState,
    TransactionStatus, TxId,
};

use crate::engine::Engine;
use crate::engine::tx::{Delivery, Phase, Tx, outcome_of};
use crate::records::Retained;

/// The answer to a participant's decision query, and what the query showed about this log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionAnswer {
    pub decision: DecisionStatus,
    /// Why, for a presumed abort or an `unknown`.
    pub reason: Option<String>,
    /// The query proves this log is behind what participants have seen: the attempt was
    /// prepared under a run this log does not hold (a restored backup, a rolled-back disk).
    /// The runtime stops taking new work when it sees this.
    pub behind: Option<String>,
}

impl DecisionAnswer {
    fn known(decision: DecisionStatus) -> Self {
        DecisionAnswer {
            decision,
            reason: None,
            behind: None,
        }
    }

    fn unknown(reason: String) -> Self {
        DecisionAnswer {
            decision: DecisionStatus::Unknown,
            reason: Some(reason),
            behind: None,
        }
    }
}

/// Counts for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    pub preparing: u64,
    pub committing: u64,
    pub aborting: u64,
    pub retained: u64,
    /// Participants that have not acknowledged a durable decision.
    pub pending_acks: u64,
    /// When the oldest decision still waiting for an acknowledgement was made: what an alert
    /// on stuck phase two looks at (a count alone cannot tell a backlog from a stuck one).
    pub oldest_pending_ack_decided_at_ms: Option<u64>,
}

impl Engine {
    pub fn status(&self, txid: &TxId) -> Option<TransactionStatus> {
        if let Some(tx) = self.live.get(txid) {
            return Some(live_status(tx));
        }
        self.retained.get(txid).map(retained_status)
    }

    /// Transactions in `state` (all when `None`), at most `limit`: live ones first, oldest
    /// created first, then ended ones, oldest ended first. Cost follows `limit` and the live
    /// set, not the number of retained outcomes (this runs under the engine lock).
    pub fn list(&self, state: Option<TransactionState>, limit: usize) -> Vec<TransactionStatus> {
        let wanted = |s: &TransactionStatus| state.is_none_or(|w| s.state == w);
        let mut out: Vec<TransactionStatus> =
            self.live.values().map(live_status).filter(wanted).collect();
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        out.truncate(limit);
        let ended_wanted = state
            .is_none_or(|w| matches!(w, TransactionState::Committed | TransactionState::Aborted));
        if ended_wanted && out.len() < limit {
            let room = limit - out.len();
            out.extend(
                self.retained
                    .iter()
                    .map(retained_status)
                    .filter(wanted)
                    .take(room),
            );
        }
        out
    }

    /// Live transactions in `state` (all when `None`), oldest created first, at most `limit`.
    pub fn list_live(
        &self,
        state: Option<TransactionState>,
        limit: usize,
    ) -> Vec<TransactionStatus> {
        let mut out: Vec<TransactionStatus> = self
            .live
            .values()
            .map(live_status)
            .filter(|s| state.is_none_or(|w| s.state == w))
            .collect();
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        out.truncate(limit);
        out
    }

    /// Staged outcomes (ended, not yet in the index) in `state`, oldest ended first, at most
    /// `limit`, leaving out ids in `shown` (listed from the index already).
    pub fn list_staged(
        &self,
        state: Option<TransactionState>,
        limit: usize,
        shown: &std::collections::HashSet<TxId>,
    ) -> Vec<TransactionStatus> {
        self.retained
            .iter()
            .filter(|r| !shown.contains(&r.decision.txid))
            .map(retained_status)
            .filter(|s| state.is_none_or(|w| s.state == w))
            .take(limit)
            .collect()
    }

    /// What a participant in doubt about attempt `query.gtid` of client id `txid` is told.
    /// Pure and free: presumed abort needs no record, because an attempt's id is never given
    /// out again, so nothing can commit it after "abort" was said.
    ///
    /// Presumed abort is given only where this log provably covers the question:
    /// - an earlier run (incarnation) this log holds: that run ended before this one started
    ///   on this log, so everything it made durable is here (recovery relies on the same fact
    ///   when it aborts the attempts that run began and never decided). An attempt of it with
    ///   no decision here was never decided: its Begin may be missing too (lost with the
    ///   unsynced tail in a crash), and then so was any decision, which follows the Begin;
    /// - this run, at a position it has given out: every such attempt is live (answered
    ///   above) or ended and forgotten.
    ///
    /// Anything else is `unknown`. A run this log does not hold means the log was rolled back
    /// (a restored copy of the data directory): `behind` says so. A position this run never
    /// gave out, a gtid that is not this coordinator's, or no query at all cannot be proven
    /// either way.
    pub fn decision_for(&self, txid: &TxId, query: Option<&DecisionQuery>) -> DecisionAnswer {
        let Some(query) = query else {
            return DecisionAnswer::unknown(
                "the query names no attempt (gtid, incarnation, epoch and position from the \
                 prepare); only an attempt can be answered"
                    .to_string(),
            );
        };
        if let Some(tx) = self
            .live
            .get(txid)
            .filter(|tx| tx.attempt.gtid == query.gtid)
        {
            return DecisionAnswer::known(match &tx.phase {
                Phase::Decided(decided) => decided.decision.into(),
                // Not durable yet (or unknowable after a log failure): ask again.
                Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => {
                    DecisionStatus::Pending
                }
            });
        }
        if let Some(retained) = self
            .retained
            .get(txid)
            .filter(|r| r.decision.attempt.gtid == query.gtid)
        {
            return DecisionAnswer::known(retained.decision.decision.into());
        }
        if let Some(resolved) = self.operator.resolved(&query.gtid) {
            return DecisionAnswer::known(resolved.decision.into());
        }
        // The span alone would presume abort for an attempt that is still live under another
        // client id (a participant that mixed up its ids), and its coming decision could be
        // commit: never presume for an attempt that can still be decided.
        if let Some(tx) = self.live.values().find(|tx| tx.attempt.gtid == query.gtid) {
            return DecisionAnswer::unknown(format!(
                "attempt {} belongs to transaction {}, not {txid}: ask with the id it was \
                 prepared under",
                query.gtid, tx.id
            ));
        }
        let Some(identity) = &self.identity else {
            return DecisionAnswer::unknown("the coordinator is recovering".to_string());
        };
        let composed =
            GlobalTxId::compose(&identity.coordinator_id, query.incarnation, query.position);
        if composed != query.gtid {
            return DecisionAnswer::unknown(format!(
                "attempt {} is not an attempt of coordinator {} begun as position {} of run {}",
                query.gtid, identity.coordinator_id, query.position, query.incarnation
            ));
        }
        let Some(span) = self.runs.get(&query.incarnation) else {
            let mut answer = DecisionAnswer::unknown(format!(
                "this coordinator's log holds no run {} (epoch {}): the attempt was begun by a \
                 run whose log is gone (a restored backup or a rolled-back disk), so its \
                 outcome cannot be known from here",
                query.incarnation, query.epoch
            ));
            answer.behind = Some(format!(
                "a participant prepared {} under run {} at epoch {}, which this log does not \
                 hold (this run is {} at epoch {})",
                query.gtid, query.incarnation, query.epoch, identity.incarnation, identity.epoch
            ));
            return answer;
        };
        let this_run = query.incarnation == identity.incarnation;
        if !this_run || query.position <= span.reach {
            let covered = if this_run {
                format!("this run has given out positions up to {}", span.reach)
            } else {
                format!(
                    "run {} ended before this one started on this log, which holds all it \
                     made durable",
                    query.incarnation
                )
            };
            return DecisionAnswer {
                decision: DecisionStatus::Abort,
                reason: Some(format!(
                    "presumed abort: {covered}, and no decision for {}",
                    query.gtid
                )),
                behind: None,
            };
        }
        DecisionAnswer::unknown(format!(
            "attempt {} at position {} was never given out by this run (it has given out \
             positions up to {})",
            query.gtid, query.position, span.reach
        ))
    }

    /// How far the log holds each run, oldest first (for `/readyz` details and tests).
    pub fn runs(&self) -> impl Iterator<Item = &crate::records::RunSpan> {
        self.runs.values()
    }

    pub fn gauges(&self) -> Gauges {
        let mut gauges = Gauges {
            retained: self.retained.len() as u64,
            ..Gauges::default()
        };
        for tx in self.live.values() {
            match live_state(tx) {
                TransactionState::Preparing => gauges.preparing += 1,
                TransactionState::Committing => gauges.committing += 1,
                TransactionState::Aborting => gauges.aborting += 1,
                TransactionState::Committed | TransactionState::Aborted => {}
            }
            if let Phase::Decided(decided) = &tx.phase {
                let unacked = tx.parts.iter().filter(|p| !p.acked).count() as u64;
                gauges.pending_acks += unacked;
                if unacked > 0 {
                    gauges.oldest_pending_ack_decided_at_ms = Some(
                        gauges
                            .oldest_pending_ack_decided_at_ms
                            .map_or(decided.decided_at_ms, |t| t.min(decided.decided_at_ms)),
                    );
                }
            }
        }
        gauges
    }

    /// Participants with a phase-two delivery waiting for its retry timer (for tests).
    pub fn retrying(&self) -> usize {
        self.live
            .values()
            .flat_map(|tx| &tx.parts)
            .filter(|p| p.delivery == Delivery::RetryArmed)
            .count()
    }
}

fn live_state(tx: &Tx) -> TransactionState {
    match &tx.phase {
        Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => {
            TransactionState::Preparing
        }
        Phase::Decided(decided) => match outcome_of(decided.decision) {
            Outcome::Committed => TransactionState::Committing,
            Outcome::Aborted => TransactionState::Aborting,
        },
    }
}

fn live_status(tx: &Tx) -> TransactionStatus {
    let (outcome, reason, decided_at_ms) = match &tx.phase {
        Phase::Decided(decided) => (
            Some(outcome_of(decided.decision)),
            decided.reason.clone(),
            Some(decided.decided_at_ms),
        ),
        Phase::LogFailed { error } => (None, Some(format!("log failed: {error}")), None),
        Phase::Preparing | Phase::Deciding(_) => (None, None, None),
    };
    TransactionStatus {
        id: tx.id.clone(),
        gtid: tx.attempt.gtid.clone(),
        state: live_state(tx),
        outcome,
        reason,
        participants: tx
            .parts
            .iter()
            .map(|p| ParticipantStatus {
                name: p.name.clone(),
                vote: p.vote,
                acked: p.acked,
                attempts: p.attempts,
                last_error: p.last_error.clone(),
            })
            .collect(),
        created_at_ms: tx.created_at_ms,
        decided_at_ms,
        ended_at_ms: None,
        client: tx.client.clone(),
    }
}

/// How an ended outcome (staged or from the index) is shown.
pub fn retained_status(retained: &Retained) -> TransactionStatus {
    let record = &retained.decision;
    let outcome = outcome_of(record.decision);
    TransactionStatus {
        id: record.txid.clone(),
        gtid: record.attempt.gtid.clone(),
        state: match outcome {
            Outcome::Committed => TransactionState::Committed,
            Outcome::Aborted => TransactionState::Aborted,
        },
        outcome: Some(outcome),
        reason: record.reason.clone(),
        participants: record
            .votes
            .iter()
            .map(|(name, vote)| ParticipantStatus {
                name: name.clone(),
                vote: Some(*vote),
                acked: true,
                attempts: 0,
                last_error: None,
            })
            .collect(),
        created_at_ms: record.created_at_ms,
        decided_at_ms: Some(record.decided_at_ms),
        ended_at_ms: Some(retained.ended_at_ms),
        client: record.client.clone(),
    }
}
