//! The reference participant's payload and read shapes (design 3.3). They live here because the
//! workload generators, the demo and the chaos oracle speak them too.

use serde::{Deserialize, Serialize};

/// Longest key the reference KV store accepts, in bytes.
pub const KEY_LEN_MAX: usize = 256;
/// Most operations in one payload.
pub const OPS_MAX: usize = 64;

/// A participant payload for the KV store: `{"ops": [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvPayload {
    pub ops: Vec<KvOp>,
}

/// One operation. Prepare locks every key an op touches; commit applies the ops in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum KvOp {
    /// Set `key` to `value`.
    Put {
        key: String,
        value: serde_json::Value,
    },
    /// Remove `key` (a no-op when absent).
    Delete { key: String },
    /// Add `delta` to the integer at `key` (absent counts as 0); vote no if the result would be
    /// below `min`.
    Add {
        key: String,
        delta: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<i64>,
    },
    /// Vote no unless `key` is at `version` (0 = absent).
    Check { key: String, version: u64 },
    /// Vote no if `token` is lower than one this participant already accepted for `resource`
    /// (a lease's fencing token; docs/leases.md), or, at a participant that checks proofs, if
    /// `proof` is not the lease service's for (resource, token, holder); commit raises the
    /// resource's highest token.
    Fence {
        resource: String,
        token: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<String>,
    },
}

impl KvOp {
    /// The key the op touches; for a fence op, the fenced resource (the library checks and
    /// locks it, not the store).
    pub fn key(&self) -> &str {
        match self {
            KvOp::Put { key, .. }
            | KvOp::Delete { key }
            | KvOp::Add { key, .. }
            | KvOp::Check { key, .. } => key,
            KvOp::Fence { resource, .. } => resource,
        }
    }

    pub fn is_fence(&self) -> bool {
        matches!(self, KvOp::Fence { .. })
    }
}

/// `GET /v1/kv/{key}`: the committed value and its version (bumped by every committed write).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvEntry {
    pub key: String,
    pub value: serde_json::Value,
    pub version: u64,
}

/// One in-doubt transaction in `GET /v1/prepared`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedEntry {
    /// The client's id, as the coordinator sent it.
    pub txid: crate::TxId,
    /// The attempt's global id: what this participant keys the prepared state by.
    pub gtid: crate::GlobalTxId,
    pub coordinator_id: crate::CoordinatorId,
    pub epoch: crate::Epoch,
    pub incarnation: crate::Incarnation,
    pub position: u64,
    /// The coordinator's last answer to this participant's decision query (`pending`,
    /// `unknown`, ...) with its reason, once it asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer: Option<String>,
    pub keys: Vec<String>,
    /// Unix milliseconds when it was prepared (0 when recovered from an older log).
    pub prepared_at_ms: u64,
}

/// `GET /v1/prepared`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedList {
    pub prepared: Vec<PreparedEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ops_round_trip_in_contract_shape() {
        let wire = json!({"ops": [
            {"op": "put", "key": "k", "value": "v"},
            {"op": "delete", "key": "k"},
            {"op": "add", "key": "stock:sku-1", "delta": -1, "min": 0},
            {"op": "check", "key": "k", "version": 3}
        ]});
        let payload: KvPayload = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(payload.ops.len(), 4);
        assert_eq!(payload.ops[2].key(), "stock:sku-1");
        assert_eq!(serde_json::to_value(&payload).unwrap(), wire);
    }

    #[test]
    fn bad_ops_are_rejected() {
        for bad in [
            json!({"ops": [{"op": "frobnicate", "key": "k"}]}),
            json!({"ops": [{"op": "put", "key": "k"}]}),
            json!({"ops": [{"op": "add", "key": "k", "delta": "1"}]}),
            json!({"ops": [{"op": "check", "key": "k", "version": -1}]}),
            json!({"opz": []}),
        ] {
            assert!(
                serde_json::from_value::<KvPayload>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
