//! The operator of the simulated cluster. After the faults heal: for every attempt a
//! participant holds in doubt because the coordinator cannot decide it (a restore lost its
//! run), gather the evidence as `GET /v1/transactions/{id}/evidence` does, let the
//! coordinator's own checks rule (the claim bound to the attempt's identity, the attempt's own
//! participants, the judge), and resolve as `POST .../resolve` does. No restart is needed for
//! participants to take the resolution: the coordinator raised its epoch past the lost run's
//! by itself. Once nothing is in doubt, a log marked behind is cleared (audited), as the
//! restore runbook says.
//!
//! During the faults, an operator who errs (`Ev::HostileOperator`) resolves with the wrong id,
//! a gtid not yet given out, or one whose outcome the log already holds: every such claim must
//! be refused; one accepted is a violation.
//!
//! Which decision the operator asks for, when the judge would allow both, is drawn from the
//! run's seed: both must be safe.

use std::collections::BTreeSet;

use coordinator::engine::judge::{OwnAnswer, Refusal, attempt_participants, judge};
use protocol::operator::{Evidence, ParticipantEvidence};
use protocol::{Decision, GlobalTxId, TxId};

use super::Mutation;
use super::world::World;

/// Simulated time between two operator rounds.
pub const ROUND_MS: u64 = 3_000;

/// What a round found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Nothing it can or may resolve is left; the run may end.
    Idle,
    /// It acted (or waits for its last action to take effect): look again later.
    Busy,
}

/// What the coordinator would answer a resolve with.
enum Ruling {
    Allowed(Evidence),
    Refused(Refusal),
}

