//! The fence table: the highest token accepted per fenced resource, and the first answer per
//! fenced-write op id with the digest of the write it answered.
//!
//! Retention (docs/leases.md, "Retention"), like the tombstones': an op id's answer is kept for
//! `answers_ms` (and at most `answers_max` of them, oldest first); after that a retry of it is
//! a new write. A resource's highest token is kept for `highest_ms` after its last accepted
//! write; when it goes, its token joins the `floor`, and a resource with no entry takes no
//! token below the floor. Tokens come from one counter for every lease name, so the next grant
//! of any lease is above every pruned token: pruning frees memory without letting a stale
//! holder back in. Every pruned entry is counted (`Pruned`, exported as metrics), never
//! dropped silently. The retention pass is `retention`'s.
//!
//! The only way a highest token falls is an operator's reset ([`FenceReset`]): audited,
//! logged, and compare-and-set on the highest the operator saw (`reset`).

mod reset;
mod retention;

use std::collections::{BTreeMap, BTreeSet};

use protocol::digest::Digest;
use protocol::lease::FenceClaim;
pub use protocol::lease::FenceReset;
use serde::{Deserialize, Serialize};

use super::policy::{FencePolicy, FenceRefusal, StaleToken};
pub use reset::{FenceResetRequest, RESETS_KEPT_MAX, ResetRefused};
pub use retention::FenceRetention;

/// The first answer to a fenced write, kept by its `op_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum FencedAnswer {
    /// Applied under `token` (0 for a write without a fence); `receipt` is what the resource
    /// said about the write ([`crate::Resource::receipt`], or `write_receipt` for a
    /// [`crate::Participant::write`]).
    Applied {
        token: u64,
        receipt: serde_json::Value,
        /// The intents the write recorded, with their seqs (none for a plain fenced write,
        /// and in answers kept before the outbox).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        intents: Vec<protocol::outbox::IntentRef>,
    },
    /// Refused, never applied.
    Stale(StaleToken),
}

/// An op id reused for another write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpIdReused;

/// Entries the retention took, since the table was created (carried in checkpoints).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pruned {
    pub highest: u64,
    pub answers: u64,
}

