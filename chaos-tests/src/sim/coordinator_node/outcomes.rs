//! The outcome index and the promises about ended outcomes: archive batches committed by a
//! sync (the oldest evicted past the budget), every staged outcome held somewhere until then,
//! and every decision answer checked against the log and the index.

use coordinator::engine::{AnswerSource, DecisionAnswer, Engine, Event};
use coordinator::records::Retained;
use protocol::{Decision, DecisionQuery, DecisionStatus, GlobalTxId, TxId};

use super::CoordinatorNode;
use crate::sim::io::Io;

impl CoordinatorNode {
    /// Commits the archive batch to the index (one durable write), evicting the oldest beyond
    /// `index_max`, then tells the engine, as the archiver does after its commit.
    pub(super) fn commit_archive(&mut self, io: &mut Io) {
        if self.archive_batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.archive_batch);
        let mut archived = Vec::new();
        for retained in batch {
            let txid = retained.decision.txid.clone();
            archived.push((txid.clone(), retained.decision.attempt.gtid.clone()));
            // Newer wins, as in the real index.
            if self
                .index
                .get(&txid)
                .is_some_and(|old| old.ended_at_ms > retained.ended_at_ms)
            {
                continue;
            }
            self.index.insert(txid, retained);
        }
        while self.index.len() > self.index_max {
            let Some(oldest) = self
                .index
                .values()
                .min_by_key(|r| (r.ended_at_ms, r.decision.attempt.position))
                .map(|r| r.decision.txid.clone())
            else {
                break;
            };
            if let Some(gone) = self.index.remove(&oldest)
                && self.must_hold.get(&oldest) == Some(&gone.decision.attempt.gtid)
            {
                // Evicted by the budget: forgetting it is allowed.
                self.must_hold.remove(&oldest);
            }
        }
        io.note(|| format!("coordinator archives {} outcomes", archived.len()));
        if !archived.is_empty() {
            self.step(io, Event::Archived { archived });
        }
    }

    /// Every staged outcome is still live or staged in the engine, or durable in the index.
    pub(super) fn check_outcomes_held(&mut self) {
        let Some(engine) = &self.engine else {
            return;
        };
        let mut superseded = Vec::new();
        for (txid, gtid) in &self.must_hold {
            let in_engine = engine.status(txid).map(|s| s.gtid);
            let in_index = self
                .index
                .get(txid)
                .map(|r| r.decision.attempt.gtid.clone());
            if in_engine.as_ref() == Some(gtid) || in_index.as_ref() == Some(gtid) {
                continue;
            }
            if in_engine.is_some() {
                // A newer attempt of the id is live: the old outcome was superseded.
                superseded.push(txid.clone());
                continue;
            }
            if self.outcome_violation.is_none() {
                self.outcome_violation = Some(format!(
                    "the outcome of {gtid} ({txid}) left staging before it was durable in the \
                     outcome index (index has {in_index:?})"
                ));
            }
        }
        for txid in superseded {
            self.must_hold.remove(&txid);
        }
    }

    /// The answer `Core::decision_query` gives: the engine's, unless the outcome index holds
    /// the attempt and the engine did not answer from its own record.
    pub(super) fn answer_query(
        &self,
        engine: &Engine,
        txid: &TxId,
        query: &DecisionQuery,
    ) -> DecisionAnswer {
        let answer = engine.decision_for(txid, Some(query));
        if answer.source == AnswerSource::Record {
            return answer;
        }
        match self.indexed(&query.gtid) {
            Some(retained) => DecisionAnswer::from_index(
                txid,
                &retained.decision.txid,
                &query.gtid,
                retained.decision.decision.into(),
            ),
            None => answer,
        }
    }

    /// The index's entry for attempt `gtid`, under whatever id.
    pub fn indexed(&self, gtid: &GlobalTxId) -> Option<&Retained> {
        self.index
            .values()
            .find(|r| r.decision.attempt.gtid == *gtid)
    }

    /// The invariant on every answer: a decision given for an attempt is the one its log
    /// record or index entry holds, and only under the id it was begun with (the broken
    /// promise, if any).
    pub(super) fn check_answer(
        &self,
        engine: &Engine,
        txid: &TxId,
        query: &DecisionQuery,
        answer: DecisionStatus,
    ) -> Option<String> {
        let given = match answer {
            DecisionStatus::Commit => Decision::Commit,
            DecisionStatus::Abort => Decision::Abort,
            DecisionStatus::Pending | DecisionStatus::Unknown => return None,
        };
        let held = engine
            .owner_of(&query.gtid)
            .and_then(|owner| {
                let decided = match owner.answer {
                    DecisionStatus::Commit => Some(Decision::Commit),
                    DecisionStatus::Abort => Some(Decision::Abort),
                    DecisionStatus::Pending | DecisionStatus::Unknown => None,
                };
                decided.map(|d| (owner.txid, d))
            })
            .or_else(|| {
                self.indexed(&query.gtid)
                    .map(|r| (r.decision.txid.clone(), r.decision.decision))
            });
        match held {
            Some((owner, _)) if owner != *txid => Some(format!(
                "answered {given:?} for {} asked as {txid}, but it is an attempt of {owner}",
                query.gtid
            )),
            Some((_, decided)) if decided != given => Some(format!(
                "answered {given:?} for {} ({txid}), but its log or index holds {decided:?}",
                query.gtid
            )),
            _ => None,
        }
    }
}
