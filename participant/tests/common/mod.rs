//! A toy resource for the library tests: named counters. Payload `{"key": "a", "n": 3}` adds
//! `n` to counter `key`; a negative `n` is a no vote; anything else is an invalid payload.
#![allow(dead_code)]

use std::collections::BTreeMap;

use participant::{InvalidPayload, Resource};
use protocol::{CoordinatorId, DecisionRequest, Epoch, PrepareRequest, TxId};
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
        Ok(Add {
            key: key.to_string(),
            n,
        })
    }

    fn lock_keys(&self, staged: &Add) -> Vec<String> {
        vec![staged.key.clone()]
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

pub fn prepare(txid: &str, epoch: u64, payload: Value) -> PrepareRequest {
    PrepareRequest {
        txid: tx(txid),
        coordinator_id: coord("c1"),
        epoch: Epoch(epoch),
        payload,
    }
}

pub fn decision(txid: &str, epoch: u64) -> DecisionRequest {
    DecisionRequest {
        txid: tx(txid),
        coordinator_id: coord("c1"),
        epoch: Epoch(epoch),
    }
}

pub fn add(key: &str, n: i64) -> Value {
    json!({"key": key, "n": n})
}
