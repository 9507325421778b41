//! Prepare, commit and abort: validation, locks, votes, duplicates, tombstones and fencing.

use protocol::digest::Digest;
use protocol::limits::{PAYLOAD_BYTES_MAX, REASON_LEN_MAX};
use protocol::{
    CoordinatorId, DecisionRequest, Epoch, GlobalTxId, Incarnation, PrepareRequest, TxId, Vote,
};

use super::waits::{Blocked, Waiter, deliver_all};
use super::{Command, Engine, PreparedTx, Reply};
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::Resource;
use crate::tombstones::Ended;

/// Who sent a message: the coordinator id and the run (epoch, incarnation) it fences with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sender {
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub incarnation: Incarnation,
}

/// An attempt's global id must name its own coordinator: the id is what this participant
/// keys by, so two coordinators can never share one.
fn check_owner(gtid: &GlobalTxId, coordinator_id: &CoordinatorId) -> Result<(), Rejection> {
    match gtid.parts() {
        Some((owner, _, _)) if owner == coordinator_id.as_str() => Ok(()),
        Some(_) | None => Err(Rejection::ForeignAttempt {
            gtid: gtid.clone(),
            coordinator_id: coordinator_id.clone(),
        }),
    }
}

impl<R: Resource> Engine<R> {
    pub(super) fn prepare(
        &mut self,
        request: PrepareRequest,
        now_ms: u64,
        waiter: u64,
    ) -> Vec<Command> {
        let PrepareRequest {
            txid,
            gtid,
            coordinator_id,
            epoch,
            incarnation,
            position,
            payload,
            started_at_ms,
            lock_wait_ms,
            participants,
        } = request;
        if let Err(rejection) = check_owner(&gtid, &coordinator_id) {
            return vec![Command::Reply(Reply::Reject(rejection))];
        }
        let raised = match self.fence(&coordinator_id, epoch, incarnation) {
            Ok(raised) => raised,
            Err(rejection) => return vec![Command::Reply(Reply::Reject(rejection))],
        };
        let sender = Sender {
            coordinator_id,
            epoch,
            incarnation,
        };
        let mut commands = Vec::new();
        let reply = if let Some(queued) = self.waits.get_mut(&gtid) {
            if queued.payload == payload
                && queued.txid == txid
                && queued.participants == participants
            {
                // A duplicate of a prepare still queued: one queue entry, one outcome, told
                // to both requests when it comes.
                queued.requests.push(waiter);
                None
            } else {
                Some(Reply::Vote(Vote::No {
                    reason: format!(
                        "attempt {gtid} is already waiting here for a lock with a different \
                         payload, client id or participant list; the queued one stays"
                    ),
                }))
            }
        } else if let Some(prepared) = self.prepared.get(&gtid) {
            let reply = if prepared.payload != payload
                || prepared.txid != txid
                || prepared.participants != participants
            {
                // One attempt, two payloads: a yes would promise to commit the new request
                // while the old payload is what is staged and locked.
                Reply::Vote(Vote::No {
                    reason: format!(
                        "attempt {gtid} is already prepared here with a different payload, \
                         client id or participant list; the prepared one stays until the \
                         coordinator decides it"
                    ),
                })
            } else {
                // A duplicate: same vote, but only once the first one's record is durable.
                commands.push(barrier(&sender));
                Reply::Vote(Vote::Yes)
            };
            Some(reply)
        } else if let Some(remembered) = self.tombstones.get(&gtid) {
            Some(match &remembered.ended {
                Ended::Committed if remembered.digest == Some(Digest::of_payload(&payload)) => {
                    commands.push(barrier(&sender));
                    Reply::Vote(Vote::Yes)
                }
                Ended::Committed => Reply::Vote(Vote::No {
                    reason: format!(
                        "attempt {gtid} was committed here with a different payload; this \
                         prepare is not the one that committed"
                    ),
                }),
                Ended::Aborted => Reply::Vote(Vote::No {
                    reason: format!("attempt {gtid} was already aborted here"),
                }),
                Ended::Refused { reason } => Reply::Vote(Vote::No {
                    reason: reason.clone(),
                }),
            })
        } else if self.tombstones.may_have_forgotten(&gtid) {
            // Its tombstone may be among those dropped: a yes could apply it a second time.
            Some(Reply::Vote(Vote::No {
                reason: format!(
                    "attempt {gtid} is older than what this participant still remembers of its \
                     coordinator run; it may have ended here already"
                ),
            }))
        } else {
            // Encoded once: its length is checked and its digest kept.
            let encoded = serde_json::to_vec(&payload);
            let encoded_len = encoded.as_ref().map_or(usize::MAX, Vec::len);
            let digest = Digest::of_encoded_payload(encoded.as_deref().unwrap_or_default());
            let attempt = Fresh {
                gtid: &gtid,
                txid: &txid,
                sender: &sender,
                position,
                encoded_len,
                digest,
                started_at_ms: started_at_ms.unwrap_or(now_ms),
                lock_wait_ms,
                waiter,
                raised,
                participants,
            };
            match self.prepare_fresh(attempt, payload, now_ms) {
                Ok(Admitted::Prepared(record)) => {
                    commands.push(Command::Log {
                        record,
                        forced: true,
                    });
                    Some(Reply::Vote(Vote::Yes))
                }
                // Answered by a later step's `Deliver`.
                Ok(Admitted::Queued) => None,
                Err(Refusal::Reject(rejection)) => Some(Reply::Reject(rejection)),
                Err(Refusal::No(reason)) => {
                    let reason = truncate(reason, REASON_LEN_MAX);
                    self.tombstones.insert(
                        gtid.clone(),
                        Ended::Refused {
                            reason: reason.clone(),
                        },
                        Some(digest),
                        now_ms,
                    );
                    commands.push(Command::Log {
                        record: Record::Refused {
                            gtid: gtid.clone(),
                            coordinator_id: sender.coordinator_id.clone(),
                            epoch: sender.epoch,
                            incarnation: sender.incarnation,
                            reason: reason.clone(),
                            at_ms: now_ms,
                        },
                        forced: raised,
                    });
                    Some(Reply::Vote(Vote::No { reason }))
                }
            }
        };
        finish_maybe(commands, raised, &sender, reply)
    }

