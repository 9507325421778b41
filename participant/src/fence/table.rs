//! Fencing tokens at the resource (docs/leases.md): the reusable piece that makes a lease
//! enforceable. A lease alone protects nothing, since its holder can pause past its TTL and
//! write afterwards; the resource that remembers the highest token it accepted, per fenced
//! resource, and refuses lower ones, does.
//!
//! [`Fences`] is that memory plus the answers to fenced writes by `op_id`, so a retried write
//! gets its first answer and never applies twice. The engine keeps one, checks it for fenced
//! writes (`PUT /v1/kv/{key}` at the reference participant, or
//! [`crate::Participant::fenced_write`] in any embedding service) and for `fence` ops inside
//! 2PC payloads (the prepare votes no on a stale token), and logs it with the write it guards,
//! in one record. It never lowers a highest token and never forgets an op's answer.

use std::collections::BTreeMap;

use protocol::digest::Digest;
use protocol::lease::{FenceClaim, OP_ID_LEN_MAX, check_lease_id};
use serde::{Deserialize, Serialize};

use crate::resource::InvalidPayload;

/// A write carried a token lower than one already accepted for its resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error(
    "stale_token: token {token} for {resource:?} is lower than {highest}, already accepted \
     (a newer lease holder wrote)"
)]
pub struct StaleToken {
    pub resource: String,
    pub token: u64,
    pub highest: u64,
}

/// The first answer to a fenced write, kept by its `op_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum FencedAnswer {
    /// Applied under `token`; `receipt` is what the resource said about the write
    /// ([`crate::Resource::receipt`]).
    Applied {
        token: u64,
        receipt: serde_json::Value,
    },
    /// Refused, never applied.
    Stale(StaleToken),
}

/// A write outside 2PC, guarded by a fence and named by an op id.
#[derive(Debug, Clone, PartialEq)]
pub struct FencedWrite {
    pub op_id: String,
    pub fence: FenceClaim,
    /// A payload for the resource, applied at once when the fence holds.
    pub payload: serde_json::Value,
}

impl FencedWrite {
    /// Checks the op id and the fenced resource name (answered as 422 `invalid_id`).
    pub fn check_ids(&self) -> Result<(), protocol::IdError> {
        protocol::ids::check_id("op_id", &self.op_id, OP_ID_LEN_MAX)?;
        check_lease_id("fence resource", &self.fence.resource)
    }

    /// What the write is, for telling a retry of it from another write under its op id.
    pub fn digest(&self) -> Digest {
        written_digest(&self.fence.resource, self.fence.token, &self.payload)
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

/// Highest accepted token per fenced resource, and the first answer per fenced-write op id
/// with the digest of the write it answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fences {
    highest: BTreeMap<String, u64>,
    answers: BTreeMap<String, FencedAnswer>,
    /// What each answered op wrote ([`FencedWrite::digest`]); absent in snapshots written
    /// before op ids were checked against the write (their repeats get the first answer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    digests: BTreeMap<String, Digest>,
}

/// An op id reused for another write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpIdReused;

impl Fences {
    /// The highest token accepted for `resource` (none yet: `None`).
    pub fn highest(&self, resource: &str) -> Option<u64> {
        self.highest.get(resource).copied()
    }

    /// Ok when `claim` may write: its token is no lower than any accepted (equal tokens are the
    /// current owner writing again).
    pub fn check(&self, claim: &FenceClaim) -> Result<(), StaleToken> {
        match self.highest(&claim.resource) {
            Some(highest) if claim.token < highest => Err(StaleToken {
                resource: claim.resource.clone(),
                token: claim.token,
                highest,
            }),
            _ => Ok(()),
        }
    }

    pub fn check_all(&self, claims: &[FenceClaim]) -> Result<(), StaleToken> {
        claims.iter().try_for_each(|c| self.check(c))
    }

    /// Raises the resource's highest token to `claim.token` (never lowers it).
    pub fn accept(&mut self, claim: &FenceClaim) {
        let highest = self.highest.entry(claim.resource.clone()).or_insert(0);
        *highest = (*highest).max(claim.token);
    }

