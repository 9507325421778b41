//! Checkpoints: the engine's whole state as one JSON document, so the log can drop old
//! segments. It holds the resource's committed state, the prepared set (payloads, not staged
//! values: they are parsed again on restore, which also takes the locks again), the highest
//! epoch per coordinator, the tombstones, the fence table and the outbox.

use protocol::{CoordinatorId, Epoch, GlobalTxId, Incarnation, TxId};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::engine::{Engine, EngineConfig, LoggedPrepare, ReplayError, Sender};
use crate::record::Fence;
use crate::resource::Resource;
use crate::saga_barrier::{BarrierEntry, StepKey, parse_legacy_key};
use crate::tombstones::Tombstone;

/// Bumped when the layout changes incompatibly (2: attempts keyed by global id, fences with
/// the coordinator run's incarnation; 3: saga barrier entries keyed by coordinator id too, with
/// their payloads' digests, in `saga_steps`). A build that reads only format 2 refuses a
/// format-3 snapshot by name rather than dropping barrier entries it cannot place.
const SNAPSHOT_FORMAT: u32 = 3;
/// Format 2 is still read: its barrier entries (`saga_barrier`, keyed `saga id:step`) become
/// legacy entries, with no coordinator id and no digests (engine/saga.rs, `resolve`).
const SNAPSHOT_FORMAT_BEFORE_STEP_KEYS: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub format: u32,
    pub resource: ResourceState,
    pub prepared: Vec<PreparedSnapshot>,
    pub epochs: Vec<EpochEntry>,
    pub tombstones: Vec<Tombstone>,
    /// Per coordinator run, the highest attempt position whose tombstone was dropped.
    pub forgotten: Vec<(String, u64)>,
    /// Format 2's saga barrier, keyed `saga id:step` (read, never written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub saga_barrier: Vec<(String, BarrierEntry)>,
    /// The saga barrier, one row per (saga id, step, coordinator id) (format 3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub saga_steps: Vec<BarrierRow>,
    /// Fencing tokens and fenced-write answers (absent in snapshots written before them).
    #[serde(default, skip_serializing_if = "crate::fence::Fences::is_empty")]
    pub fences: crate::fence::Fences,
    /// The outbox: intents recorded with writes (absent in snapshots written before it). One
    /// cut with the store and the fences: a write and its intents are in it together or not.
    #[serde(default, skip_serializing_if = "crate::outbox::Outbox::is_empty")]
    pub outbox: crate::outbox::Outbox,
}

/// The resource's committed state in a snapshot: as the resource encoded it when the snapshot
/// was taken (see [`Resource::snapshot_json`]), or as parsed when one is read. Either is the
/// same JSON document.
#[derive(Debug, Clone)]
pub enum ResourceState {
    Encoded(Box<RawValue>),
    Parsed(serde_json::Value),
}

impl ResourceState {
    fn into_value(self) -> Result<serde_json::Value, String> {
        match self {
            ResourceState::Parsed(value) => Ok(value),
            ResourceState::Encoded(text) => {
                serde_json::from_str(text.get()).map_err(|e| format!("resource state: {e}"))
            }
        }
    }
}

impl Serialize for ResourceState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ResourceState::Encoded(text) => text.serialize(serializer),
            ResourceState::Parsed(value) => value.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ResourceState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(deserializer).map(ResourceState::Parsed)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreparedSnapshot {
    pub gtid: GlobalTxId,
    pub txid: TxId,
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub incarnation: Incarnation,
    pub position: u64,
    pub payload: serde_json::Value,
    pub prepared_at_ms: u64,
    /// Its place in the lock-wait order (absent in older snapshots: `prepared_at_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    /// The participants its prepare named (absent in older snapshots, or when not sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participants: Option<Vec<protocol::ParticipantName>>,
}

/// One saga barrier entry with its key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BarrierRow {
    #[serde(flatten)]
    pub key: StepKey,
    #[serde(flatten)]
    pub entry: BarrierEntry,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochEntry {
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub incarnation: Incarnation,
}

