//! Fencing tokens at the resource (docs/leases.md): the reusable piece that makes a lease
//! enforceable. A lease alone protects nothing, since its holder can pause past its TTL and
//! write afterwards; the resource that remembers the highest token it accepted, per fenced
//! resource, and refuses lower ones, does.
//!
//! - [`policy`]: which tokens are worth checking at all (the lease service's proof when a key
//!   is configured, a bound on jumps when not) and the refusals;
//! - [`table`]: the highest token per resource and the first answer per op id, with their
//!   retention and the operator's reset;
//! - here: the claims a write or a 2PC payload carries.
//!
//! The engine keeps one table, checks it for fenced writes (`PUT /v1/kv/{key}` at the
//! reference participant, or [`crate::Participant::fenced_write`] in any embedding service),
//! for `fence` ops inside 2PC payloads (the prepare votes no) and inside saga steps, and logs
//! it with the write it guards, in one record. It never lowers a highest token except by an
//! audited operator reset, and never forgets an op's answer before its documented retention.

pub mod policy;
pub mod table;

use protocol::digest::Digest;
use protocol::lease::{FenceClaim, OP_ID_LEN_MAX, check_lease_id};

use crate::resource::InvalidPayload;

pub use policy::{FencePolicy, FenceRefusal, StaleToken};
pub use table::{FenceReset, FenceResetRequest, FencedAnswer, Fences, OpIdReused, ResetRefused};

/// A write outside 2PC, guarded by a fence and named by an op id.
#[derive(Debug, Clone, PartialEq)]
pub struct FencedWrite {
    pub op_id: String,
    pub fence: FenceClaim,
    /// A payload for the resource, applied at once when the fence holds.
    pub payload: serde_json::Value,
}

impl FencedWrite {
    /// Checks the op id and the fence's names (answered as 422 `invalid_id`).
    pub fn check_ids(&self) -> Result<(), protocol::IdError> {
        protocol::ids::check_id("op_id", &self.op_id, OP_ID_LEN_MAX)?;
        check_claim_ids(&self.fence)
    }

    /// What the write is, for telling a retry of it from another write under its op id.
    pub fn digest(&self) -> Digest {
        written_digest(&self.fence.resource, self.fence.token, &self.payload)
    }
}

/// The fenced resource's name and, when given, the holder's.
pub(crate) fn check_claim_ids(claim: &FenceClaim) -> Result<(), protocol::IdError> {
    check_lease_id("fence resource", &claim.resource)?;
    match &claim.holder {
        Some(holder) => check_lease_id("fence holder", holder),
        None => Ok(()),
    }
}

/// The digest of a fenced write: its resource, token and payload.
pub fn written_digest(resource: &str, token: u64, payload: &serde_json::Value) -> Digest {
    Digest::of_payload(&serde_json::json!({
        "resource": resource,
        "token": token,
        "payload": payload,
    }))
}

/// The lock key a fence claim takes, so a prepared transaction fenced on a resource and a
/// fenced write on it never interleave between check and apply.
pub fn lock_key(resource: &str) -> String {
    format!("fence:{resource}")
}

/// The `{"op":"fence","resource","token"[,"holder","proof"]}` entries of a payload's `ops`
/// array (payloads that are not objects with an `ops` array carry none). A malformed fence op
/// is invalid.
pub fn claims_in(payload: &serde_json::Value) -> Result<Vec<FenceClaim>, InvalidPayload> {
    let Some(ops) = payload.get("ops").and_then(serde_json::Value::as_array) else {
        return Ok(Vec::new());
    };
    let mut claims = Vec::new();
    for op in ops {
        if op.get("op").and_then(serde_json::Value::as_str) != Some("fence") {
            continue;
        }
        let mut fields = op.clone();
        if let Some(map) = fields.as_object_mut() {
            map.remove("op");
        }
        let claim: FenceClaim = serde_json::from_value(fields)
            .map_err(|e| InvalidPayload::new(format!("fence op: {e}")))?;
        check_claim_ids(&claim).map_err(|e| InvalidPayload::new(e.to_string()))?;
        claims.push(claim);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fence_ops_are_found_in_payloads_and_malformed_ones_refused() {
        let payload = json!({"ops": [
            {"op": "put", "key": "k", "value": 1},
            {"op": "fence", "resource": "orders", "token": 42},
            {"op": "fence", "resource": "orders", "token": 43, "holder": "w-1", "proof": "ab"}
        ]});
        let mut proven = FenceClaim::unproven("orders", 43);
        proven.holder = Some("w-1".into());
        proven.proof = Some("ab".into());
        assert_eq!(
            claims_in(&payload).unwrap(),
            vec![FenceClaim::unproven("orders", 42), proven]
        );
        assert!(claims_in(&json!({"blob": 1})).unwrap().is_empty());
        for bad in [
            json!({"ops": [{"op": "fence", "resource": "orders", "token": "42"}]}),
            json!({"ops": [{"op": "fence", "resource": "", "token": 1}]}),
            json!({"ops": [{"op": "fence", "token": 1}]}),
            json!({"ops": [{"op": "fence", "resource": "r", "token": 1, "holder": "a b"}]}),
            json!({"ops": [{"op": "fence", "resource": "r", "token": 1, "extra": 1}]}),
        ] {
            assert!(claims_in(&bad).is_err(), "{bad}");
        }
    }
}
