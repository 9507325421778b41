//! The fencing simulation's adversaries (`sim::fencing`): a client that forges fencing tokens
//! and reuses other writers' op ids, and the operator who resets a fence that a forged token
//! raised.
//!
//! The forger has no fence key and never sees a proof (proofs travel only to their holders,
//! over TLS in production): it can send any number with a missing or made-up proof, and any op
//! id it saw answered. With a key the participant must refuse every one of its tokens; without
//! one, the jump bound is all that stands, so a token just above the last grant gets in and
//! the operator must step in. Pure: every choice comes from the seeded generator.

use participant::fence::{FenceResetRequest, FencedWrite};
use protocol::lease::FenceClaim;

/// What a forged write pretends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forged {
    /// Token 2^64-1, no proof: one write that would fence the resource off for ever.
    MaxToken,
    /// A token far past the jump bound above the last grant, with a made-up proof.
    FarAbove,
    /// A token just above the last grant (within the bound), with a made-up proof.
    JustAbove,
    /// An honest writer's op id, answered already, reused for another write.
    ReusedOpId,
}

fn made_up_proof(rng: &mut fastrand::Rng) -> String {
    (0..64)
        .map(|_| char::from(b"0123456789abcdef"[rng.usize(0..16)]))
        .collect()
}

/// What the forger aims at: the fenced resource, and the participant's jump bound (known
/// from the docs: it is a default, not a secret).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub resource: &'a str,
    pub jump_max: u64,
}

/// One forged write (or none this turn). `known` are op ids the forger saw answered; `n`
/// numbers its own op ids (`f-N`, which no honest writer uses).
pub fn forge(
    rng: &mut fastrand::Rng,
    target: Target<'_>,
    highest_granted: u64,
    known: &[String],
    n: u64,
) -> Option<(FencedWrite, Forged)> {
    let Target { resource, jump_max } = target;
    let forged = match rng.u32(0..4) {
        0 => Forged::MaxToken,
        1 => Forged::FarAbove,
        2 => Forged::JustAbove,
        _ if !known.is_empty() => Forged::ReusedOpId,
        _ => Forged::JustAbove,
    };
    let (token, proof) = match forged {
        Forged::MaxToken => (u64::MAX, None),
        Forged::FarAbove => (
            highest_granted.saturating_add(jump_max * 10 + rng.u64(0..1_000)),
            Some(made_up_proof(rng)),
        ),
        Forged::JustAbove => (
            highest_granted.saturating_add(rng.u64(1..jump_max / 4)),
            Some(made_up_proof(rng)),
        ),
        Forged::ReusedOpId => (highest_granted, None),
    };
    let op_id = match forged {
        Forged::ReusedOpId => known[rng.usize(0..known.len())].clone(),
        _ => format!("f-{n}"),
    };
    let write = FencedWrite {
        op_id,
        fence: FenceClaim {
            resource: resource.into(),
            token,
            holder: Some("forger".into()),
            proof,
        },
        payload: serde_json::json!({"ops": [
            {"op": "put", "key": "forged", "value": format!("forged-{n}")}
        ]}),
    };
    Some((write, forged))
}

/// The operator's reset when the fence they read (`seen`) stands above every token the lease
/// service granted: back to the last grant, compare-and-set on what they read.
pub fn reset_if_forged(
    resource: &str,
    seen: Option<u64>,
    highest_granted: u64,
) -> Option<FenceResetRequest> {
    let seen = seen?;
    (seen > highest_granted).then(|| FenceResetRequest {
        resource: resource.into(),
        from: seen,
        to: highest_granted,
        operator: "sim-operator".into(),
        reason: format!("token {seen} was never granted; the last grant is {highest_granted}"),
    })
}
