//! Fenced writes outside 2PC: one step checks the op id, the token (its proof or jump bound,
//! then the highest-token rule) and the locks, applies the write and logs token, value and
//! answer in one forced record. The operator's audited reset, the fence table's retention, and
//! the fence's part in 2PC and sagas: the lock keys a fence claim takes.

use protocol::lease::FenceClaim;

use super::Engine;
use super::types::{Command, ReplayError, Reply};
use crate::fence::{
    FenceRefusal, FenceReset, FenceResetRequest, FencedAnswer, FencedWrite, OpIdReused, lock_key,
};
use crate::locks::lock_keys;
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::Resource;

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

fn reject(rejection: Rejection) -> Vec<Command> {
    vec![Command::Reply(Reply::Reject(rejection))]
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
                return reject(Rejection::OpIdConflict { op_id: write.op_id });
            }
        }
        let staged = match self.resource.parse(&write.payload) {
            Ok(staged) => staged,
            Err(e) => return reject(Rejection::InvalidPayload(e.0)),
        };
        match self.fences.check(&write.fence, &self.config.fence) {
            Ok(()) => {}
            Err(FenceRefusal::Stale(stale)) => {
                // Forced before the answer: it is the barrier behind which the writes that
                // raised the highest token become durable, and it keeps the refusal itself
                // across a crash, so even an operator's later reset of the highest token
                // cannot let a retry of this write in.
                let answer = FencedAnswer::Stale(stale.clone());
                self.fences
                    .remember(&write.op_id, digest, answer.clone(), now_ms);
                return vec![
                    Command::Log {
                        record: Record::FencedStale {
                            op_id: write.op_id,
                            refusal: stale,
                            digest,
                            at_ms: now_ms,
                        },
                        forced: true,
                    },
                    Command::Reply(Reply::Fenced(answer)),
                ];
            }
            // A token the resource cannot trust: refused without touching the op id, so a
            // forger cannot take an honest writer's op id either.
            Err(refusal) => return reject(Rejection::FenceRefused(refusal)),
        }
        let written = self.resource.lock_keys(&staged);
        let keys = lock_keys(written.clone(), std::slice::from_ref(&write.fence));
        if let Some((key, holder)) = keys
            .iter()
            .find_map(|key| self.locks.holder(key).map(|h| (key.clone(), h.clone())))
        {
            return reject(Rejection::KeyLocked { key, holder });
        }
        if let Err(reason) = self.resource.check(&staged) {
            return reject(Rejection::InvalidPayload(reason));
        }
        self.resource.apply(staged);
        self.fences.accept(&write.fence, now_ms);
        let receipt = self.resource.receipt(&written);
        let answer = FencedAnswer::Applied {
            token: write.fence.token,
            receipt: receipt.clone(),
        };
        self.fences
            .remember(&write.op_id, digest, answer.clone(), now_ms);
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

    /// An operator lowers a resource's highest token: checked against what they saw
    /// (compare-and-set), refused while a prepared transaction holds the resource's fence,
    /// then logged (forced) with who and why before the answer.
    pub(super) fn reset_fence(&mut self, request: FenceResetRequest, now_ms: u64) -> Vec<Command> {
        if let Err(refused) = self.fences.check_reset(&request) {
            return reject(Rejection::ResetRefused(refused));
        }
        let key = lock_key(&request.resource);
        if let Some(holder) = self.locks.holder(&key) {
            return reject(Rejection::KeyLocked {
                key,
                holder: holder.clone(),
            });
        }
        let reset = FenceReset {
            resource: request.resource,
            from: request.from,
            to: request.to,
            operator: request.operator,
            reason: request.reason,
            at_ms: now_ms,
        };
        self.fences.apply_reset(reset.clone());
        vec![
            Command::Log {
                record: Record::FenceReset(reset.clone()),
                forced: true,
            },
            Command::Reply(Reply::FenceReset(reset)),
        ]
    }

    /// The fence table's retention pass; a resource whose fence a prepared transaction holds
    /// is kept until its decision.
    pub(super) fn prune_fences(&mut self, now_ms: u64) {
        let locks = &self.locks;
        self.fences
            .prune(now_ms, &self.config.fence_retention, |resource| {
                locks.holder(&lock_key(resource)).is_some()
            });
    }

    /// A logged stale-token refusal, at replay: its op id keeps that answer.
    pub(super) fn replay_fenced_stale(
        &mut self,
        op_id: &str,
        refusal: crate::fence::StaleToken,
        digest: protocol::digest::Digest,
        at_ms: u64,
    ) {
        self.fences
            .remember_replayed(op_id, digest, FencedAnswer::Stale(refusal), at_ms);
    }

    /// A logged fenced write, at replay: applied in log order, whatever the highest token is
    /// now (the check passed when it was written). Records after the checkpoint are replayed
    /// once each; an op id met twice was reused after retention took its first answer, and
    /// the live engine applied both, so replay does too.
    pub(super) fn replay_fenced_write(
        &mut self,
        op_id: String,
        resource: String,
        token: u64,
        payload: &serde_json::Value,
        receipt: serde_json::Value,
        at_ms: u64,
    ) -> Result<(), ReplayError> {
        let staged = self
            .resource
            .parse(payload)
            .map_err(|e| ReplayError::FencedWrite {
                op_id: op_id.clone(),
                reason: e.0,
            })?;
        self.resource.apply(staged);
        let digest = crate::fence::written_digest(&resource, token, payload);
        self.fences
            .accept(&FenceClaim::unproven(resource, token), at_ms);
        self.fences.remember_replayed(
            &op_id,
            digest,
            FencedAnswer::Applied { token, receipt },
            at_ms,
        );
        Ok(())
    }
}
