//! An adversary on the network without the peer token (issue 17): it sends participants
//! prepares, commits and aborts that claim to come from the real coordinator at an epoch far
//! above any it reached. Accepted, one such message would fence the coordinator out for ever
//! (every later message of it is stale) or commit an attempt the coordinator aborts.
//!
//! Participants refuse epochs more than `EPOCH_JUMP_MAX` above the highest they hold
//! (`participant::epoch_bound`), so the runs' invariants (atomicity, agreement with the
//! coordinator, liveness once faults heal) must hold whatever it sends;
//! `Mutation::NoEpochBound` takes the bound away to show they do not without it.
//!
//! It sends such messages alone or as a batch of a few (issue 28): each item is refused on its
//! own, as the lone message would be.
//!
//! It also answers batches it saw on the wire with a line that names another attempt than the
//! item at its index (`forge_line`): the coordinator must credit no attempt with it (it counts
//! the line as an error answer for that item: the attempt aborts or the decision is retried).
//! A line naming the right attempt is the current-epoch forgery below, not modelled.
//!
//! It also asks the coordinator for decisions about made-up runs and epochs (`hostile_query`),
//! which any peer may do: a query is a claim, so it must be answered `unknown` and change
//! nothing (`Mutation::BehindFromQuery` is the old rule that stopped new work on it).
//!
//! Forging a message at the current epoch is not modelled: without authentication nothing
//! can tell it from the coordinator's (docs/security.md says so), which is why a server that
//! listens beyond loopback refuses to start without tokens.

use protocol::{
    CoordinatorId, Decision, DecisionQuery, DecisionRequest, Epoch, GlobalTxId, Incarnation,
    PrepareRequest, TxId,
};

use super::net::{Body, LineAnswer, Msg, Node, RequestId};
use super::participant_node::ParticipantNode;

/// The bound the simulated participants run with: small, so that the coordinator's restarts
/// in a run stay far below it while a forged epoch is far above.
pub const EPOCH_JUMP_MAX: u64 = 1_000;

/// Who the answers to forged messages go to: no coordinator run has this incarnation, so the
/// coordinator drops them as it drops any answer meant for another run.
const NOBODY: u64 = u64::MAX;

/// One forged message for `target`, built from what the adversary could have seen on the
/// wire (the coordinator's id, an attempt the participant holds prepared).
pub fn forge(
    rng: &mut fastrand::Rng,
    coordinator_id: &CoordinatorId,
    target: &ParticipantNode,
) -> Msg {
    let prepared = target
        .engine
        .as_ref()
        .map(|engine| engine.prepared_list())
        .unwrap_or_default();
    let decide = !prepared.is_empty() && rng.u32(0..4) != 0;
    // A third of the forgeries are batches of two or three such messages.
    let count = if rng.u32(0..3) == 0 {
        rng.usize(2..=3)
    } else {
        1
    };
    let rid = rng.u64(..);
    let body = if decide {
        let items: Vec<_> = (0..count)
            .map(|index| {
                let victim = &prepared[rng.usize(0..prepared.len())];
                let decision = if rng.bool() {
                    Decision::Commit
                } else {
                    Decision::Abort
                };
                let request = DecisionRequest {
                    txid: victim.txid.clone(),
                    gtid: victim.gtid.clone(),
                    coordinator_id: coordinator_id.clone(),
                    epoch: high_epoch(rng),
                    incarnation: Incarnation(rng.u64(..)),
                };
                (index, decision, request)
            })
            .collect();
        match <[_; 1]>::try_from(items) {
            Ok([(_, decision, request)]) => Body::Decide {
                rid,
                from: NOBODY,
                decision,
                request,
            },
            Err(items) => Body::DecideBatch {
                batch: rid,
                from: NOBODY,
                items,
            },
        }
    } else {
        let items: Vec<_> = (0..count)
            .map(|index| (index, forged_prepare(rng, coordinator_id)))
            .collect();
        match <[_; 1]>::try_from(items) {
            Ok([(_, request)]) => Body::Prepare {
                rid,
                from: NOBODY,
                request,
            },
            Err(items) => Body::PrepareBatch {
                batch: rid,
                from: NOBODY,
                items,
            },
        }
    };
    Msg {
        to: Some(Node::Participant(target.index)),
        body,
    }
}

