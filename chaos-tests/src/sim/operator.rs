//! The operator of the simulated cluster, after the faults heal: for every attempt a
//! participant holds in doubt because the coordinator cannot decide it (a restore lost its
//! run), gather the evidence as `GET /v1/transactions/{id}/evidence` does, let the
//! coordinator's own judge rule, and resolve as `POST .../resolve` does. Like the documented
//! procedure, a coordinator whose log is behind is restarted first, so participants take its
//! answers (they ignore another run at the epoch they hold).
//!
//! Which decision the operator asks for, when the judge would allow both, is drawn from the
//! run's seed: both must be safe.

use std::collections::BTreeSet;

use coordinator::engine::judge::{OwnAnswer, judge};
use protocol::operator::{Evidence, ParticipantEvidence};
use protocol::{Decision, GlobalTxId, TxId};

use super::Mutation;
use super::net::Node;
use super::world::World;

/// Simulated time between two operator rounds.
pub const ROUND_MS: u64 = 3_000;
/// Restarts the operator tries to pass the lost run's epoch (restores and crashes before it
/// are bounded, so a few suffice).
const RESTARTS_MAX: u32 = 8;

/// What a round found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Nothing it can or may resolve is left; the run may end.
    Idle,
    /// It acted (or waits for its last action to take effect): look again later.
    Busy,
}

impl World {
    pub(super) fn operator_round(&mut self) -> Round {
        if !self.coordinator.is_up() {
            return Round::Busy;
        }
        let mut in_doubt: BTreeSet<(TxId, GlobalTxId)> = BTreeSet::new();
        let mut ignored = false;
        for p in &self.participants {
            for (txid, _, query) in p.undecidable() {
                in_doubt.insert((txid, query.gtid));
            }
            ignored |= p.engine.as_ref().is_some_and(|e| {
                e.prepared_list().iter().any(|entry| {
                    entry
                        .last_answer
                        .as_deref()
                        .is_some_and(|a| a.starts_with("ignored"))
                })
            });
        }
        if in_doubt.is_empty() {
            return Round::Idle;
        }
        // Participants ignore a run at or below the epoch the lost run reached: each start
        // takes the next epoch, so the operator restarts until theirs is passed
        // (docs/operations.md).
        if (self.coordinator.is_behind() && self.operator_restarts == 0 || ignored)
            && self.operator_restarts < RESTARTS_MAX
        {
            self.operator_restarts += 1;
            self.io
                .note(|| "operator restarts the coordinator whose log is behind".into());
            self.coordinator.shutdown();
            if let Err(e) = self.restart(Node::Coordinator) {
                self.problem = Some(("startup", e));
            }
            return Round::Busy;
        }
        let mut round = Round::Idle;
        for (txid, gtid) in in_doubt {
            let Some(engine) = &self.coordinator.engine else {
                return Round::Busy;
            };
            let own = match self.coordinator.index.get(&txid) {
                Some(r) if r.decision.attempt.gtid == gtid => {
                    OwnAnswer::Decided(r.decision.decision)
                }
                _ => engine.own_answer(&txid, &gtid),
            };
            if matches!(own, OwnAnswer::Resolved(_)) {
                // Resolved; its participants have not asked since.
                round = Round::Busy;
                continue;
            }
            let evidence: Vec<ParticipantEvidence> = self
                .participants
                .iter()
                .zip(&self.coordinator.participants)
                .map(|(p, name)| ParticipantEvidence {
                    participant: name.clone(),
                    prepared_at_ms: None,
                    state: p.engine.as_ref().map(|e| e.attempt_status(&gtid).state),
                    error: p.engine.is_none().then(|| "down".to_string()),
                    txid: None,
                    participants: None,
                })
                .collect();
            // The operator knows the order's participants from the client's request.
            let named = self.clients.iter().find(|c| c.tx.txid == txid).map(|c| {
                c.tx.participants
                    .iter()
                    .map(|(n, _)| n.clone())
                    .collect::<Vec<_>>()
            });
            let first = if self.io.rng.bool() {
                Decision::Commit
            } else {
                Decision::Abort
            };
            let other = match first {
                Decision::Commit => Decision::Abort,
                Decision::Abort => Decision::Commit,
            };
            // A careful operator also asks the business what the client was told.
            let told = self
                .clients
                .iter()
                .flat_map(|c| &c.observed)
                .find(|(g, _)| *g == gtid)
                .map(|(_, outcome)| match outcome {
                    protocol::Outcome::Committed => Decision::Commit,
                    protocol::Outcome::Aborted => Decision::Abort,
                });
            let (first, other) = match told {
                Some(told) if self.config.mutation != Mutation::ResolveWithoutEvidence => {
                    (told, told)
                }
                _ => (first, other),
            };
            let allowed = [first, other].into_iter().find(|d| {
                self.config.mutation == Mutation::ResolveWithoutEvidence
                    || judge(*d, &own, named.as_deref(), &evidence).is_ok()
            });
            let Some(decision) = allowed else {
                continue;
            };
            let evidence = Evidence {
                id: txid.clone(),
                gtid: gtid.clone(),
                coordinator: format!("{own:?}"),
                named,
                participants: evidence,
            };
            if self
                .coordinator
                .operator_resolve(&mut self.io, txid, gtid, decision, evidence)
            {
                self.stats.resolved += 1;
            }
            round = Round::Busy;
        }
        round
    }
}

impl World {
    /// Weighs each durable resolution against the ground truth. A resolution matching the
    /// decision the lost log held, or one where none was ever durable, becomes the decision.
    /// One contradicting a lost decision is a violation if anyone observed that decision (a
    /// client was told, a participant ended the attempt that way); a decision lost with its log
    /// before anyone saw it was, to everyone, never made, and the operator's replaces it.
    pub(super) fn settle_resolutions(&mut self) -> Result<(), (&'static str, String)> {
        for (gtid, txid, decision) in std::mem::take(&mut self.coordinator.resolutions) {
            let Some(lost) = self.coordinator.durable_decisions.get(&gtid).copied() else {
                self.coordinator.durable_decisions.insert(gtid, decision);
                continue;
            };
            if lost == decision {
                continue;
            }
            let told = self
                .clients
                .iter()
                .flat_map(|c| &c.observed)
                .any(|(g, _)| *g == gtid);
            let ended = self
                .participants
                .iter()
                .any(|p| p.ended.contains_key(&gtid));
            if told || ended {
                return Err((
                    "agreement",
                    format!(
                        "operator resolved {gtid} ({txid}) as {decision:?}, but its lost durable \
                         decision {lost:?} was observed (told to the client: {told}, ended at a \
                         participant: {ended})"
                    ),
                ));
            }
            self.io.note(|| {
                format!("resolution of {gtid} replaces an unobserved lost decision {lost:?}")
            });
            self.coordinator.durable_decisions.insert(gtid, decision);
        }
        Ok(())
    }
}
