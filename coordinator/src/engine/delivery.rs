//! Phase two's retries: a delivery that failed waits for its backoff timer, then starts again;
//! an operator's "retry now" starts every waiting delivery it names at once. A decision is
//! never given up.

use protocol::{ParticipantName, TxId};

use crate::engine::Engine;
use crate::engine::backoff::retry_delay_ms;
use crate::engine::io::Command;
use crate::engine::rules::start_delivery;
use crate::engine::tx::{Delivery, Phase};

impl Engine {
    pub(super) fn delivery_failed(
        &mut self,
        txid: &TxId,
        participant: &ParticipantName,
        error: String,
        jitter: u64,
    ) -> Vec<Command> {
        let config = self.config;
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        match tx.phase {
            Phase::Decided(_) => {}
            Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => return Vec::new(),
        }
        let Some(part) = tx.part_mut(participant) else {
            return Vec::new();
        };
        match part.delivery {
            Delivery::InFlight if !part.acked => {}
            Delivery::InFlight | Delivery::Idle | Delivery::RetryArmed => return Vec::new(),
        }
        part.last_error = Some(error);
        part.delivery = Delivery::RetryArmed;
        vec![Command::ArmRetry {
            txid: txid.clone(),
            participant: participant.clone(),
            after_ms: retry_delay_ms(
                part.attempts,
                config.retry_base_ms,
                config.retry_max_ms,
                jitter,
            ),
        }]
    }

    pub(super) fn retry_due(&mut self, txid: &TxId, participant: &ParticipantName) -> Vec<Command> {
        let Some(tx) = self.live.get_mut(txid) else {
            return Vec::new();
        };
        let decision = match &tx.phase {
            Phase::Decided(decided) => decided.decision,
            Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => return Vec::new(),
        };
        let gtid = tx.attempt.gtid.clone();
        let Some(part) = tx.part_mut(participant) else {
            return Vec::new();
        };
        match part.delivery {
            Delivery::RetryArmed if !part.acked => {}
            Delivery::RetryArmed | Delivery::Idle | Delivery::InFlight => return Vec::new(),
        }
        vec![start_delivery(txid, &gtid, part, decision)]
    }

    /// An operator's "retry now": every delivery of `txid` (or to `participant`, or both)
    /// that waits for its backoff timer starts at once. The timer, when it fires, finds the
    /// delivery in flight and does nothing.
    pub(super) fn retry_now(
        &mut self,
        txid: Option<&TxId>,
        participant: Option<&ParticipantName>,
    ) -> Vec<Command> {
        let mut commands = Vec::new();
        for tx in self.live.values_mut() {
            if txid.is_some_and(|t| *t != tx.id) {
                continue;
            }
            let Phase::Decided(decided) = &tx.phase else {
                continue;
            };
            let decision = decided.decision;
            for part in &mut tx.parts {
                if part.acked
                    || part.delivery != Delivery::RetryArmed
                    || participant.is_some_and(|p| *p != part.name)
                {
                    continue;
                }
                commands.push(start_delivery(&tx.id, &tx.attempt.gtid, part, decision));
            }
        }
        commands
    }
}
