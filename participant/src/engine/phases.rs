//! Prepare, commit and abort: validation, locks, votes, duplicates, tombstones and fencing.

use protocol::limits::{PAYLOAD_BYTES_MAX, REASON_LEN_MAX};
use protocol::{CoordinatorId, DecisionRequest, Epoch, PrepareRequest, TxId, Vote};

use super::{Command, Engine, PreparedTx, Reply};
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::Resource;
use crate::tombstones::Ended;

impl<R: Resource> Engine<R> {
    pub(super) fn prepare(&mut self, request: PrepareRequest, now_ms: u64) -> Vec<Command> {
        let PrepareRequest {
            txid,
            coordinator_id,
            epoch,
            payload,
        } = request;
        let raised = match self.fence(&coordinator_id, epoch) {
            Ok(raised) => raised,
            Err(rejection) => return vec![Command::Reply(Reply::Reject(rejection))],
        };
        let barrier = Command::Log {
            record: Record::Fence {
                coordinator_id: coordinator_id.clone(),
                epoch,
            },
            forced: true,
        };
        let mut commands = Vec::new();
        let reply = if let Some(prepared) = self.prepared.get(&txid) {
            if prepared.coordinator_id != coordinator_id {
                Reply::Vote(Vote::No {
                    reason: format!(
                        "transaction {txid} is prepared here for coordinator {}",
                        prepared.coordinator_id
                    ),
                })
            } else if prepared.payload != payload {
                // The id is reused with another body (a coordinator that lost its record of
                // the first attempt takes a client's retry as new). A yes would promise to
                // commit the new request while the old payload is what is staged and locked.
                Reply::Vote(Vote::No {
                    reason: format!(
                        "transaction {txid} is already prepared here with a different payload; \
                         the prepared one stays until the coordinator decides it"
                    ),
                })
            } else {
                // A duplicate: same vote, but only once the first one's record is durable.
                commands.push(barrier);
                Reply::Vote(Vote::Yes)
            }
        } else if let Some(ended) = self.tombstones.get(&txid) {
            match ended {
                Ended::Committed => {
                    commands.push(barrier);
                    Reply::Vote(Vote::Yes)
                }
                Ended::Aborted => Reply::Vote(Vote::No {
                    reason: format!("transaction {txid} was already aborted here"),
                }),
                Ended::Refused { reason } => Reply::Vote(Vote::No {
                    reason: reason.clone(),
                }),
            }
        } else {
            match self.prepare_fresh(&txid, &coordinator_id, epoch, payload, now_ms) {
                Ok(record) => {
                    commands.push(Command::Log {
                        record,
                        forced: true,
                    });
                    Reply::Vote(Vote::Yes)
                }
                Err(Refusal::Reject(rejection)) => Reply::Reject(rejection),
                Err(Refusal::No(reason)) => {
                    let reason = truncate(reason, REASON_LEN_MAX);
                    self.tombstones.insert(
                        txid.clone(),
                        Ended::Refused {
                            reason: reason.clone(),
                        },
                        now_ms,
                    );
                    commands.push(Command::Log {
                        record: Record::Refused {
                            txid: txid.clone(),
                            coordinator_id: coordinator_id.clone(),
                            epoch,
                            reason: reason.clone(),
                            at_ms: now_ms,
                        },
                        forced: raised,
                    });
                    Reply::Vote(Vote::No { reason })
                }
            }
        };
        finish(commands, raised, &coordinator_id, epoch, reply)
    }

    fn prepare_fresh(
        &mut self,
        txid: &TxId,
        coordinator_id: &CoordinatorId,
        epoch: Epoch,
        payload: serde_json::Value,
        now_ms: u64,
    ) -> Result<Record, Refusal> {
        let len = serde_json::to_vec(&payload).map_or(usize::MAX, |bytes| bytes.len());
        if len > PAYLOAD_BYTES_MAX {
            return Err(Refusal::Reject(Rejection::PayloadTooLarge {
                len,
                max: PAYLOAD_BYTES_MAX,
            }));
        }
        let staged = self
            .resource
            .parse(&payload)
            .map_err(|e| Refusal::Reject(Rejection::InvalidPayload(e.0)))?;
        let keys = dedup(self.resource.lock_keys(&staged));
        if let Some((key, holder)) = self.locks.conflict(txid, &keys) {
            return Err(Refusal::No(format!(
                "key {key:?} is locked by prepared transaction {holder}"
            )));
        }
        self.resource.check(&staged).map_err(Refusal::No)?;
        self.locks.take(txid, &keys);
        self.prepared.insert(
            txid.clone(),
            PreparedTx {
                coordinator_id: coordinator_id.clone(),
                epoch,
                payload: payload.clone(),
                staged,
                keys,
                prepared_at_ms: now_ms,
                next_ask_at_ms: now_ms.saturating_add(self.config.in_doubt_after_ms),
                asks: 0,
                asking: false,
            },
        );
        Ok(Record::Prepared {
            txid: txid.clone(),
            coordinator_id: coordinator_id.clone(),
            epoch,
            payload,
            prepared_at_ms: now_ms,
        })
    }

