//! The decision rule (a pure function of the votes) and the phase-two delivery bookkeeping
//! that the engine's transitions share.

use protocol::{Decision, GlobalTxId, TxId, VoteKind};

use crate::engine::io::Command;
use crate::engine::tx::{Decided, Delivery, Part, Phase, Tx};

/// The decision rule, applied once every vote is in or the deadline passed. Commit only if
/// every participant voted yes; everything else aborts, with the first reason.
pub fn decide(tx: &mut Tx, now_ms: u64) -> Vec<Command> {
    let all_yes = tx.parts.iter().all(|p| p.vote == Some(VoteKind::Yes));
    let decided = Decided {
        decision: if all_yes {
            Decision::Commit
        } else {
            Decision::Abort
        },
        reason: if all_yes {
            None
        } else {
            tx.parts.iter().find_map(abort_reason)
        },
        decided_at_ms: now_ms,
    };
    let record = tx.decision_record(&decided);
    tx.phase = Phase::Deciding(decided);
    vec![Command::AppendDecision(record)]
}

fn abort_reason(part: &Part) -> Option<String> {
    let name = &part.name;
    let detail = part
        .reason
        .as_deref()
        .filter(|r| !r.is_empty())
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    match part.vote {
        Some(VoteKind::Yes) => None,
        Some(VoteKind::No) => Some(format!("{name} voted no{detail}")),
        Some(VoteKind::Timeout) | None => Some(format!("{name} did not vote in time")),
        Some(VoteKind::Error) => Some(format!("{name} did not answer with a vote{detail}")),
    }
}

/// Phase two's messages. A commit goes to everyone until acknowledged. Under presumed abort,
/// an abort is owed only to a participant that voted yes (it holds locks and waits for us);
/// one that voted no holds nothing and hears nothing; one whose vote never arrived (timeout,
/// transport error) gets the abort once, untracked, and counts as done: if it did prepare, it
/// asks when in doubt and hears `abort` (the attempt is not live, so it is presumed aborted).
/// That keeps pending work proportional to what can be in doubt, not to every attempt that met
/// an outage.
pub fn send_decisions(tx: &mut Tx, decision: Decision) -> Vec<Command> {
    let txid = tx.id.clone();
    let gtid = tx.attempt.gtid.clone();
    let mut commands = Vec::new();
    for part in tx
        .parts
        .iter_mut()
        .filter(|p| !p.acked && p.delivery == Delivery::Idle)
    {
        match (decision, part.vote) {
            (Decision::Commit, _) | (Decision::Abort, Some(VoteKind::Yes)) => {
                commands.push(start_delivery(&txid, &gtid, part, decision));
            }
            (Decision::Abort, Some(VoteKind::No)) => part.acked = true,
            (Decision::Abort, Some(VoteKind::Timeout | VoteKind::Error) | None) => {
                part.acked = true;
                part.attempts = part.attempts.saturating_add(1);
                commands.push(Command::SendDecision {
                    txid: txid.clone(),
                    gtid: gtid.clone(),
                    participant: part.name.clone(),
                    decision,
                    attempt: part.attempts,
                    tracked: false,
                });
            }
        }
    }
    commands
}

pub fn start_delivery(
    txid: &TxId,
    gtid: &GlobalTxId,
    part: &mut Part,
    decision: Decision,
) -> Command {
    part.delivery = Delivery::InFlight;
    part.attempts = part.attempts.saturating_add(1);
    Command::SendDecision {
        txid: txid.clone(),
        gtid: gtid.clone(),
        participant: part.name.clone(),
        decision,
        attempt: part.attempts,
        tracked: true,
    }
}
