//! The KV store as a `Resource`: committed entries with versions, and the ops of
//! `protocol::kv` validated by simulating them in order against the committed state.

use std::collections::{BTreeMap, HashMap};

use protocol::kv::{KEY_LEN_MAX, KvEntry, KvOp, KvPayload, OPS_MAX};
use serde::{Deserialize, Serialize};

use crate::resource::{CheckFailed, InvalidPayload, Resource};

/// One committed value. `version` rises with every committed write; absent keys are version 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Slot {
    value: serde_json::Value,
    version: u64,
}

/// The committed state. Keys are hashed, not ordered: nothing reads them in order (a snapshot
/// is a JSON object, read back by key), and a lookup in a large ordered map compares long
/// shared key prefixes at every level, which showed in profiles of prepares.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvStore {
    entries: HashMap<String, Slot>,
}

/// A parsed, shape-checked payload.
#[derive(Debug, Clone, PartialEq)]
pub struct KvStaged {
    ops: Vec<KvOp>,
}

/// Why a seed file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("the seed must be a JSON object of key to value: {0}")]
    Json(#[from] serde_json::Error),
    #[error("seed key {key:?}: {reason}")]
    Key { key: String, reason: String },
}

impl KvStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store holding `seed` (`{"stock:sku-1": 100, ...}`), every key at version 1.
    pub fn from_seed(seed: &[u8]) -> Result<Self, SeedError> {
        let map: BTreeMap<String, serde_json::Value> = serde_json::from_slice(seed)?;
        let mut store = Self::new();
        for (key, value) in map {
            check_key(&key).map_err(|e| SeedError::Key {
                key: key.clone(),
                reason: e.0,
            })?;
            store.entries.insert(key, Slot { value, version: 1 });
        }
        Ok(store)
    }

    /// The committed value and version of `key`.
    pub fn get(&self, key: &str) -> Option<KvEntry> {
        self.entries.get(key).map(|slot| KvEntry {
            key: key.to_string(),
            value: slot.value.clone(),
            version: slot.version,
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Runs `ops` in order against the committed state; returns the final slot of every key
    /// written (`None` = deleted), or the reason to vote no.
    fn simulate<'a>(
        &self,
        ops: &'a [KvOp],
    ) -> Result<BTreeMap<&'a str, Option<Slot>>, CheckFailed> {
        let mut overlay: BTreeMap<&str, Option<Slot>> = BTreeMap::new();
        for op in ops.iter().filter(|op| !op.is_fence()) {
            let key = op.key();
            let current = match overlay.get(key) {
                Some(slot) => slot.clone(),
                None => self.entries.get(key).cloned(),
            };
            let version = current.as_ref().map_or(0, |s| s.version);
            match op {
                KvOp::Put { value, .. } => {
                    overlay.insert(
                        key,
                        Some(Slot {
                            value: value.clone(),
                            version: version + 1,
                        }),
                    );
                }
                KvOp::Delete { .. } => {
                    overlay.insert(key, None);
                }
                KvOp::Add { delta, min, .. } => {
                    let now = match &current {
                        None => 0,
                        Some(slot) => slot.value.as_i64().ok_or_else(|| {
                            CheckFailed::Other(format!(
                                "key {key:?} holds {}, not an integer",
                                slot.value
                            ))
                        })?,
                    };
                    let next = now.checked_add(*delta).ok_or_else(|| {
                        CheckFailed::Other(format!("key {key:?}: {now} + {delta} overflows"))
                    })?;
                    if let Some(min) = min
                        && next < *min
                    {
                        return Err(CheckFailed::Other(format!(
                            "key {key:?} would go from {now} to {next}, below its min {min}"
                        )));
                    }
                    overlay.insert(
                        key,
                        Some(Slot {
                            value: next.into(),
                            version: version + 1,
                        }),
                    );
                }
                // Checked (and locked) by the library's fence; never reached (filtered).
                KvOp::Fence { .. } => {}
                KvOp::Check {
                    version: expected, ..
                } => {
                    if version != *expected {
                        return Err(CheckFailed::Condition(format!(
                            "key {key:?} is at version {version}, not {expected}"
                        )));
                    }
                }
            }
        }
        Ok(overlay)
    }
}

