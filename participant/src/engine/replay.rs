//! Recovery: records from the log (and prepared attempts from a snapshot) put back into the
//! engine, prepared attempts with their locks held.
//!
//! Replay follows log order: a later record about an attempt supersedes an earlier one. In
//! particular a `Prepared` after a tombstone for the same attempt (a tombstone that expired in
//! memory, then a late prepare that voted yes) restores the prepared state: that yes was a
//! promise, and dropping it would leave the attempt with no locks and no staged change.

use protocol::digest::Digest;
use protocol::lease::FenceClaim;
use protocol::{GlobalTxId, TxId};

use super::Engine;
use super::sender::Sender;
use super::types::{PreparedTx, ReplayError};
use crate::record::Record;
use crate::resource::Resource;
use crate::tombstones::Ended;

/// A prepared attempt as the log or a snapshot holds it.
#[derive(Debug, Clone)]
pub(crate) struct LoggedPrepare {
    pub gtid: GlobalTxId,
    pub txid: TxId,
    pub sender: Sender,
    pub position: u64,
    pub payload: serde_json::Value,
    pub prepared_at_ms: u64,
    pub started_at_ms: u64,
    pub participants: Option<Vec<protocol::ParticipantName>>,
}

impl<R: Resource> Engine<R> {
    /// Replays one logged record (recovery). Never rejects: the log is what happened.
    pub fn replay(&mut self, record: Record) -> Result<(), ReplayError> {
        if let Some((coordinator_id, fence)) = record.fence()
            && self
                .epochs
                .get(coordinator_id)
                .is_none_or(|e| e.epoch < fence.epoch)
        {
            self.epochs.insert(coordinator_id.clone(), fence);
        }
        match record {
            Record::SagaOp {
                saga_id,
                step,
                kind,
                coordinator_id,
                answer,
                payload,
                at_ms,
                ..
            } => {
                self.replay_saga_op(super::saga::LoggedSagaOp {
                    coordinator_id: &coordinator_id,
                    saga_id: saga_id.as_str(),
                    step: &step,
                    kind,
                    answer,
                    payload: &payload,
                    at_ms,
                });
            }
            Record::Prepared {
                gtid,
                txid,
                coordinator_id,
                epoch,
                incarnation,
                position,
                payload,
                prepared_at_ms,
                started_at_ms,
                participants,
            } => {
                if self.prepared.contains_key(&gtid) {
                    return Ok(());
                }
                self.restore_prepared(LoggedPrepare {
                    gtid,
                    txid,
                    sender: Sender {
                        coordinator_id,
                        epoch,
                        incarnation,
                    },
                    position,
                    payload,
                    prepared_at_ms,
                    started_at_ms: started_at_ms.unwrap_or(prepared_at_ms),
                    participants,
                })?;
            }
            Record::Committed { gtid, at_ms, .. } => {
                self.replay_end(gtid, at_ms, Ended::Committed);
            }
            Record::Aborted { gtid, at_ms, .. } => {
                self.replay_end(gtid, at_ms, Ended::Aborted);
            }
            Record::Refused {
                gtid,
                reason,
                at_ms,
                ..
            } => {
                self.replay_end(gtid, at_ms, Ended::Refused { reason });
            }
            Record::Fence { .. } | Record::FencedRepeat { .. } => {}
            Record::FenceReset(reset) => self.fences.apply_reset(reset),
            Record::FencedStale {
                op_id,
                refusal,
                digest,
                at_ms,
            } => self.replay_fenced_stale(&op_id, refusal, digest, at_ms),
            Record::FencedWrite {
                op_id,
                resource,
                token,
                payload,
                receipt,
                at_ms,
                unfenced,
                next,
            } => self.replay_write(super::outbox::LoggedWrite {
                op_id,
                fence: (!unfenced).then(|| FenceClaim::unproven(resource, token)),
                payload,
                receipt,
                at_ms,
                next,
            })?,
            Record::Intent {
                event_id,
                change,
                at_ms,
            } => self.replay_intent(&event_id, &change, at_ms),
        }
        Ok(())
    }

    fn replay_end(&mut self, gtid: GlobalTxId, at_ms: u64, ended: Ended) {
        if self.prepared.contains_key(&gtid) {
            self.end_prepared(&gtid, at_ms, ended);
        } else if self.tombstones.get(&gtid).is_none() {
            // No payload known here (its Prepared is in a dropped segment, or there was none).
            self.tombstones.insert(gtid, ended, None, at_ms);
        }
    }

    /// Puts a logged prepared attempt back, with its locks held. It supersedes any tombstone
    /// for the same attempt: the prepared record is the later fact.
    pub(crate) fn restore_prepared(&mut self, logged: LoggedPrepare) -> Result<(), ReplayError> {
        let LoggedPrepare {
            gtid,
            txid,
            sender,
            position,
            payload,
            prepared_at_ms,
            started_at_ms,
            participants,
        } = logged;
        let staged = self
            .resource
            .parse(&payload)
            .map_err(|e| ReplayError::Payload {
                gtid: gtid.clone(),
                reason: e.0,
            })?;
        let claims = crate::fence::claims_in(&payload).map_err(|e| ReplayError::Payload {
            gtid: gtid.clone(),
            reason: e.0,
        })?;
        let keys = crate::locks::lock_keys(self.resource.lock_keys(&staged), &claims);
        self.tombstones.remove(&gtid);
        self.locks.take(&gtid, &keys);
        self.prepared.insert(
            gtid,
            PreparedTx {
                txid,
                coordinator_id: sender.coordinator_id,
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                position,
                digest: Digest::of_payload(&payload),
                payload,
                staged,
                keys,
                prepared_at_ms,
                started_at_ms,
                participants,
                next_ask_at_ms: prepared_at_ms.saturating_add(self.config.in_doubt_after_ms),
                asks: 0,
                asking: false,
                last_answer: None,
            },
        );
        Ok(())
    }
}
