//! The invariants: every answer to an op id is its first one (unless the retention may have
//! taken it), receipts name their own write, refusals are the expected ones, and the fence's
//! durable history never goes down in token, never holds a forged token it should have
//! refused, and never applies an op twice within the answers' retention; and the outbox holds
//! an intent exactly for each worker write held, in seq order per aggregate.

use std::collections::BTreeMap;

use participant::Rejection;
use participant::fence::FencedAnswer;
use participant::record::Record;

use crate::sim::fencing_adversary::Forged;

use super::{Applied, JUMP_MAX, RESTART_STEP_MS, RETENTION, World};

impl World {
    pub(super) fn written(
        &mut self,
        worker: usize,
        op_id: String,
        answer: FencedAnswer,
    ) -> Result<(), String> {
        self.workers[worker].unanswered.remove(&op_id);
        if let (FencedAnswer::Applied { receipt, .. }, Some(payload)) =
            (&answer, self.payloads.get(&op_id))
        {
            // The receipt names the key this op wrote, never another write's.
            // (A write with intents answers every key written: `[{"key","version"}]`.)
            let key = payload["ops"][0]["key"].as_str();
            let named = receipt["key"].as_str().or(receipt[0]["key"].as_str());
            if named != key {
                return Err(format!(
                    "op {op_id} was answered another write's receipt {receipt}"
                ));
            }
        }
        match self.first_answers.get(&op_id) {
            None => {
                match &answer {
                    FencedAnswer::Applied { .. } => self.stats.applied += 1,
                    FencedAnswer::Stale(_) => self.stats.stale += 1,
                }
                self.answered_at.insert(op_id.clone(), self.now);
                self.first_answers.insert(op_id, answer);
            }
            Some(first) => {
                self.stats.repeats += 1;
                // A refusal is remembered in memory (and checkpoints), not logged: after a
                // crash its repeat is refused again, with the highest of then; and once the
                // answers' retention took it, a repeat is a new write (as documented).
                let same = match (first, &answer) {
                    (FencedAnswer::Stale(a), FencedAnswer::Stale(b)) => {
                        a.token == b.token && a.resource == b.resource
                    }
                    (FencedAnswer::Stale(_), FencedAnswer::Applied { .. }) => {
                        return Err(format!(
                            "op {op_id} answered {first:?} first, then applied: {answer:?}"
                        ));
                    }
                    (a, b) => a == b || self.may_have_been_pruned(&op_id),
                };
                if !same {
                    return Err(format!(
                        "op {op_id} answered {first:?} first, then {answer:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether the retention may have taken `op_id`'s answer by now: it was first applied or
    /// answered longer ago than the answers' retention, less the clock steps restarts bring.
    fn may_have_been_pruned(&self, op_id: &str) -> bool {
        let old =
            |at: u64| self.now.saturating_sub(at) + RESTART_STEP_MS * 4 >= RETENTION.answers_ms;
        self.answered_at.get(op_id).is_some_and(|at| old(*at))
            || self.history.iter().any(|applied| {
                matches!(applied, Applied::Write { op_id: o, at, .. } if o == op_id && old(*at))
            })
    }

    pub(super) fn refused(
        &mut self,
        op_id: &str,
        forged: Option<Forged>,
        rejection: &Rejection,
    ) -> Result<(), String> {
        match (forged, rejection) {
            (Some(Forged::ReusedOpId), Rejection::OpIdConflict { .. }) => {
                self.stats.op_id_conflicts += 1;
                Ok(())
            }
            (Some(_), Rejection::FenceRefused(_) | Rejection::OpIdConflict { .. }) => Ok(()),
            (_, Rejection::KeyLocked { .. }) => Ok(()),
            // A resend after retention took the op's answer: its intent, still kept, refuses
            // it (the outbox keeps a write from applying twice where the op id no longer can).
            (None, Rejection::EventIdConflict { .. }) if self.may_have_been_pruned(op_id) => Ok(()),
            (None, Rejection::EventIdConflict { .. }) => Err(format!(
                "op {op_id} answered id_conflict within the answers' retention: its first \
                 answer was taken early"
            )),
            (forged, rejection) => Err(format!(
                "op {op_id} ({forged:?}) refused unexpectedly: {rejection}"
            )),
        }
    }

    pub(super) fn check(&self) -> Result<(), String> {
        let mut highest = 0;
        let mut applied_at: BTreeMap<&str, u64> = BTreeMap::new();
        for event in &self.history {
            match event {
                Applied::Reset { to } => highest = *to,
                Applied::Write {
                    token, op_id, at, ..
                } => {
                    if *token < highest {
                        return Err(format!(
                            "write {op_id} with token {token} applied after token {highest}"
                        ));
                    }
                    if *token > highest.saturating_add(JUMP_MAX) && op_id.starts_with('f') {
                        return Err(format!(
                            "forged write {op_id} with token {token} applied, more than \
                             {JUMP_MAX} above {highest}"
                        ));
                    }
                    if self.keys.is_some() && op_id.starts_with('f') {
                        return Err(format!(
                            "forged write {op_id} (token {token}) applied at a participant that \
                             checks proofs"
                        ));
                    }
                    highest = *token;
                    if let Some(first) = applied_at.insert(op_id, *at)
                        && at.saturating_sub(first) + RESTART_STEP_MS * 4 < RETENTION.answers_ms
                    {
                        return Err(format!(
                            "op {op_id} applied twice, {} ms apart (within the answers' \
                             retention of {} ms)",
                            at - first,
                            RETENTION.answers_ms
                        ));
                    }
                }
            }
        }
        // A write answered stale_token is never applied later (by a retry or a late copy).
        for (op_id, answer) in &self.first_answers {
            if matches!(answer, FencedAnswer::Stale(_))
                && applied_at.contains_key(op_id.as_str())
                && !self.may_have_been_pruned(op_id)
            {
                return Err(format!(
                    "op {op_id} was answered stale_token and later applied"
                ));
            }
        }
        // Every write acknowledged as applied is in the durable history or still on its way.
        for (op_id, answer) in &self.first_answers {
            if matches!(answer, FencedAnswer::Applied { .. })
                && !applied_at.contains_key(op_id.as_str())
                && !self
                    .part_log
                    .pending
                    .iter()
                    .any(|r| matches!(r, Record::FencedWrite { op_id: o, .. } if o == op_id))
            {
                return Err(format!("op {op_id} was acknowledged and then lost"));
            }
        }
        self.check_outbox()
    }

    /// The outbox: a worker's write and its intent are one fact (the intent exists exactly for
    /// the worker writes the participant holds, durable or not yet synced, across crashes),
    /// and each aggregate's seqs are 1, 2, 3... in the order its writes were applied.
    fn check_outbox(&self) -> Result<(), String> {
        // The event ids the participant holds writes for: durable, or not yet synced.
        let mut held: Vec<(&str, &str)> = Vec::new();
        for applied in &self.history {
            if let Applied::Write { op_id, intents, .. } = applied {
                held.extend(intents.iter().map(|e| (e.as_str(), op_id.as_str())));
            }
        }
        for record in &self.part_log.pending {
            if let Record::FencedWrite { op_id, next, .. } = record {
                held.extend(next.iter().map(|i| (i.event_id.as_str(), op_id.as_str())));
            }
        }
        let outbox = self.part.outbox();
        let mut seqs: BTreeMap<&str, u64> = BTreeMap::new();
        for entry in outbox.entries() {
            if !held.contains(&(entry.event_id.as_str(), entry.op_id.as_str())) {
                return Err(format!(
                    "intent {} exists without its write {}",
                    entry.event_id, entry.op_id
                ));
            }
            let seq = seqs.entry(entry.aggregate.as_str()).or_insert(0);
            *seq += 1;
            if entry.seq != *seq {
                return Err(format!(
                    "intent {} of {} has seq {}, expected {} (write order)",
                    entry.event_id, entry.aggregate, entry.seq, seq
                ));
            }
        }
        for (event_id, op_id) in held {
            if outbox.get(event_id).is_none() {
                return Err(format!(
                    "write {op_id} is held without its intent {event_id}"
                ));
            }
        }
        Ok(())
    }
}
