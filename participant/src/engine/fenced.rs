//! Fenced writes outside 2PC: one step checks the op id, the token and the locks, applies the
//! write and logs token, value and answer in one forced record. And the fence's part in 2PC:
//! the lock keys a fence claim takes.

use protocol::lease::FenceClaim;

use super::phases::dedup;
use super::{Command, Engine, ReplayError, Reply};
use crate::fence::{FencedAnswer, FencedWrite, OpIdReused, lock_key};
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::Resource;

/// A transaction's lock keys: the resource's, plus one per fenced resource it claims.
pub(crate) fn lock_keys(mut keys: Vec<String>, claims: &[FenceClaim]) -> Vec<String> {
    keys.extend(claims.iter().map(|c| lock_key(&c.resource)));
    dedup(keys)
}

/// A forced barrier record, then `reply`: the answer leaves only once everything logged before
/// it is durable.
fn barrier(op_id: String, reply: Reply) -> Vec<Command> {
    vec![
        Command::Log {
            record: Record::FencedRepeat { op_id },
            forced: true,
        },
        Command::Reply(reply),
    ]
}

impl<R: Resource> Engine<R> {
    pub(super) fn fenced_write(&mut self, write: FencedWrite, now_ms: u64) -> Vec<Command> {
        let digest = write.digest();
        match self.fences.repeat(&write.op_id, digest) {
            // The first answer's record (or the state a refusal read) may still be in flight:
            // the repeat waits behind a forced barrier.
            Ok(Some(first)) => return barrier(write.op_id, Reply::Fenced(first.clone())),
            Ok(None) => {}
            Err(OpIdReused) => {
                return vec![Command::Reply(Reply::Reject(Rejection::OpIdConflict {
                    op_id: write.op_id,
                }))];
            }
        }
        let staged = match self.resource.parse(&write.payload) {
            Ok(staged) => staged,
            Err(e) => {
                return vec![Command::Reply(Reply::Reject(Rejection::InvalidPayload(
                    e.0,
                )))];
            }
        };
        if let Err(stale) = self.fences.check(&write.fence) {
            // Not logged, but answered only once the writes that raised the highest token are
            // durable (the barrier): the highest never falls after that, so a repeat is
            // refused again even after a restart forgot this answer.
            let answer = FencedAnswer::Stale(stale);
            self.fences.remember(&write.op_id, digest, answer.clone());
            return barrier(write.op_id, Reply::Fenced(answer));
        }
        let written = self.resource.lock_keys(&staged);
        let keys = lock_keys(written.clone(), std::slice::from_ref(&write.fence));
        if let Some((key, holder)) = keys
            .iter()
            .find_map(|key| self.locks.holder(key).map(|h| (key.clone(), h.clone())))
        {
            return vec![Command::Reply(Reply::Reject(Rejection::KeyLocked {
                key,
                holder,
            }))];
        }
        if let Err(reason) = self.resource.check(&staged) {
            return vec![Command::Reply(Reply::Reject(Rejection::InvalidPayload(
                reason,
            )))];
        }
        self.resource.apply(staged);
        self.fences.accept(&write.fence);
        let receipt = self.resource.receipt(&written);
        let answer = FencedAnswer::Applied {
            token: write.fence.token,
            receipt: receipt.clone(),
        };
        self.fences.remember(&write.op_id, digest, answer.clone());
        vec![
            Command::Log {
                record: Record::FencedWrite {
                    op_id: write.op_id,
                    resource: write.fence.resource,
                    token: write.fence.token,
                    payload: write.payload,
                    receipt,
                    at_ms: now_ms,
                },
                forced: true,
            },
            Command::Reply(Reply::Fenced(answer)),
        ]
    }

    /// A logged fenced write, at replay: applied once, in log order, whatever the highest
    /// token is now (the check passed when it was written).
    pub(super) fn replay_fenced_write(
        &mut self,
        op_id: String,
        resource: String,
        token: u64,
        payload: &serde_json::Value,
        receipt: serde_json::Value,
    ) -> Result<(), ReplayError> {
        if self.fences.answer(&op_id).is_some() {
            return Ok(());
        }
        let staged = self
            .resource
            .parse(payload)
            .map_err(|e| ReplayError::FencedWrite {
                op_id: op_id.clone(),
                reason: e.0,
            })?;
        self.resource.apply(staged);
        let digest = crate::fence::written_digest(&resource, token, payload);
        let claim = FenceClaim { resource, token };
        self.fences.accept(&claim);
        self.fences
            .remember(&op_id, digest, FencedAnswer::Applied { token, receipt });
        Ok(())
    }
}