    fn prepare_fresh(
        &mut self,
        fresh: Fresh<'_>,
        payload: serde_json::Value,
        now_ms: u64,
    ) -> Result<Admitted, Refusal> {
        let Fresh {
            gtid,
            txid,
            sender,
            position,
            encoded_len: len,
            digest,
            started_at_ms,
            lock_wait_ms,
            waiter,
            raised,
            participants,
        } = fresh;
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
        let claims = crate::fence::claims_in(&payload)
            .map_err(|e| Refusal::Reject(Rejection::InvalidPayload(e.0)))?;
        let keys = super::fenced::lock_keys(self.resource.lock_keys(&staged), &claims);
        let order = (started_at_ms, gtid.clone());
        let wait_ms = lock_wait_ms
            .unwrap_or(self.config.lock_wait_max_ms)
            .min(self.config.lock_wait_max_ms);
        match self.blocked(&order, &keys) {
            None => {}
            Some(Blocked::Younger { key, holder }) => {
                // Waiting for a younger attempt could close a cycle with one that waits for
                // us elsewhere; the client's retry is a later attempt and will wait instead.
                return Err(Refusal::No(format!(
                    "lock_conflict: key {key:?} is locked by prepared attempt {holder}, which \
                     started after this one; an attempt waits only for older ones"
                )));
            }
            Some(Blocked::Older { key, ahead }) if wait_ms == 0 => {
                return Err(Refusal::No(format!(
                    "lock_conflict: key {key:?} is locked by attempt {ahead} and this prepare \
                     may not wait for it"
                )));
            }
            Some(Blocked::Older { key, ahead })
                if self.waits.len() >= self.config.lock_waiters_max =>
            {
                return Err(Refusal::No(format!(
                    "lock_conflict: too many waiters ({} queued); key {key:?} is locked by \
                     attempt {ahead}",
                    self.waits.len()
                )));
            }
            Some(Blocked::Older { .. }) => {
                self.waits.insert(
                    order,
                    Waiter {
                        txid: txid.clone(),
                        sender: sender.clone(),
                        position,
                        payload,
                        digest,
                        staged,
                        keys,
                        participants,
                        requests: vec![waiter],
                        arrived_at_ms: now_ms,
                        deadline_ms: now_ms.saturating_add(wait_ms),
                        raised,
                    },
                );
                return Ok(Admitted::Queued);
            }
        }
        self.resource.check(&staged).map_err(Refusal::No)?;
        self.fences
            .check_all(&claims, &self.config.fence)
            .map_err(|refusal| Refusal::No(refusal.to_string()))?;
        Ok(Admitted::Prepared(self.hold(
            Holding {
                gtid: gtid.clone(),
                txid: txid.clone(),
                sender: sender.clone(),
                position,
                payload,
                digest,
                staged,
                keys,
                started_at_ms,
                participants,
            },
            now_ms,
        )))
    }