/// An epoch far above any the coordinator reaches in a run.
fn high_epoch(rng: &mut fastrand::Rng) -> Epoch {
    Epoch(match rng.u32(0..3) {
        0 => u64::MAX,
        1 => u64::MAX / 2 + rng.u64(0..1_000),
        _ => EPOCH_JUMP_MAX + 100 + rng.u64(0..1_000_000),
    })
}

/// A prepare of a made-up attempt at a high epoch.
fn forged_prepare(rng: &mut fastrand::Rng, coordinator_id: &CoordinatorId) -> PrepareRequest {
    let incarnation = Incarnation(rng.u64(..));
    let position = rng.u64(..);
    PrepareRequest {
        txid: TxId::new(format!("forged-{position}")).expect("a valid constant shape"),
        gtid: GlobalTxId::compose(coordinator_id, incarnation, position),
        coordinator_id: coordinator_id.clone(),
        epoch: high_epoch(rng),
        incarnation,
        position,
        payload: serde_json::json!({"ops": []}),
        started_at_ms: None,
        lock_wait_ms: None,
        participants: None,
    }
}

/// An answer line for an item of the batch call `batch` (whose items' attempts, by index, are
/// `items`) that names another attempt: another item's, or one never begun. A yes or an ack,
/// which credited to the item would commit or forget it. `None` when the call is over.
pub fn forge_line(
    rng: &mut fastrand::Rng,
    batch: RequestId,
    coordinator: u64,
    items: &[GlobalTxId],
) -> Option<Msg> {
    if items.is_empty() {
        return None;
    }
    let index = rng.usize(0..items.len());
    let others: Vec<&GlobalTxId> = items.iter().filter(|g| **g != items[index]).collect();
    let gtid = match others.is_empty() || rng.bool() {
        false => others[rng.usize(0..others.len())].clone(),
        // The item's run, at a position no run reaches.
        true => {
            let (coordinator_id, incarnation, _) = items[index].parts()?;
            let coordinator_id = CoordinatorId::new(coordinator_id).ok()?;
            GlobalTxId::compose(&coordinator_id, incarnation, u64::MAX - rng.u64(0..1_000))
        }
    };
    let answer = if rng.bool() {
        LineAnswer::Vote(Ok(protocol::Vote::Yes))
    } else {
        LineAnswer::Ack(Ok(()))
    };
    Some(Msg {
        to: Some(Node::Coordinator),
        body: Body::BatchAnswer {
            batch,
            to: coordinator,
            index,
            gtid,
            answer,
        },
    })
}

/// A decision query for an attempt of a run the coordinator never had, at a made-up epoch and
/// position, under a made-up id; its answer goes to a participant run that does not exist.
pub fn hostile_query(rng: &mut fastrand::Rng, coordinator_id: &CoordinatorId) -> Msg {
    let incarnation = Incarnation(match rng.u32(0..3) {
        0 => u64::MAX,
        _ => rng.u64(..),
    });
    let epoch = Epoch(match rng.u32(0..3) {
        0 => 1,
        1 => u64::MAX,
        _ => rng.u64(..),
    });
    let position = rng.u64(1..1_000);
    Msg {
        to: Some(Node::Coordinator),
        body: Body::Query {
            rid: rng.u64(..),
            from: (0, NOBODY),
            txid: TxId::new(format!("x-{position}")).expect("a valid id shape"),
            query: DecisionQuery {
                gtid: GlobalTxId::compose(coordinator_id, incarnation, position),
                incarnation,
                epoch,
                position,
            },
        },
    }
}