impl<R: Resource> Engine<R> {
    /// Everything needed to rebuild this engine. Fails only if the resource cannot encode its
    /// state.
    pub fn snapshot(&self) -> Result<Snapshot, serde_json::Error> {
        Ok(Snapshot {
            format: SNAPSHOT_FORMAT,
            resource: ResourceState::Encoded(self.resource.snapshot_json()?),
            prepared: self
                .prepared
                .iter()
                .map(|(gtid, p)| PreparedSnapshot {
                    gtid: gtid.clone(),
                    txid: p.txid.clone(),
                    coordinator_id: p.coordinator_id.clone(),
                    epoch: p.epoch,
                    incarnation: p.incarnation,
                    position: p.position,
                    payload: p.payload.clone(),
                    prepared_at_ms: p.prepared_at_ms,
                    started_at_ms: Some(p.started_at_ms),
                    participants: p.participants.clone(),
                })
                .collect(),
            epochs: self
                .epochs
                .iter()
                .map(|(coordinator_id, fence)| EpochEntry {
                    coordinator_id: coordinator_id.clone(),
                    epoch: fence.epoch,
                    incarnation: fence.incarnation,
                })
                .collect(),
            tombstones: self.tombstones.to_vec(),
            forgotten: self.tombstones.forgotten(),
            saga_barrier: Vec::new(),
            saga_steps: self
                .saga_barrier
                .iter()
                .map(|(key, entry)| BarrierRow {
                    key: key.clone(),
                    entry: entry.clone(),
                })
                .collect(),
            fences: self.fences.clone(),
            outbox: self.outbox.clone(),
        })
    }

    /// Rebuilds an engine from a snapshot, prepared attempts with their locks held. The
    /// prepared set is restored after the tombstones and supersedes any for the same attempt
    /// (as replay does: the prepared state is the later fact).
    pub fn restore(config: EngineConfig, snapshot: Snapshot) -> Result<Self, ReplayError> {
        if snapshot.format != SNAPSHOT_FORMAT && snapshot.format != SNAPSHOT_FORMAT_BEFORE_STEP_KEYS
        {
            return Err(ReplayError::Snapshot(format!(
                "format {} is not {SNAPSHOT_FORMAT} (or {SNAPSHOT_FORMAT_BEFORE_STEP_KEYS})",
                snapshot.format
            )));
        }
        let resource = snapshot
            .resource
            .into_value()
            .and_then(R::restore)
            .map_err(ReplayError::Snapshot)?;
        let mut engine = Engine::new(config, resource);
        engine.fences = snapshot.fences;
        engine.fences.reindex();
        engine.outbox = snapshot.outbox;
        engine.outbox.reindex();
        for entry in snapshot.epochs {
            engine.epochs.insert(
                entry.coordinator_id,
                Fence {
                    epoch: entry.epoch,
                    incarnation: entry.incarnation,
                },
            );
        }
        for (run, position) in snapshot.forgotten {
            engine.tombstones.restore_forgotten(run, position);
        }
        for t in snapshot.tombstones {
            engine.tombstones.insert(t.gtid, t.ended, t.digest, t.at_ms);
        }
        for p in snapshot.prepared {
            engine.restore_prepared(LoggedPrepare {
                gtid: p.gtid,
                txid: p.txid,
                sender: Sender {
                    coordinator_id: p.coordinator_id,
                    epoch: p.epoch,
                    incarnation: p.incarnation,
                },
                position: p.position,
                payload: p.payload,
                started_at_ms: p.started_at_ms.unwrap_or(p.prepared_at_ms),
                prepared_at_ms: p.prepared_at_ms,
                participants: p.participants,
            })?;
        }
        for (key, entry) in snapshot.saga_barrier {
            let key = parse_legacy_key(&key).ok_or_else(|| {
                ReplayError::Snapshot(format!("saga barrier key {key:?} is not `saga id:step`"))
            })?;
            engine.saga_barrier.insert(key, entry);
        }
        for row in snapshot.saga_steps {
            engine.saga_barrier.insert(row.key, row.entry);
        }
        Ok(engine)
    }
}