    /// An attempt that passed every check takes its locks and becomes prepared; returns the
    /// record to force before it votes yes (fresh prepares and granted waiters alike).
    pub(super) fn hold(&mut self, holding: Holding<R::Staged>, now_ms: u64) -> Record {
        let Holding {
            gtid,
            txid,
            sender,
            position,
            payload,
            digest,
            staged,
            keys,
            started_at_ms,
            participants,
        } = holding;
        self.locks.take(&gtid, &keys);
        self.prepared.insert(
            gtid.clone(),
            PreparedTx {
                txid: txid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                position,
                payload: payload.clone(),
                digest,
                staged,
                keys,
                prepared_at_ms: now_ms,
                started_at_ms,
                participants: participants.clone(),
                next_ask_at_ms: now_ms.saturating_add(self.config.in_doubt_after_ms),
                asks: 0,
                asking: false,
                last_answer: None,
            },
        );
        Record::Prepared {
            gtid,
            txid,
            coordinator_id: sender.coordinator_id,
            epoch: sender.epoch,
            incarnation: sender.incarnation,
            position,
            payload,
            prepared_at_ms: now_ms,
            started_at_ms: Some(started_at_ms),
            participants,
        }
    }

    /// Checks a commit or abort's sender; the attempt and the sender, or the answer to give.
    fn decision_sender(
        &mut self,
        request: DecisionRequest,
    ) -> Result<(GlobalTxId, Sender, bool), Vec<Command>> {
        let DecisionRequest {
            txid: _,
            gtid,
            coordinator_id,
            epoch,
            incarnation,
        } = request;
        let reject = |rejection| vec![Command::Reply(Reply::Reject(rejection))];
        check_owner(&gtid, &coordinator_id).map_err(reject)?;
        let raised = self
            .fence(&coordinator_id, epoch, incarnation)
            .map_err(reject)?;
        Ok((
            gtid,
            Sender {
                coordinator_id,
                epoch,
                incarnation,
            },
            raised,
        ))
    }