    pub(super) fn commit(&mut self, request: DecisionRequest, now_ms: u64) -> Vec<Command> {
        let DecisionRequest {
            txid,
            coordinator_id,
            epoch,
        } = request;
        let raised = match self.fence(&coordinator_id, epoch) {
            Ok(raised) => raised,
            Err(rejection) => return vec![Command::Reply(Reply::Reject(rejection))],
        };
        let mut commands = Vec::new();
        let reply = if let Some(prepared) = self.prepared.get(&txid) {
            if prepared.coordinator_id == coordinator_id {
                commands.push(self.commit_prepared(&txid, coordinator_id.clone(), epoch, now_ms));
                Reply::Ack
            } else {
                not_prepared(
                    &txid,
                    format!("is prepared for coordinator {}", prepared.coordinator_id),
                )
            }
        } else {
            match self.tombstones.get(&txid) {
                Some(Ended::Committed) => {
                    commands.push(barrier(&coordinator_id, epoch));
                    Reply::Ack
                }
                Some(Ended::Aborted) => {
                    not_prepared(&txid, "was aborted here; it cannot commit".into())
                }
                Some(Ended::Refused { reason }) => not_prepared(
                    &txid,
                    format!("was refused here ({reason}); it cannot commit"),
                ),
                None => not_prepared(&txid, "was never prepared here".into()),
            }
        };
        finish(commands, raised, &coordinator_id, epoch, reply)
    }

    pub(super) fn abort(&mut self, request: DecisionRequest, now_ms: u64) -> Vec<Command> {
        let DecisionRequest {
            txid,
            coordinator_id,
            epoch,
        } = request;
        let raised = match self.fence(&coordinator_id, epoch) {
            Ok(raised) => raised,
            Err(rejection) => return vec![Command::Reply(Reply::Reject(rejection))],
        };
        let mut commands = Vec::new();
        let reply = if let Some(prepared) = self.prepared.get(&txid) {
            if prepared.coordinator_id == coordinator_id {
                commands.push(self.abort_prepared(&txid, coordinator_id.clone(), epoch, now_ms));
                Reply::Ack
            } else {
                not_prepared(
                    &txid,
                    format!("is prepared for coordinator {}", prepared.coordinator_id),
                )
            }
        } else {
            match self.tombstones.get(&txid) {
                Some(Ended::Aborted) => {
                    commands.push(barrier(&coordinator_id, epoch));
                    Reply::Ack
                }
                // It voted no and holds nothing: the abort is what it expected.
                Some(Ended::Refused { .. }) => Reply::Ack,
                Some(Ended::Committed) => {
                    not_prepared(&txid, "was committed here; it cannot abort".into())
                }
                None => {
                    // The abort overtook its prepare: a tombstone makes the late prepare vote no.
                    self.tombstones.insert(txid.clone(), Ended::Aborted, now_ms);
                    commands.push(Command::Log {
                        record: Record::Aborted {
                            txid: txid.clone(),
                            coordinator_id: coordinator_id.clone(),
                            epoch,
                            at_ms: now_ms,
                        },
                        forced: true,
                    });
                    Reply::Ack
                }
            }
        };
        finish(commands, raised, &coordinator_id, epoch, reply)
    }

    /// Applies a prepared transaction's commit; returns the forced log command.
    pub(super) fn commit_prepared(
        &mut self,
        txid: &TxId,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        now_ms: u64,
    ) -> Command {
        self.end_prepared(txid, now_ms, Ended::Committed);
        Command::Log {
            record: Record::Committed {
                txid: txid.clone(),
                coordinator_id,
                epoch,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    pub(super) fn abort_prepared(
        &mut self,
        txid: &TxId,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        now_ms: u64,
    ) -> Command {
        self.end_prepared(txid, now_ms, Ended::Aborted);
        Command::Log {
            record: Record::Aborted {
                txid: txid.clone(),
                coordinator_id,
                epoch,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    /// Takes `txid` out of the prepared set, applies or releases it, unlocks its keys and
    /// remembers the outcome. A txid not prepared is left alone.
    pub(super) fn end_prepared(&mut self, txid: &TxId, at_ms: u64, ended: Ended) {
        let Some(prepared) = self.prepared.remove(txid) else {
            return;
        };
        self.locks.release(txid, &prepared.keys);
        match &ended {
            Ended::Committed => self.resource.apply(prepared.staged),
            Ended::Aborted | Ended::Refused { .. } => self.resource.release(prepared.staged),
        }
        self.tombstones.insert(txid.clone(), ended, at_ms);
    }
}

enum Refusal {
    Reject(Rejection),
    No(String),
}

fn barrier(coordinator_id: &CoordinatorId, epoch: Epoch) -> Command {
    Command::Log {
        record: Record::Fence {
            coordinator_id: coordinator_id.clone(),
            epoch,
        },
        forced: true,
    }
}

/// Adds a fence record when the epoch rose and nothing forced carries it, then the reply.
fn finish(
    mut commands: Vec<Command>,
    raised: bool,
    coordinator_id: &CoordinatorId,
    epoch: Epoch,
    reply: Reply,
) -> Vec<Command> {
    let forced = commands
        .iter()
        .any(|c| matches!(c, Command::Log { forced: true, .. }));
    if raised && !forced {
        commands.push(barrier(coordinator_id, epoch));
    }
    commands.push(Command::Reply(reply));
    commands
}

fn not_prepared(txid: &TxId, why: String) -> Reply {
    Reply::Reject(Rejection::NotPrepared {
        txid: txid.clone(),
        why,
    })
}

pub(super) fn dedup(mut keys: Vec<String>) -> Vec<String> {
    keys.sort();
    keys.dedup();
    keys
}

fn truncate(mut reason: String, max: usize) -> String {
    if reason.len() > max {
        let mut cut = max;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    reason
}
