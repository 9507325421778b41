//! The fence table's upkeep in the engine: the operator's audited reset, the retention pass,
//! and the replay of stale-token refusals. Fenced writes themselves go through the write path
//! of `outbox` (a fenced write is a write without intents).

use super::Engine;
use super::types::{Command, Reply};
use crate::fence::{FenceReset, FenceResetRequest, FencedAnswer, lock_key};
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::Resource;

fn reject(rejection: Rejection) -> Vec<Command> {
    vec![Command::Reply(Reply::Reject(rejection))]
}

impl<R: Resource> Engine<R> {
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
}
