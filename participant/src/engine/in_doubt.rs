//! In doubt: prepared transactions with no decision ask the coordinator, with capped
//! exponential backoff and jitter, and obey only its `commit` or `abort`.

use protocol::{DecisionStatus, TxId};

use super::{Command, Engine};
use crate::resource::Resource;

impl<R: Resource> Engine<R> {
    pub(super) fn tick(&mut self, now_ms: u64) -> Vec<Command> {
        let mut commands = Vec::new();
        for (txid, prepared) in self.prepared.iter_mut() {
            if !prepared.asking && prepared.next_ask_at_ms <= now_ms {
                prepared.asking = true;
                commands.push(Command::AskDecision { txid: txid.clone() });
            }
        }
        commands
    }

    pub(super) fn decision_answer(
        &mut self,
        txid: TxId,
        answer: Option<DecisionStatus>,
        now_ms: u64,
        entropy: u64,
    ) -> Vec<Command> {
        let Some(prepared) = self.prepared.get_mut(&txid) else {
            // Decided meanwhile by the coordinator's own resend.
            return Vec::new();
        };
        let (coordinator_id, epoch) = (prepared.coordinator_id.clone(), prepared.epoch);
        match answer {
            Some(DecisionStatus::Commit) => {
                vec![self.commit_prepared(&txid, coordinator_id, epoch, now_ms)]
            }
            Some(DecisionStatus::Abort) => {
                vec![self.abort_prepared(&txid, coordinator_id, epoch, now_ms)]
            }
            Some(DecisionStatus::Pending) | None => {
                prepared.asking = false;
                prepared.asks = prepared.asks.saturating_add(1);
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
}

/// Capped exponential backoff: `base * 2^(attempt-1)`, at most `max`.
pub fn backoff_ms(base_ms: u64, max_ms: u64, attempt: u32) -> u64 {
    let shift = attempt.saturating_sub(1).min(32);
    base_ms.saturating_mul(1u64 << shift).min(max_ms)
}