    pub(super) fn commit(&mut self, request: DecisionRequest, now_ms: u64) -> Vec<Command> {
        let (gtid, sender, raised) = match self.decision_sender(request) {
            Ok(checked) => checked,
            Err(answer) => return answer,
        };
        let mut commands = Vec::new();
        let reply = if self.waits.contains(&gtid) {
            // It never voted yes here, so no coordinator can have decided commit for it; it
            // keeps waiting.
            not_prepared(
                &gtid,
                "was never prepared here (it is waiting for a lock); it cannot commit".into(),
            )
        } else if self.prepared.contains_key(&gtid) {
            commands.push(self.commit_prepared(&gtid, &sender, now_ms));
            Reply::Ack
        } else {
            match self.tombstones.get(&gtid).map(|r| &r.ended) {
                Some(Ended::Committed) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                Some(Ended::Aborted) => {
                    not_prepared(&gtid, "was aborted here; it cannot commit".into())
                }
                Some(Ended::Refused { reason }) => not_prepared(
                    &gtid,
                    format!("was refused here ({reason}); it cannot commit"),
                ),
                // A commit decision means this participant voted yes, so it prepared the
                // attempt; with neither the prepared state nor a tombstone left, it ended here
                // and its tombstone was dropped, and only a commit can have ended it (the
                // coordinator's decision is commit). The ack is what the first delivery got.
                None if self.tombstones.may_have_forgotten(&gtid) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                None => not_prepared(&gtid, "was never prepared here".into()),
            }
        };
        finish(commands, raised, &sender, reply)
    }

    pub(super) fn abort(&mut self, request: DecisionRequest, now_ms: u64) -> Vec<Command> {
        let (gtid, sender, raised) = match self.decision_sender(request) {
            Ok(checked) => checked,
            Err(answer) => return answer,
        };
        let mut commands = Vec::new();
        let reply = if let Some((_, waiter)) = self.waits.remove(&gtid) {
            // The coordinator gave up on it (its deadline, another participant's no): it leaves
            // the queue, and a tombstone makes a late duplicate prepare vote no, as an abort
            // that overtook its prepare does.
            commands.push(self.remember_unprepared_abort(&gtid, &sender, now_ms));
            deliver_all(
                &mut commands,
                waiter.requests,
                &Reply::Vote(Vote::No {
                    reason: format!("attempt {gtid} was aborted while waiting for a lock"),
                }),
            );
            Reply::Ack
        } else if self.prepared.contains_key(&gtid) {
            commands.push(self.abort_prepared(&gtid, &sender, now_ms));
            Reply::Ack
        } else {
            match self.tombstones.get(&gtid).map(|r| &r.ended) {
                Some(Ended::Aborted) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                // It voted no and holds nothing: the abort is what it expected.
                Some(Ended::Refused { .. }) => Reply::Ack,
                Some(Ended::Committed) => {
                    not_prepared(&gtid, "was committed here; it cannot abort".into())
                }
                // Ended here and forgotten since; a late prepare for it already votes no.
                None if self.tombstones.may_have_forgotten(&gtid) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                None => {
                    // The abort overtook its prepare: a tombstone makes the late prepare vote no.
                    commands.push(self.remember_unprepared_abort(&gtid, &sender, now_ms));
                    Reply::Ack
                }
            }
        };
        finish(commands, raised, &sender, reply)
    }

