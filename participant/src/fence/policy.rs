//! Which fencing tokens a participant takes before the highest-token rule even applies.
//!
//! A token is only worth what the resource can check. With a fence key configured (the key the
//! lease service signs grants with, `protocol::fence_proof`), a token must carry a proof that
//! verifies for its resource, token and holder: no client can invent one, however high. With
//! no key, the participant cannot tell a granted token from an invented one; it refuses a
//! token more than `jump_max` above every token it ever accepted, which stops a typo (or a
//! lone 2^64-1) from fencing a resource off for ever, but not a forger who climbs in steps:
//! configure a key where clients are not trusted (docs/leases.md, "Threat model").

use protocol::fence_proof::{FenceKeys, ProofError};
use protocol::lease::FenceClaim;
use serde::{Deserialize, Serialize};

/// The default bound on a token's jump above every token accepted here: tokens come from one
/// counter for every lease name, so a resource that was quiet while a billion leases were
/// granted elsewhere is the only honest writer it stops.
pub const FENCE_TOKEN_JUMP_MAX_DEFAULT: u64 = 1_000_000_000;

/// How tokens are judged.
#[derive(Debug, Clone)]
pub struct FencePolicy {
    /// With keys, a token must carry the lease service's proof, and there is no jump bound.
    pub keys: Option<FenceKeys>,
    /// Without keys: the most a token may rise above every token accepted here.
    pub jump_max: u64,
}

impl Default for FencePolicy {
    fn default() -> Self {
        FencePolicy {
            keys: None,
            jump_max: FENCE_TOKEN_JUMP_MAX_DEFAULT,
        }
    }
}

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

/// Why a fence claim may not write. The text starts with the error code, as a prepare's no
/// vote carries it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceRefusal {
    #[error(transparent)]
    Stale(StaleToken),
    /// The claim's proof is missing or does not verify (a key is configured).
    #[error("invalid_fence_proof: token {token} for {resource:?}: {error}")]
    Unproven {
        resource: String,
        token: u64,
        error: ProofError,
    },
    /// No key is configured and the token jumps too far above every token accepted here.
    #[error(
        "token_too_high: token {token} for {resource:?} is more than {jump_max} above the \
         highest token accepted here ({ceiling}); a lease service hands tokens out one by one. \
         Refused unless the participant checks proofs (--fence-key-file, docs/leases.md)"
    )]
    TooHigh {
        resource: String,
        token: u64,
        ceiling: u64,
        jump_max: u64,
    },
}

impl FencePolicy {
    /// The policy's part of the check: proof, or the jump bound over `ceiling` (the highest
    /// token the resource, or any resource here, takes now).
    pub(crate) fn admits(&self, claim: &FenceClaim, ceiling: u64) -> Result<(), FenceRefusal> {
        match &self.keys {
            Some(keys) => keys
                .verify(
                    &claim.resource,
                    claim.token,
                    claim.holder.as_deref(),
                    claim.proof.as_deref(),
                )
                .map_err(|error| FenceRefusal::Unproven {
                    resource: claim.resource.clone(),
                    token: claim.token,
                    error,
                }),
            None if claim.token > ceiling.saturating_add(self.jump_max) => {
                Err(FenceRefusal::TooHigh {
                    resource: claim.resource.clone(),
                    token: claim.token,
                    ceiling,
                    jump_max: self.jump_max,
                })
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn without_a_key_only_a_jump_past_the_bound_is_refused() {
        let policy = FencePolicy {
            keys: None,
            jump_max: 10,
        };
        assert!(policy.admits(&FenceClaim::unproven("r", 10), 0).is_ok());
        assert!(matches!(
            policy.admits(&FenceClaim::unproven("r", 11), 0),
            Err(FenceRefusal::TooHigh { ceiling: 0, .. })
        ));
        assert!(policy.admits(&FenceClaim::unproven("r", 15), 5).is_ok());
        assert!(
            policy
                .admits(&FenceClaim::unproven("r", u64::MAX), u64::MAX - 1)
                .is_ok()
        );
        assert!(
            policy
                .admits(&FenceClaim::unproven("r", u64::MAX), 1_000)
                .is_err()
        );
    }

    #[test]
    fn with_a_key_only_a_granted_token_passes_whatever_its_size() {
        let keys = FenceKeys::parse("k", KEY).unwrap();
        let policy = FencePolicy {
            keys: Some(keys.clone()),
            jump_max: 0,
        };
        let mut claim = FenceClaim::unproven("r", u64::MAX);
        assert!(matches!(
            policy.admits(&claim, 0),
            Err(FenceRefusal::Unproven {
                error: ProofError::Missing,
                ..
            })
        ));
        claim.holder = Some("w".into());
        claim.proof = Some(keys.sign("r", u64::MAX, "w"));
        assert!(policy.admits(&claim, 0).is_ok(), "no jump bound with a key");
        claim.token = 7;
        let refused = policy.admits(&claim, 0).unwrap_err();
        assert!(refused.to_string().starts_with("invalid_fence_proof: "));
    }
}