impl World {
    pub(super) fn operator_round(&mut self) -> Round {
        if !self.coordinator.is_up() {
            return Round::Busy;
        }
        let mut in_doubt: BTreeSet<(TxId, GlobalTxId)> = BTreeSet::new();
        for p in &self.participants {
            for (txid, _, query) in p.undecidable() {
                in_doubt.insert((txid, query.gtid));
            }
        }
        if in_doubt.is_empty() {
            if self.coordinator.is_marked_behind() {
                // The restore's loss is accepted once nothing is left in doubt.
                self.coordinator.operator_clear_behind(&mut self.io);
                return Round::Busy;
            }
            return Round::Idle;
        }
        let mut round = Round::Idle;
        for (txid, gtid) in in_doubt {
            let Some(engine) = &self.coordinator.engine else {
                return Round::Busy;
            };
            if matches!(engine.own_answer(&txid, &gtid), OwnAnswer::Resolved(_)) {
                // Resolved; its participants have not asked since.
                round = Round::Busy;
                continue;
            }
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
            let allowed = [first, other].into_iter().find_map(|d| {
                match self.rule(&txid, &gtid, d, named.clone()) {
                    Ruling::Allowed(evidence) => Some((d, evidence)),
                    Ruling::Refused(_) => None,
                }
            });
            let Some((decision, evidence)) = allowed else {
                continue;
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

    /// What `Core::resolve` rules for `decision` of `gtid` claimed as `txid`: the claim, the
    /// attempt's own participants, then the judge, on the evidence gathered as `gather` does.
    fn rule(
        &self,
        txid: &TxId,
        gtid: &GlobalTxId,
        decision: Decision,
        named_by_operator: Option<Vec<protocol::ParticipantName>>,
    ) -> Ruling {
        let Some(engine) = &self.coordinator.engine else {
            return Ruling::Refused(Refusal {
                code: protocol::ErrorCode::NotReady,
                message: "down".into(),
            });
        };
        let indexed = self.coordinator.indexed(gtid);
        let mutation = self.config.mutation;
        if mutation != Mutation::UncheckedClaim
            && let Some(refusal) =
                engine.claim_refusal(txid, gtid, indexed.map(|r| &r.decision.txid))
        {
            return Ruling::Refused(refusal);
        }
        let from_log = match (engine.attempt_of(txid), indexed) {
            (Some((held, named)), _) if held == *gtid => Some(named),
            (_, Some(r)) if r.decision.txid == *txid => {
                Some(r.decision.votes.iter().map(|(p, _)| p.clone()).collect())
            }
            _ => None,
        };
        let evidence: Vec<ParticipantEvidence> = self
            .participants
            .iter()
            .zip(&self.coordinator.participants)
            .map(|(p, name)| {
                let status = p.engine.as_ref().map(|e| e.attempt_status(gtid));
                ParticipantEvidence {
                    participant: name.clone(),
                    prepared_at_ms: None,
                    state: status.as_ref().map(|s| s.state),
                    error: p.engine.is_none().then(|| "down".to_string()),
                    txid: status.as_ref().and_then(|s| s.txid.clone()),
                    participants: status.and_then(|s| s.participants),
                }
            })
            .collect();
        let own = match indexed {
            Some(r) if r.decision.txid == *txid => OwnAnswer::Decided(r.decision.decision),
            _ => engine.own_answer(txid, gtid),
        };
        let named = match attempt_participants(
            from_log.as_deref(),
            named_by_operator.as_deref(),
            &evidence,
        ) {
            Ok(named) => named,
            Err(refusal) if mutation != Mutation::ResolveWithoutEvidence => {
                return Ruling::Refused(refusal);
            }
            Err(_) => named_by_operator.clone(),
        };
        if mutation != Mutation::ResolveWithoutEvidence
            && let Err(refusal) = judge(decision, txid, &own, named.as_deref(), &evidence)
        {
            return Ruling::Refused(refusal);
        }
        Ruling::Allowed(Evidence {
            id: txid.clone(),
            gtid: gtid.clone(),
            coordinator: format!("{own:?}"),
            named,
            participants: evidence,
        })
    }

    /// An operator who errs: a resolve under the wrong id, of a gtid not yet given out, or of
    /// an attempt whose outcome the log or index already holds. Each must be refused; one
    /// that is accepted is acted on (as a real operator would) and reported as a violation.
    pub(super) fn hostile_operator(&mut self) {
        let Some(engine) = &self.coordinator.engine else {
            return;
        };
        let Some(identity) = engine.identity().cloned() else {
            return;
        };
        // Attempts the coordinator itself still holds decided (live, staged or indexed).
        let held: Vec<(GlobalTxId, TxId, Decision)> = self
            .coordinator
            .attempts
            .keys()
            .filter_map(|gtid| {
                let owner = engine.owner_of(gtid).and_then(|o| {
                    let decision = match o.answer {
                        protocol::DecisionStatus::Commit => Decision::Commit,
                        protocol::DecisionStatus::Abort => Decision::Abort,
                        _ => return None,
                    };
                    Some((o.txid, decision))
                });
                owner
                    .or_else(|| {
                        self.coordinator
                            .indexed(gtid)
                            .map(|r| (r.decision.txid.clone(), r.decision.decision))
                    })
                    .map(|(txid, d)| (gtid.clone(), txid, d))
            })
            .collect();
        let flip = |d: Decision| match d {
            Decision::Commit => Decision::Abort,
            Decision::Abort => Decision::Commit,
        };
        let kind = self.io.rng.u32(0..3);
        let (what, txid, gtid, decision) = match (kind, held.is_empty()) {
            (0, false) => {
                let (gtid, _, decided) = held[self.io.rng.usize(0..held.len())].clone();
                let ghost =
                    TxId::new(format!("ghost-{}", self.io.rng.u32(..))).expect("a valid id shape");
                ("another id", ghost, gtid, flip(decided))
            }
            (1, false) => {
                let (gtid, txid, decided) = held[self.io.rng.usize(0..held.len())].clone();
                ("an outcome the log holds", txid, gtid, flip(decided))
            }
            _ => {
                let reach = engine
                    .runs()
                    .find(|r| r.incarnation == identity.incarnation)
                    .map_or(0, |r| r.reach);
                let ahead = reach + 5 + self.io.rng.u64(0..10);
                let gtid =
                    GlobalTxId::compose(&identity.coordinator_id, identity.incarnation, ahead);
                let txid = TxId::new(format!("future-{ahead}")).expect("a valid id shape");
                ("a gtid not yet given out", txid, gtid, Decision::Abort)
            }
        };
        match self.rule(&txid, &gtid, decision, None) {
            Ruling::Refused(refusal) => self.io.note(|| {
                format!(
                    "a mistaken resolve ({what}) of {gtid} as {txid} is refused: {} {}",
                    refusal.code, refusal.message
                )
            }),
            Ruling::Allowed(evidence) => {
                if self.hostile_accepted.is_none() {
                    self.hostile_accepted = Some(format!(
                        "a mistaken resolve ({what}): {decision:?} of {gtid} as {txid} was accepted"
                    ));
                }
                self.coordinator
                    .operator_resolve(&mut self.io, txid, gtid, decision, evidence);
            }
        }
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
