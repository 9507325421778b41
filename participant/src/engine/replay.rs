//! Recovery: records from the log (and prepared transactions from a snapshot) put back into
//! the engine, prepared transactions with their locks held.

use protocol::{CoordinatorId, Epoch, TxId};

use super::phases::dedup;
use super::{Engine, PreparedTx, ReplayError};
use crate::record::Record;
use crate::resource::Resource;
use crate::tombstones::Ended;

impl<R: Resource> Engine<R> {
    /// Replays one logged record (recovery). Never rejects: the log is what happened.
    pub fn replay(&mut self, record: Record) -> Result<(), ReplayError> {
        let (coordinator_id, epoch) = record.fence();
        if self.epochs.get(coordinator_id).is_none_or(|e| *e < epoch) {
            self.epochs.insert(coordinator_id.clone(), epoch);
        }
        match record {
            Record::Prepared {
                txid,
                coordinator_id,
                epoch,
                payload,
                prepared_at_ms,
            } => {
                if self.prepared.contains_key(&txid) || self.tombstones.get(&txid).is_some() {
                    return Ok(());
                }
                self.restore_prepared(txid, coordinator_id, epoch, payload, prepared_at_ms)?;
            }
            Record::Committed { txid, at_ms, .. } => {
                self.replay_end(txid, at_ms, Ended::Committed);
            }
            Record::Aborted { txid, at_ms, .. } => {
                self.replay_end(txid, at_ms, Ended::Aborted);
            }
            Record::Refused {
                txid,
                reason,
                at_ms,
                ..
            } => {
                self.replay_end(txid, at_ms, Ended::Refused { reason });
            }
            Record::Fence { .. } => {}
        }
        Ok(())
    }

    fn replay_end(&mut self, txid: TxId, at_ms: u64, ended: Ended) {
        if self.prepared.contains_key(&txid) {
            self.end_prepared(&txid, at_ms, ended);
        } else if self.tombstones.get(&txid).is_none() {
            self.tombstones.insert(txid, ended, at_ms);
        }
    }

    /// Puts a logged prepared transaction back, with its locks held.
    pub(crate) fn restore_prepared(
        &mut self,
        txid: TxId,
        coordinator_id: CoordinatorId,
        epoch: Epoch,
        payload: serde_json::Value,
        prepared_at_ms: u64,
    ) -> Result<(), ReplayError> {
        let staged = self
            .resource
            .parse(&payload)
            .map_err(|e| ReplayError::Payload {
                txid: txid.clone(),
                reason: e.0,
            })?;
        let keys = dedup(self.resource.lock_keys(&staged));
        self.locks.take(&txid, &keys);
        self.prepared.insert(
            txid,
            PreparedTx {
                coordinator_id,
                epoch,
                payload,
                staged,
                keys,
                prepared_at_ms,
                next_ask_at_ms: prepared_at_ms.saturating_add(self.config.in_doubt_after_ms),
                asks: 0,
                asking: false,
            },
        );
        Ok(())
    }
}