/// Highest accepted token per fenced resource, and the first answer per fenced-write op id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fences {
    highest: BTreeMap<String, u64>,
    answers: BTreeMap<String, FencedAnswer>,
    /// What each answered op wrote ([`super::FencedWrite::digest`]); absent in snapshots
    /// written before op ids were checked against the write (their repeats get the first
    /// answer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    digests: BTreeMap<String, Digest>,
    /// When each resource last accepted a token; absent in older snapshots (stamped at the
    /// first retention pass, so they are kept a whole retention from then).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    written_at_ms: BTreeMap<String, u64>,
    /// When each op id was answered (absent in older snapshots, as above).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    answered_at_ms: BTreeMap<String, u64>,
    /// The highest token of every resource whose entry retention took.
    #[serde(default, skip_serializing_if = "is_zero")]
    floor: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    resets: Vec<FenceReset>,
    #[serde(default)]
    pruned: Pruned,
    /// The highest token any resource with an entry takes: with the resource's own, what a
    /// jump is measured from (tokens come from one counter, so a resource new here may start
    /// near it). Rebuilt by `reindex`.
    #[serde(skip)]
    ceiling: u64,
    #[serde(skip)]
    by_written: BTreeSet<(u64, String)>,
    #[serde(skip)]
    by_answered: BTreeSet<(u64, String)>,
    /// Some entries carry no time yet (an older snapshot): the next retention pass stamps them.
    #[serde(skip)]
    unstamped: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Fences {
    /// Rebuilds what is not serialized (after a snapshot is loaded).
    pub fn reindex(&mut self) {
        self.by_written = self
            .written_at_ms
            .iter()
            .map(|(r, at)| (*at, r.clone()))
            .collect();
        self.by_answered = self
            .answered_at_ms
            .iter()
            .map(|(op, at)| (*at, op.clone()))
            .collect();
        self.unstamped = self.highest.len() > self.written_at_ms.len()
            || self.answers.len() > self.answered_at_ms.len();
        self.recompute_ceiling();
    }

    fn recompute_ceiling(&mut self) {
        self.ceiling = self.highest.values().copied().max().unwrap_or(0);
    }

    /// The highest token accepted for `resource` (none yet: `None`); ignores the floor.
    pub fn highest(&self, resource: &str) -> Option<u64> {
        self.highest.get(resource).copied()
    }

    /// The token below which `resource` takes nothing: its highest, or the floor when
    /// retention took its entry (or it never had one). `None`: anything goes.
    pub fn effective_highest(&self, resource: &str) -> Option<u64> {
        self.highest(resource)
            .or((self.floor > 0).then_some(self.floor))
    }

    /// When `resource` last accepted a token.
    pub fn written_at_ms(&self, resource: &str) -> Option<u64> {
        self.written_at_ms.get(resource).copied()
    }

    pub fn floor(&self) -> u64 {
        self.floor
    }

    pub fn pruned(&self) -> Pruned {
        self.pruned
    }

    /// The resets kept, oldest first.
    pub fn resets(&self) -> &[FenceReset] {
        &self.resets
    }

    /// Ok when `claim` may write: the policy admits it (proof, or jump bound) and its token is
    /// no lower than any accepted for its resource (equal tokens are the current owner writing
    /// again).
    pub fn check(&self, claim: &FenceClaim, policy: &FencePolicy) -> Result<(), FenceRefusal> {
        let effective = self.effective_highest(&claim.resource);
        policy.admits(claim, self.ceiling.max(effective.unwrap_or(0)))?;
        match effective {
            Some(highest) if claim.token < highest => Err(FenceRefusal::Stale(StaleToken {
                resource: claim.resource.clone(),
                token: claim.token,
                highest,
            })),
            _ => Ok(()),
        }
    }

    pub fn check_all(
        &self,
        claims: &[FenceClaim],
        policy: &FencePolicy,
    ) -> Result<(), FenceRefusal> {
        claims.iter().try_for_each(|c| self.check(c, policy))
    }

    /// Raises the resource's highest token to `claim.token` (never lowers it), at `at_ms`.
    pub fn accept(&mut self, claim: &FenceClaim, at_ms: u64) {
        let highest = self.highest.entry(claim.resource.clone()).or_insert(0);
        *highest = (*highest).max(claim.token);
        self.ceiling = self.ceiling.max(claim.token);
        self.stamp_written(&claim.resource, at_ms);
    }

    fn stamp_written(&mut self, resource: &str, at_ms: u64) {
        if let Some(before) = self.written_at_ms.insert(resource.to_string(), at_ms) {
            self.by_written.remove(&(before, resource.to_string()));
        }
        self.by_written.insert((at_ms, resource.to_string()));
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
    pub fn remember(&mut self, op_id: &str, digest: Digest, answer: FencedAnswer, at_ms: u64) {
        if self.answers.contains_key(op_id) {
            return;
        }
        self.digests.insert(op_id.to_string(), digest);
        self.answers.insert(op_id.to_string(), answer);
        self.answered_at_ms.insert(op_id.to_string(), at_ms);
        self.by_answered.insert((at_ms, op_id.to_string()));
    }

    /// Replay's `remember`: a later record for the same op id is the later fact (the live
    /// engine wrote it only after retention took the earlier answer), so it replaces it.
    pub fn remember_replayed(
        &mut self,
        op_id: &str,
        digest: Digest,
        answer: FencedAnswer,
        at_ms: u64,
    ) {
        if let Some(before) = self.answered_at_ms.remove(op_id) {
            self.by_answered.remove(&(before, op_id.to_string()));
        }
        self.answers.remove(op_id);
        self.digests.remove(op_id);
        self.remember(op_id, digest, answer, at_ms);
    }

    /// Fenced resources and remembered answers (for checkpoint pacing).
    pub fn len(&self) -> usize {
        self.highest.len() + self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0 && self.floor == 0 && self.resets.is_empty()
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
