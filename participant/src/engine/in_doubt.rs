//! In doubt: prepared attempts with no decision ask the coordinator, with capped exponential
//! backoff and jitter, and obey only its `commit` or `abort`.

use protocol::{DecisionQuery, DecisionQueryResponse, DecisionStatus, GlobalTxId};

use super::Engine;
use super::sender::Sender;
use super::types::Command;
use crate::record::Fence;
use crate::resource::Resource;

impl<R: Resource> Engine<R> {
    pub(super) fn tick(&mut self, now_ms: u64) -> Vec<Command> {
        let mut commands = Vec::new();
        for (gtid, prepared) in self.prepared.iter_mut() {
            if !prepared.asking && prepared.next_ask_at_ms <= now_ms {
                prepared.asking = true;
                commands.push(Command::AskDecision {
                    txid: prepared.txid.clone(),
                    query: DecisionQuery {
                        gtid: gtid.clone(),
                        incarnation: prepared.incarnation,
                        epoch: prepared.epoch,
                        position: prepared.position,
                    },
                });
            }
        }
        commands
    }

    pub(super) fn decision_answer(
        &mut self,
        gtid: GlobalTxId,
        answer: Option<DecisionQueryResponse>,
        now_ms: u64,
        entropy: u64,
    ) -> Vec<Command> {
        let (Some(prepared), Some(sender)) = (self.prepared.get(&gtid), self.current_fence(&gtid))
        else {
            // Decided meanwhile by the coordinator's own resend.
            return Vec::new();
        };
        let obeyed = answer.as_ref().and_then(|answer| {
            // Only the coordinator that prepared it may decide it: another one (a wiped data
            // directory, a misconfigured URL) has no record and would presume abort.
            let same_coordinator = answer
                .coordinator_id
                .as_ref()
                .is_none_or(|id| *id == prepared.coordinator_id);
            // An answer from an epoch lower than one this participant has seen comes from a
            // stale process or a restored copy of the log: it may not know the decision. So
            // does one from another run at the very epoch this participant holds (the fence
            // would refuse that run's messages as `incarnation_conflict`).
            let current = match answer.epoch {
                None => true,
                Some(epoch) if epoch == sender.epoch => answer
                    .incarnation
                    .is_none_or(|incarnation| incarnation == sender.incarnation),
                Some(epoch) => epoch > sender.epoch,
            };
            (same_coordinator && current).then_some(answer.decision)
        });
        match obeyed {
            Some(DecisionStatus::Commit) => vec![self.commit_prepared(&gtid, &sender, now_ms)],
            Some(DecisionStatus::Abort) => vec![self.abort_prepared(&gtid, &sender, now_ms)],
            Some(DecisionStatus::Pending) | Some(DecisionStatus::Unknown) | None => {
                let last_answer = match (&answer, obeyed) {
                    (Some(a), Some(_)) => Some(match &a.reason {
                        Some(reason) => format!("{}: {reason}", status_name(a.decision)),
                        None => status_name(a.decision).to_string(),
                    }),
                    (Some(a), None) => Some(ignored(a, &sender)),
                    (None, _) => None,
                };
                let Some(prepared) = self.prepared.get_mut(&gtid) else {
                    return Vec::new();
                };
                prepared.asking = false;
                prepared.asks = prepared.asks.saturating_add(1);
                if last_answer.is_some() {
                    prepared.last_answer = last_answer;
                }
                let delay_ms = backoff_ms(
                    self.config.decision_backoff_base_ms,
                    self.config.decision_backoff_max_ms,
                    prepared.asks,
                );
                let jitter_ms = entropy % (delay_ms / 2 + 1);
                prepared.next_ask_at_ms = now_ms.saturating_add(delay_ms + jitter_ms);
                Vec::new()
            }
        }
    }

    /// The fence a decision record obtained by asking carries: the highest this participant
    /// holds for the coordinator (an answer to a query raises no epoch: it is not a message
    /// the coordinator sent, only one this participant fetched).
    fn current_fence(&self, gtid: &GlobalTxId) -> Option<Sender> {
        let prepared = self.prepared.get(gtid)?;
        let fence = self
            .epochs
            .get(&prepared.coordinator_id)
            .copied()
            .unwrap_or(Fence {
                epoch: prepared.epoch,
                incarnation: prepared.incarnation,
            });
        Some(Sender {
            coordinator_id: prepared.coordinator_id.clone(),
            epoch: fence.epoch,
            incarnation: fence.incarnation,
        })
    }
}

/// Why an answer was not obeyed, for `last_answer`: which run answered, which run this
/// participant holds the coordinator's epoch of, and what the answer said.
fn ignored(answer: &DecisionQueryResponse, held: &Sender) -> String {
    let by = answer
        .coordinator_id
        .as_ref()
        .map_or("an unnamed coordinator".to_string(), |c| {
            format!("coordinator {c}")
        });
    let run = match (answer.epoch, answer.incarnation) {
        (Some(epoch), Some(incarnation)) => format!("epoch {epoch} run {incarnation}"),
        (Some(epoch), None) => format!("epoch {epoch}"),
        (None, _) => "no epoch".to_string(),
    };
    let why = if answer
        .coordinator_id
        .as_ref()
        .is_some_and(|c| *c != held.coordinator_id)
    {
        format!(
            "it is not {}, which prepared this attempt",
            held.coordinator_id
        )
    } else if answer.epoch.is_some_and(|e| e < held.epoch) {
        format!("its epoch is lower than {} already seen", held.epoch)
    } else {
        format!(
            "epoch {} belongs to run {} here (a restored copy of the coordinator's log?)",
            held.epoch, held.incarnation
        )
    };
    let said = match &answer.reason {
        Some(reason) => format!("{}: {reason}", status_name(answer.decision)),
        None => status_name(answer.decision).to_string(),
    };
    format!("ignored {said:?} from {by} at {run}: {why}")
}

fn status_name(status: DecisionStatus) -> &'static str {
    match status {
        DecisionStatus::Commit => "commit",
        DecisionStatus::Abort => "abort",
        DecisionStatus::Pending => "pending",
        DecisionStatus::Unknown => "unknown",
    }
}

/// Capped exponential backoff: `base * 2^(attempt-1)`, at most `max`.
pub fn backoff_ms(base_ms: u64, max_ms: u64, attempt: u32) -> u64 {
    let shift = attempt.saturating_sub(1).min(32);
    base_ms.saturating_mul(1u64 << shift).min(max_ms)
}
