//! Checkpoints: the engine's whole state as one JSON document, so the log can drop old
//! segments. It holds the resource's committed state, the prepared set (payloads, not staged
//! values: they are parsed again on restore, which also takes the locks again), the highest
//! epoch per coordinator and the tombstones.

use protocol::{CoordinatorId, Epoch, TxId};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, EngineConfig, ReplayError};
use crate::resource::Resource;
use crate::tombstones::Tombstone;

/// Bumped when the layout changes incompatibly.
const SNAPSHOT_FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub format: u32,
    pub resource: serde_json::Value,
    pub prepared: Vec<PreparedSnapshot>,
    pub epochs: Vec<EpochEntry>,
    pub tombstones: Vec<Tombstone>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreparedSnapshot {
    pub txid: TxId,
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub payload: serde_json::Value,
    pub prepared_at_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochEntry {
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
}

impl<R: Resource> Engine<R> {
    /// Everything needed to rebuild this engine.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            format: SNAPSHOT_FORMAT,
            resource: self.resource.snapshot(),
            prepared: self
                .prepared
                .iter()
                .map(|(txid, p)| PreparedSnapshot {
                    txid: txid.clone(),
                    coordinator_id: p.coordinator_id.clone(),
                    epoch: p.epoch,
                    payload: p.payload.clone(),
                    prepared_at_ms: p.prepared_at_ms,
                })
                .collect(),
            epochs: self
                .epochs
                .iter()
                .map(|(coordinator_id, epoch)| EpochEntry {
                    coordinator_id: coordinator_id.clone(),
                    epoch: *epoch,
                })
                .collect(),
            tombstones: self.tombstones.to_vec(),
        }
    }

    /// Rebuilds an engine from a snapshot, prepared transactions with their locks held.
    pub fn restore(config: EngineConfig, snapshot: Snapshot) -> Result<Self, ReplayError> {
        if snapshot.format != SNAPSHOT_FORMAT {
            return Err(ReplayError::Snapshot(format!(
                "format {} is not {SNAPSHOT_FORMAT}",
                snapshot.format
            )));
        }
        let resource = R::restore(snapshot.resource).map_err(ReplayError::Snapshot)?;
        let mut engine = Engine::new(config, resource);
        for entry in snapshot.epochs {
            engine.epochs.insert(entry.coordinator_id, entry.epoch);
        }
        for t in snapshot.tombstones {
            engine.tombstones.insert(t.txid, t.ended, t.at_ms);
        }
        for p in snapshot.prepared {
            engine.restore_prepared(
                p.txid,
                p.coordinator_id,
                p.epoch,
                p.payload,
                p.prepared_at_ms,
            )?;
        }
        Ok(engine)
    }
}
