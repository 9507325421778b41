//! A toy resource for the library tests: named counters. Payload `{"key": "a", "n": 3}` adds
//! `n` to counter `key`; a negative `n` is a no vote; anything else is an invalid payload.
#![allow(dead_code)]

use std::collections::BTreeMap;

use participant::{InvalidPayload, Resource};
use protocol::digest::Fnv128;
use protocol::{
    CoordinatorId, DecisionRequest, Epoch, GlobalTxId, Incarnation, PrepareRequest, TxId,
};
use serde_json::{Value, json};

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub counts: BTreeMap<String, i64>,
    pub applied: u64,
    pub released: u64,
}

#[derive(Debug, Clone)]
pub struct Add {
    key: String,
    n: i64,
    /// More keys it locks (`"also": ["b"]`), for multi-key lock tests; only `key` changes.
    also: Vec<String>,
}

impl Resource for Tally {
    type Staged = Add;

    fn parse(&self, payload: &Value) -> Result<Add, InvalidPayload> {
        let key = payload["key"]
            .as_str()
            .ok_or_else(|| InvalidPayload::new("key must be a string"))?;
        let n = payload["n"]
            .as_i64()
            .ok_or_else(|| InvalidPayload::new("n must be an integer"))?;
        let also = payload["also"]
            .as_array()
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Add {
            key: key.to_string(),
            n,
            also,
        })
    }

    fn lock_keys(&self, staged: &Add) -> Vec<String> {
        let mut keys = vec![staged.key.clone()];
        keys.extend(staged.also.iter().cloned());
        keys
    }

    fn check(&self, staged: &Add) -> Result<(), String> {
        if staged.n < 0 {
            return Err(format!("n {} is negative", staged.n));
        }
        Ok(())
    }

    fn apply(&mut self, staged: Add) {
        *self.counts.entry(staged.key).or_default() += staged.n;
        self.applied += 1;
    }

    fn release(&mut self, _staged: Add) {
        self.released += 1;
    }

    fn snapshot(&self) -> Value {
        json!({"counts": self.counts, "applied": self.applied, "released": self.released})
    }

    fn restore(snapshot: Value) -> Result<Self, String> {
        let counts =
            serde_json::from_value(snapshot["counts"].clone()).map_err(|e| e.to_string())?;
        Ok(Tally {
            counts,
            applied: snapshot["applied"].as_u64().unwrap_or(0),
            released: snapshot["released"].as_u64().unwrap_or(0),
        })
    }
}

pub fn tx(id: &str) -> TxId {
    TxId::new(id).unwrap()
}

pub fn coord(id: &str) -> CoordinatorId {
    CoordinatorId::new(id).unwrap()
}

/// The coordinator most tests talk as.
pub const C1: &str = "c1";

/// The run of a coordinator at `epoch`. Every real start draws a new incarnation and bumps the
/// epoch, so these tests give each epoch its own run, numbered like it; a test that needs two
/// runs claiming one epoch (a restored coordinator log) names the incarnation itself.
pub fn run(epoch: u64) -> Incarnation {
    Incarnation(epoch)
}

/// The global id `coordinator` composes for the `position`th attempt of its run `incarnation`.
pub fn gtid_of(coordinator: &str, incarnation: Incarnation, position: u64) -> GlobalTxId {
    GlobalTxId::compose(&coord(coordinator), incarnation, position)
}

/// The attempt most tests mean by a client id: begun by c1's first run, at a position derived
/// from the id, so naming the same txid again names the same attempt (the tests written before
/// global ids rely on that), while two txids never share one. These positions do not rise in
/// the order attempts begin, as a real run's do; a test in which tombstones expire (each leaves
/// a mark that makes attempts of its run at or below its position vote no) composes its ids
/// with [`gtid_of`] instead.
pub fn gtid(txid: &str) -> GlobalTxId {
    let position = Fnv128::default().field(txid.as_bytes()).finish() as u64;
    gtid_of(C1, run(1), position)
}

/// Who sends a protocol message: a coordinator id and the run it fences with.
#[derive(Debug, Clone)]
pub struct Sender {
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub incarnation: Incarnation,
}

/// Coordinator `id` at `epoch`, in its own run for that epoch.
pub fn from(id: &str, epoch: u64) -> Sender {
    Sender {
        coordinator_id: coord(id),
        epoch: Epoch(epoch),
        incarnation: run(epoch),
    }
}

impl Sender {
    /// The same coordinator and epoch, claimed by another run.
    pub fn in_run(self, incarnation: u64) -> Sender {
        Sender {
            incarnation: Incarnation(incarnation),
            ..self
        }
    }
}

/// A prepare for attempt `gtid` (its position is the one composed into it, 0 for an opaque id).
pub fn prepare_as(
    txid: &str,
    gtid: &GlobalTxId,
    sender: &Sender,
    payload: Value,
) -> PrepareRequest {
    PrepareRequest {
        txid: tx(txid),
        gtid: gtid.clone(),
        coordinator_id: sender.coordinator_id.clone(),
        epoch: sender.epoch,
        incarnation: sender.incarnation,
        position: gtid.parts().map_or(0, |(_, _, position)| position),
        payload,
        started_at_ms: None,
        lock_wait_ms: None,
        participants: None,
    }
}

pub fn decision_as(txid: &str, gtid: &GlobalTxId, sender: &Sender) -> DecisionRequest {
    DecisionRequest {
        txid: tx(txid),
        gtid: gtid.clone(),
        coordinator_id: sender.coordinator_id.clone(),
        epoch: sender.epoch,
        incarnation: sender.incarnation,
    }
}

/// A prepare of `txid`'s attempt ([`gtid`]) from c1 at `epoch`.
pub fn prepare(txid: &str, epoch: u64, payload: Value) -> PrepareRequest {
    prepare_as(txid, &gtid(txid), &from(C1, epoch), payload)
}

/// A commit or abort of `txid`'s attempt ([`gtid`]) from c1 at `epoch`.
pub fn decision(txid: &str, epoch: u64) -> DecisionRequest {
    decision_as(txid, &gtid(txid), &from(C1, epoch))
}

pub fn add(key: &str, n: i64) -> Value {
    json!({"key": key, "n": n})
}