fn check_key(key: &str) -> Result<(), InvalidPayload> {
    if key.is_empty() {
        return Err(InvalidPayload::new("a key is empty"));
    }
    if key.len() > KEY_LEN_MAX {
        return Err(InvalidPayload::new(format!(
            "key {:?}... is {} bytes long; the limit is {KEY_LEN_MAX}",
            key.chars().take(32).collect::<String>(),
            key.len()
        )));
    }
    Ok(())
}

impl Resource for KvStore {
    type Staged = KvStaged;

    fn parse(&self, payload: &serde_json::Value) -> Result<KvStaged, InvalidPayload> {
        let payload: KvPayload = serde_json::from_value(payload.clone())
            .map_err(|e| InvalidPayload::new(e.to_string()))?;
        if payload.ops.len() > OPS_MAX {
            return Err(InvalidPayload::new(format!(
                "{} ops; the limit is {OPS_MAX}",
                payload.ops.len()
            )));
        }
        for op in payload.ops.iter().filter(|op| !op.is_fence()) {
            check_key(op.key())?;
        }
        Ok(KvStaged { ops: payload.ops })
    }

    fn lock_keys(&self, staged: &KvStaged) -> Vec<String> {
        staged
            .ops
            .iter()
            .filter(|op| !op.is_fence())
            .map(|op| op.key().to_string())
            .collect()
    }

    fn check(&self, staged: &KvStaged) -> Result<(), String> {
        self.check_write(staged).map_err(|e| match e {
            CheckFailed::Condition(reason) | CheckFailed::Other(reason) => reason,
        })
    }

    fn check_write(&self, staged: &KvStaged) -> Result<(), CheckFailed> {
        self.simulate(&staged.ops).map(|_| ())
    }

    /// The keys put, deleted or added to (not those only checked), each once, in op order.
    fn written_keys(&self, staged: &KvStaged) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for op in &staged.ops {
            if matches!(
                op,
                KvOp::Put { .. } | KvOp::Delete { .. } | KvOp::Add { .. }
            ) && !keys.iter().any(|k| k == op.key())
            {
                keys.push(op.key().to_string());
            }
        }
        keys
    }

    /// `[{"key", "version"}]` per key written (no version: deleted); `POST /v1/kv` answers it.
    fn write_receipt(&self, keys: &[String]) -> serde_json::Value {
        keys.iter()
            .map(|key| match self.entries.get(key) {
                Some(slot) => serde_json::json!({"key": key, "version": slot.version}),
                None => serde_json::json!({"key": key}),
            })
            .collect()
    }

    fn apply(&mut self, staged: KvStaged) {
        match self.simulate(&staged.ops) {
            Ok(writes) => {
                for (key, slot) in writes {
                    match slot {
                        Some(slot) => {
                            self.entries.insert(key.to_string(), slot);
                        }
                        None => {
                            self.entries.remove(key);
                        }
                    }
                }
            }
            // Cannot happen: check passed under the same locks. Never half-apply.
            Err(CheckFailed::Condition(reason) | CheckFailed::Other(reason)) => {
                tracing::error!(%reason, "a committed transaction no longer applies")
            }
        }
    }

    fn entries(&self) -> usize {
        self.entries.len()
    }

    /// `{"key", "version"}` of the first key written (what `PUT /v1/kv/{key}` answers).
    fn receipt(&self, keys: &[String]) -> serde_json::Value {
        let Some(key) = keys.first() else {
            return serde_json::Value::Null;
        };
        let version = self.entries.get(key).map_or(0, |slot| slot.version);
        serde_json::json!({"key": key, "version": version})
    }

    fn snapshot(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The same document as `snapshot`, encoded from the entries themselves (keys in the hash
    /// map's order, not sorted: a snapshot is read back by key).
    fn snapshot_json(&self) -> Result<Box<serde_json::value::RawValue>, serde_json::Error> {
        serde_json::value::to_raw_value(self)
    }

    fn restore(snapshot: serde_json::Value) -> Result<Self, String> {
        serde_json::from_value(snapshot).map_err(|e| format!("kv snapshot: {e}"))
    }
}