    /// The first answer given to `op_id`.
    pub fn answer(&self, op_id: &str) -> Option<&FencedAnswer> {
        self.answers.get(op_id)
    }

    /// The first answer to `op_id` when `digest` is the write it answered; `Err` when the op
    /// id answered another write (a reused op id must not hand out someone else's receipt).
    pub fn repeat(&self, op_id: &str, digest: Digest) -> Result<Option<&FencedAnswer>, OpIdReused> {
        let Some(answer) = self.answers.get(op_id) else {
            return Ok(None);
        };
        match self.digests.get(op_id) {
            Some(first) if *first != digest => Err(OpIdReused),
            _ => Ok(Some(answer)),
        }
    }

    /// Keeps the first answer to `op_id`, and what it wrote (a later one never replaces it).
    pub fn remember(&mut self, op_id: &str, digest: Digest, answer: FencedAnswer) {
        self.digests.entry(op_id.to_string()).or_insert(digest);
        self.answers.entry(op_id.to_string()).or_insert(answer);
    }

    /// Fenced resources and remembered answers (for checkpoint pacing).
    pub fn len(&self) -> usize {
        self.highest.len() + self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The lock key a fence claim takes, so a prepared transaction fenced on a resource and a
/// fenced write on it never interleave between check and apply.
pub fn lock_key(resource: &str) -> String {
    format!("fence:{resource}")
}

/// The `{"op":"fence","resource","token"}` entries of a payload's `ops` array (payloads that
/// are not objects with an `ops` array carry none). A malformed fence op is invalid.
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
        check_lease_id("fence resource", &claim.resource)
            .map_err(|e| InvalidPayload::new(e.to_string()))?;
        claims.push(claim);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(token: u64) -> FenceClaim {
        FenceClaim {
            resource: "orders".into(),
            token,
        }
    }

    #[test]
    fn lower_tokens_are_stale_equal_and_higher_pass_and_highest_never_falls() {
        let mut fences = Fences::default();
        assert!(fences.check(&claim(41)).is_ok());
        fences.accept(&claim(42));
        assert_eq!(
            fences.check(&claim(41)),
            Err(StaleToken {
                resource: "orders".into(),
                token: 41,
                highest: 42
            })
        );
        assert!(fences.check(&claim(42)).is_ok());
        fences.accept(&claim(7));
        assert_eq!(fences.highest("orders"), Some(42));
    }

    #[test]
    fn the_first_answer_is_kept() {
        let mut fences = Fences::default();
        let first = FencedAnswer::Applied {
            token: 1,
            receipt: json!({"version": 1}),
        };
        let digest = Digest(1);
        fences.remember("w-1", digest, first.clone());
        fences.remember(
            "w-1",
            Digest(2),
            FencedAnswer::Applied {
                token: 2,
                receipt: json!(null),
            },
        );
        assert_eq!(fences.answer("w-1"), Some(&first));
        assert_eq!(fences.repeat("w-1", digest), Ok(Some(&first)));
        assert_eq!(fences.repeat("w-1", Digest(2)), Err(OpIdReused));
        assert_eq!(fences.repeat("w-2", Digest(2)), Ok(None));
    }

    #[test]
    fn fence_ops_are_found_in_payloads_and_malformed_ones_refused() {
        let payload = json!({"ops": [
            {"op": "put", "key": "k", "value": 1},
            {"op": "fence", "resource": "orders", "token": 42}
        ]});
        assert_eq!(claims_in(&payload).unwrap(), vec![claim(42)]);
        assert!(claims_in(&json!({"blob": 1})).unwrap().is_empty());
        for bad in [
            json!({"ops": [{"op": "fence", "resource": "orders", "token": "42"}]}),
            json!({"ops": [{"op": "fence", "resource": "", "token": 1}]}),
            json!({"ops": [{"op": "fence", "token": 1}]}),
        ] {
            assert!(claims_in(&bad).is_err(), "{bad}");
        }
    }
}
