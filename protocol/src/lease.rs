//! Leases with fencing tokens (docs/leases.md): the coordinator's `/v1/leases` shapes and the
//! fenced writes a participant accepts (`PUT /v1/kv/{key}` and the `fence` op inside 2PC).
//!
//! A lease alone protects nothing: its holder can pause past its TTL and act on afterwards.
//! The token it carries protects the resource that checks it, so every shape here that writes
//! carries a `fence`.

use serde::{Deserialize, Serialize};

use crate::ids::{IdError, check_id};

/// Longest lease name and holder, in bytes (they go into URL paths and queries).
pub const LEASE_NAME_LEN_MAX: usize = 128;
/// Shortest TTL granted: a shorter request is raised to it (the granted TTL is answered).
pub const LEASE_TTL_MS_MIN: u64 = 100;
/// Longest TTL accepted; a longer request is refused (422 `invalid_ttl`).
pub const LEASE_TTL_MS_MAX: u64 = 10 * 60 * 1000;
/// TTL when a request names none.
pub const LEASE_TTL_MS_DEFAULT: u64 = 10_000;
/// Longest `op_id` of a fenced write, in bytes.
pub const OP_ID_LEN_MAX: usize = 128;

/// Checks a lease name, holder, fenced resource or op id (`kind` names it in the error).
pub fn check_lease_id(kind: &'static str, value: &str) -> Result<(), IdError> {
    check_id(kind, value, LEASE_NAME_LEN_MAX)
}

/// `POST /v1/leases/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    pub holder: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// `POST /v1/leases/{name}/renew`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    pub holder: String,
    pub token: u64,
}

/// A held lease: the answer to acquire and renew, and an entry of `GET /v1/leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub name: String,
    pub holder: String,
    pub token: u64,
    pub ttl_ms: u64,
    /// Unix milliseconds (the coordinator's clock) after which the lease is free.
    pub expires_at_ms: u64,
    /// Present in reads: how long it still holds from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
    /// Present in reads; false for a lease carried across a restart after its logged expiry:
    /// it blocks new grants until its TTL has passed since the restart, but is never revived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewable: Option<bool>,
    /// In the acquire and renew answers only (never in reads: it is the holder's to use), when
    /// the coordinator has a fence key: the proof a fenced write carries with `holder` and
    /// `token` so that a resource holding the key can tell the token was granted
    /// (`crate::fence_proof`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// `GET /v1/leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseList {
    pub leases: Vec<Lease>,
}

/// `DELETE /v1/leases/{name}?holder=..&token=..`: the lease no longer holds under `token`
/// (`released` says whether this call ended it or it had already ended).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseResponse {
    pub name: String,
    pub token: u64,
    pub released: bool,
}

/// 409 `lease_held`: the error body plus who holds it and for how long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHeldBody {
    pub error: crate::ErrorCode,
    pub message: String,
    pub holder: String,
    pub expires_in_ms: u64,
}

/// The fence a write carries: the lease (resource) it claims and its token, and, for a
/// resource that checks proofs, the holder the token was granted to and the lease service's
/// proof of the grant (`crate::fence_proof`; the `proof` of the acquire answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceClaim {
    pub resource: String,
    pub token: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

impl FenceClaim {
    /// A claim without proof (for resources that check none).
    pub fn unproven(resource: impl Into<String>, token: u64) -> FenceClaim {
        FenceClaim {
            resource: resource.into(),
            token,
            holder: None,
            proof: None,
        }
    }
}

/// `PUT /v1/kv/{key}` at the reference participant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FencedPutRequest {
    pub value: serde_json::Value,
    pub fence: FenceClaim,
    pub op_id: String,
}

/// 200 to a fenced put (and, unchanged, to every repeat of its `op_id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedPutResponse {
    pub key: String,
    pub version: u64,
    pub token: u64,
}

/// 409 `stale_token`: the error body plus the highest token accepted for the resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleTokenBody {
    pub error: crate::ErrorCode,
    pub message: String,
    pub resource: String,
    pub highest: u64,
}

/// `POST /v1/fences/{resource}/reset` at a participant (operators): lower the resource's
/// highest accepted token from `from` (what the operator read, compare-and-set) to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceResetBody {
    pub from: u64,
    pub to: u64,
    /// Replaced by the operator token's name when authentication is on.
    #[serde(default)]
    pub operator: String,
    pub reason: String,
}

/// An operator's reset as the participant logged it: the answer to the reset, and an entry of
/// the resource's `resets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceReset {
    pub resource: String,
    pub from: u64,
    pub to: u64,
    pub operator: String,
    pub reason: String,
    pub at_ms: u64,
}

/// `GET /v1/fences/{resource}` at a participant (peers and operators).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceStatus {
    pub resource: String,
    /// Below this nothing is accepted for the resource (absent: anything is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest: Option<u64>,
    /// True when `highest` is the participant's floor: retention took the resource's own
    /// entry (or it never had one) and the floor stands for it.
    pub from_floor: bool,
    /// When the resource last accepted a token (absent: never, or pruned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_at_ms: Option<u64>,
    /// Operators' resets of this resource that the participant still keeps, oldest first.
    pub resets: Vec<FenceReset>,
}