    /// An abort for an attempt that is not prepared here (it waited for a lock, or the abort
    /// overtook its prepare): a tombstone makes a late prepare vote no; returns the forced log
    /// command that keeps it across a restart.
    fn remember_unprepared_abort(
        &mut self,
        gtid: &GlobalTxId,
        sender: &Sender,
        now_ms: u64,
    ) -> Command {
        self.tombstones
            .insert(gtid.clone(), Ended::Aborted, None, now_ms);
        Command::Log {
            record: Record::Aborted {
                gtid: gtid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    /// Applies a prepared attempt's commit; returns the forced log command.
    pub(super) fn commit_prepared(
        &mut self,
        gtid: &GlobalTxId,
        sender: &Sender,
        now_ms: u64,
    ) -> Command {
        self.end_prepared(gtid, now_ms, Ended::Committed);
        Command::Log {
            record: Record::Committed {
                gtid: gtid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    pub(super) fn abort_prepared(
        &mut self,
        gtid: &GlobalTxId,
        sender: &Sender,
        now_ms: u64,
    ) -> Command {
        self.end_prepared(gtid, now_ms, Ended::Aborted);
        Command::Log {
            record: Record::Aborted {
                gtid: gtid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    /// Takes `gtid` out of the prepared set, applies or releases it, unlocks its keys and
    /// remembers the outcome with the payload's digest. An attempt not prepared is left alone.
    pub(super) fn end_prepared(&mut self, gtid: &GlobalTxId, at_ms: u64, ended: Ended) {
        let Some(prepared) = self.prepared.remove(gtid) else {
            return;
        };
        self.locks.release(gtid, &prepared.keys);
        // Its keys are free: a waiter may be granted at the end of this step.
        self.waits.changed = true;
        match &ended {
            Ended::Committed => {
                self.resource.apply(prepared.staged);
                // Parsed when it prepared, so it parses now.
                for claim in crate::fence::claims_in(&prepared.payload).unwrap_or_default() {
                    self.fences.accept(&claim, at_ms);
                }
            }
            Ended::Aborted | Ended::Refused { .. } => self.resource.release(prepared.staged),
        }
        self.tombstones
            .insert(gtid.clone(), ended, Some(prepared.digest), at_ms);
    }
}

/// What a prepared attempt holds, handed to `Engine::hold`.
pub(super) struct Holding<S> {
    pub gtid: GlobalTxId,
    pub txid: TxId,
    pub sender: Sender,
    pub position: u64,
    pub payload: serde_json::Value,
    pub digest: Digest,
    pub staged: S,
    pub keys: Vec<String>,
    pub started_at_ms: u64,
    pub participants: Option<Vec<protocol::ParticipantName>>,
}

/// An attempt seen here for the first time, with its payload's encoded size and digest.
struct Fresh<'a> {
    gtid: &'a GlobalTxId,
    txid: &'a TxId,
    sender: &'a Sender,
    position: u64,
    encoded_len: usize,
    digest: Digest,
    /// Its place in the lock order (the coordinator's start time, or its arrival here).
    started_at_ms: u64,
    lock_wait_ms: Option<u64>,
    waiter: u64,
    raised: bool,
    participants: Option<Vec<protocol::ParticipantName>>,
}

/// A fresh prepare that passed validation: prepared now, or queued for locks.
enum Admitted {
    Prepared(Record),
    Queued,
}

enum Refusal {
    Reject(Rejection),
    No(String),
}

fn barrier(sender: &Sender) -> Command {
    Command::Log {
        record: Record::Fence {
            coordinator_id: sender.coordinator_id.clone(),
            epoch: sender.epoch,
            incarnation: sender.incarnation,
        },
        forced: true,
    }
}

/// Adds a fence record when the epoch rose and nothing forced carries it, then the reply.
fn finish(mut commands: Vec<Command>, raised: bool, sender: &Sender, reply: Reply) -> Vec<Command> {
    let forced = commands
        .iter()
        .any(|c| matches!(c, Command::Log { forced: true, .. }));
    if raised && !forced {
        commands.push(barrier(sender));
    }
    commands.push(Command::Reply(reply));
    commands
}

/// As [`finish`], for a prepare that may be answered later (no reply in this step).
fn finish_maybe(
    commands: Vec<Command>,
    raised: bool,
    sender: &Sender,
    reply: Option<Reply>,
) -> Vec<Command> {
    match reply {
        Some(reply) => finish(commands, raised, sender, reply),
        None => {
            let mut commands = commands;
            let forced = commands
                .iter()
                .any(|c| matches!(c, Command::Log { forced: true, .. }));
            if raised && !forced {
                commands.push(barrier(sender));
            }
            commands
        }
    }
}

fn not_prepared(gtid: &GlobalTxId, why: String) -> Reply {
    Reply::Reject(Rejection::NotPrepared {
        gtid: gtid.clone(),
        why,
    })
}

pub(super) fn dedup(mut keys: Vec<String>) -> Vec<String> {
    keys.sort();
    keys.dedup();
    keys
}

pub(super) fn truncate(mut reason: String, max: usize) -> String {
    if reason.len() > max {
        let mut cut = max;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    reason
}
