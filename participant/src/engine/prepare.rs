//! Phase one: a prepare is checked (its owner and epoch, then duplicates, tombstones, size,
//! payload, locks and the business rules) and answered yes or no, or queued behind older
//! attempts' locks to be answered by a later step.

use protocol::digest::Digest;
use protocol::limits::PAYLOAD_BYTES_MAX;
use protocol::{GlobalTxId, PrepareRequest, TxId, Vote};

use super::Engine;
use super::sender::{Sender, barrier, check_owner, finish};
use super::types::{Command, Reply};
use super::vote::Holding;
use super::waits::{Blocked, Waiter};
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::Resource;
use crate::tombstones::Ended;

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
                    let (log, reason) = self.refuse(&gtid, &sender, digest, reason, raised, now_ms);
                    commands.push(log);
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
        let keys = crate::locks::lock_keys(self.resource.lock_keys(&staged), &claims);
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
