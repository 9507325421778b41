//! Read-only views of the table: status, listing, the decision for participants in doubt, and
//! the counts the metrics show.

use protocol::{
    DecisionQuery, DecisionStatus, GlobalTxId, Outcome, ParticipantStatus, TransactionState,
    TransactionStatus, TxId,
};

use crate::engine::Engine;
use crate::engine::tx::{Delivery, Phase, Tx, outcome_of};
use crate::records::Retained;

/// Where a decision answer comes from. The runtime asks the outcome index about anything the
/// engine could not answer from its own record of the attempt: the index outranks a
/// resolution, a presumption and an `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerSource {
    /// The engine's live or staged record of this attempt under this id.
    Record,
    /// An operator's resolution of this attempt under this id.
    Resolution,
    /// Presumed abort: the log provably covers the attempt and holds no decision for it.
    Presumed,
    /// Nothing here can prove either outcome.
    Unknown,
}

/// The answer to a participant's decision query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionAnswer {
    pub decision: DecisionStatus,
    /// Why, for a presumed abort or an `unknown`.
    pub reason: Option<String>,
    pub source: AnswerSource,
    /// The query named a run (incarnation) this log does not hold. Counted, never believed:
    /// only a participant's refusal of a message this run sent proves the log is behind.
    pub unknown_run: bool,
}

impl DecisionAnswer {
    fn known(decision: DecisionStatus) -> Self {
        DecisionAnswer {
            decision,
            reason: None,
            source: AnswerSource::Record,
            unknown_run: false,
        }
    }

    /// `unknown`, with why.
    pub fn unknown(reason: String) -> Self {
        DecisionAnswer {
            decision: DecisionStatus::Unknown,
            reason: Some(reason),
            source: AnswerSource::Unknown,
            unknown_run: false,
        }
    }

    /// The answer from the outcome index's entry for the attempt, which ended as `owner`.
    pub fn from_index(
        txid: &TxId,
        owner: &TxId,
        gtid: &GlobalTxId,
        decision: DecisionStatus,
    ) -> Self {
        if owner == txid {
            return DecisionAnswer::known(decision);
        }
        DecisionAnswer::unknown(format!(
            "attempt {gtid} ended as transaction {owner}, not {txid}: ask with the id it was \
             prepared under"
        ))
    }
}

/// The transaction an attempt belongs to, and its answer now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub txid: TxId,
    pub answer: DecisionStatus,
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
    /// out again, so nothing can commit it after "abort" was said. The runtime then lets the
    /// outcome index outrank anything not answered from a record (`AnswerSource`).
    ///
    /// An attempt is only ever answered under the id it was begun with: a question pairing it
    /// with another id is `unknown`, whether the attempt is live, staged or resolved.
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
    /// Anything else is `unknown`: a run this log does not hold (a restored copy of the data
    /// directory, or a made-up run: a query is a claim, not evidence, so it is counted and
    /// nothing more), a position this run never gave out, a gtid that is not this
    /// coordinator's, or no query at all.
    pub fn decision_for(&self, txid: &TxId, query: Option<&DecisionQuery>) -> DecisionAnswer {
        let Some(query) = query else {
            return DecisionAnswer::unknown(
                "the query names no attempt (gtid, incarnation, epoch and position from the \
                 prepare); only an attempt can be answered"
                    .to_string(),
            );
        };
        // The usual question names the attempt's own id: two lookups. Otherwise a scan of the
        // live set (bounded by admission control) finds an attempt asked about under another.
        let own = self
            .live
            .get(txid)
            .filter(|tx| tx.attempt.gtid == query.gtid)
            .map(|tx| Owner {
                txid: tx.id.clone(),
                answer: live_answer(tx),
            })
            .or_else(|| {
                self.retained
                    .get(txid)
                    .filter(|r| r.decision.attempt.gtid == query.gtid)
                    .map(|r| Owner {
                        txid: r.decision.txid.clone(),
                        answer: r.decision.decision.into(),
                    })
            });
        if let Some(owner) = own.or_else(|| self.owner_of(&query.gtid)) {
            if owner.txid != *txid {
                return DecisionAnswer::unknown(format!(
                    "attempt {} belongs to transaction {}, not {txid}: ask with the id it was \
                     prepared under",
                    query.gtid, owner.txid
                ));
            }
            return DecisionAnswer::known(owner.answer);
        }
        if let Some(resolved) = self.operator.resolved(&query.gtid) {
            if resolved.txid != *txid {
                return DecisionAnswer::unknown(format!(
                    "attempt {} was resolved as transaction {}, not {txid}",
                    query.gtid, resolved.txid
                ));
            }
            return DecisionAnswer {
                decision: resolved.decision.into(),
                reason: None,
                source: AnswerSource::Resolution,
                unknown_run: false,
            };
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
                "this coordinator's log holds no run {} (epoch {}): if a run of this \
                 coordinator began the attempt, its log is gone (a restored backup or a \
                 rolled-back disk), so its outcome cannot be known from here",
                query.incarnation, query.epoch
            ));
            answer.unknown_run = true;
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
                source: AnswerSource::Presumed,
                unknown_run: false,
            };
        }
        DecisionAnswer::unknown(format!(
            "attempt {} at position {} was never given out by this run (it has given out \
             positions up to {})",
            query.gtid, query.position, span.reach
        ))
    }

    /// Who holds attempt `gtid` here (live or staged), whatever id a question names, and
    /// what a participant asking about it is told.
    pub fn owner_of(&self, gtid: &GlobalTxId) -> Option<Owner> {
        if let Some(tx) = self.live.values().find(|tx| tx.attempt.gtid == *gtid) {
            return Some(Owner {
                txid: tx.id.clone(),
                answer: live_answer(tx),
            });
        }
        self.retained.of_attempt(gtid).map(|r| Owner {
            txid: r.decision.txid.clone(),
            answer: r.decision.decision.into(),
        })
    }

    /// How far the log holds each run, oldest first (for `/readyz` details and tests).
    pub fn runs(&self) -> impl Iterator<Item = &crate::records::RunSpan> {
        self.runs.values()
    }

    /// Transactions not yet ended (preparing, or decided and collecting acknowledgements).
    pub fn live_count(&self) -> usize {
        self.live.len()
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

/// What a participant asking about a live attempt is told.
fn live_answer(tx: &Tx) -> DecisionStatus {
    match &tx.phase {
        Phase::Decided(decided) => decided.decision.into(),
        // Not durable yet (or unknowable after a log failure): ask again.
        Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => DecisionStatus::Pending,
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
