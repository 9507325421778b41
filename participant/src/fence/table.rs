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
//! dropped silently.
//!
//! The only way a highest token falls is an operator's reset ([`FenceReset`]): audited,
//! logged, and compare-and-set on the highest the operator saw.

use std::collections::{BTreeMap, BTreeSet};

use protocol::digest::Digest;
use protocol::lease::FenceClaim;
pub use protocol::lease::FenceReset;
use serde::{Deserialize, Serialize};

use super::policy::{FencePolicy, FenceRefusal, StaleToken};

/// Most resets kept in the table's audit trail (the oldest go first; each is also in the log
/// until a checkpoint drops its segment).
pub const RESETS_KEPT_MAX: usize = 1_000;

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

/// An op id reused for another write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpIdReused;

/// How long entries are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceRetention {
    /// A resource's highest token, after its last accepted write.
    pub highest_ms: u64,
    /// An op id's answer, after it was given.
    pub answers_ms: u64,
    /// Most op answers kept.
    pub answers_max: usize,
}

impl Default for FenceRetention {
    fn default() -> Self {
        FenceRetention {
            highest_ms: 7 * 24 * 60 * 60 * 1000,
            answers_ms: 24 * 60 * 60 * 1000,
            answers_max: 1_000_000,
        }
    }
}

/// Entries the retention took, since the table was created (carried in checkpoints).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pruned {
    pub highest: u64,
    pub answers: u64,
}

/// An operator's reset of one resource's highest token: `POST /v1/fences/{resource}/reset`
/// with a [`protocol::lease::FenceResetBody`], the operator's name from their token when
/// authentication is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceResetRequest {
    pub resource: String,
    /// The highest token the operator saw: the reset applies only if it still is the highest.
    pub from: u64,
    /// The new highest: below `from`.
    pub to: u64,
    pub operator: String,
    pub reason: String,
}

/// Why a reset is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetRefused {
    #[error("no token was ever accepted for {resource:?} here; there is nothing to reset")]
    Unknown { resource: String },
    #[error(
        "the highest token for {resource:?} is {highest}, not {expected}: it changed since it \
         was read; read it again and decide again"
    )]
    Changed {
        resource: String,
        expected: u64,
        highest: u64,
    },
    #[error("a reset lowers the highest token: to ({to}) must be below from ({from})")]
    NotLower { from: u64, to: u64 },
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

    /// Checks an operator's reset against the table as it stands.
    pub fn check_reset(&self, request: &FenceResetRequest) -> Result<(), ResetRefused> {
        let resource = &request.resource;
        let Some(highest) = self.effective_highest(resource) else {
            return Err(ResetRefused::Unknown {
                resource: resource.clone(),
            });
        };
        if highest != request.from {
            return Err(ResetRefused::Changed {
                resource: resource.clone(),
                expected: request.from,
                highest,
            });
        }
        if request.to >= request.from {
            return Err(ResetRefused::NotLower {
                from: request.from,
                to: request.to,
            });
        }
        Ok(())
    }

    /// Lowers a resource's highest token (live, once checked, and at replay, in log order).
    pub fn apply_reset(&mut self, reset: FenceReset) {
        self.highest.insert(reset.resource.clone(), reset.to);
        self.stamp_written(&reset.resource, reset.at_ms);
        self.recompute_ceiling();
        self.resets.push(reset);
        if self.resets.len() > RESETS_KEPT_MAX {
            let excess = self.resets.len() - RESETS_KEPT_MAX;
            self.resets.drain(..excess);
        }
    }

    /// Drops what `retention` no longer keeps, as of `now_ms`; a resource for which `locked`
    /// says a prepared transaction holds its fence is kept. Returns what it took.
    pub fn prune(
        &mut self,
        now_ms: u64,
        retention: &FenceRetention,
        locked: impl Fn(&str) -> bool,
    ) -> Pruned {
        if self.unstamped {
            self.stamp_all(now_ms);
        }
        let mut took = Pruned::default();
        let cutoff = now_ms.saturating_sub(retention.highest_ms);
        let due: Vec<(u64, String)> = self
            .by_written
            .iter()
            .take_while(|(at, _)| *at < cutoff)
            .filter(|(_, resource)| !locked(resource))
            .cloned()
            .collect();
        for (at, resource) in due {
            self.by_written.remove(&(at, resource.clone()));
            self.written_at_ms.remove(&resource);
            if let Some(highest) = self.highest.remove(&resource) {
                self.floor = self.floor.max(highest);
                took.highest += 1;
            }
        }
        let cutoff = now_ms.saturating_sub(retention.answers_ms);
        while let Some((at, op_id)) = self.by_answered.first().cloned() {
            let over_count = self.answers.len() > retention.answers_max;
            if at >= cutoff && !over_count {
                break;
            }
            self.by_answered.remove(&(at, op_id.clone()));
            self.answered_at_ms.remove(&op_id);
            self.digests.remove(&op_id);
            if self.answers.remove(&op_id).is_some() {
                took.answers += 1;
            }
        }
        if took.highest > 0 {
            self.recompute_ceiling();
        }
        self.pruned.highest += took.highest;
        self.pruned.answers += took.answers;
        took
    }

    fn stamp_all(&mut self, now_ms: u64) {
        let resources: Vec<String> = self
            .highest
            .keys()
            .filter(|r| !self.written_at_ms.contains_key(*r))
            .cloned()
            .collect();
        for resource in resources {
            self.stamp_written(&resource, now_ms);
        }
        let ops: Vec<String> = self
            .answers
            .keys()
            .filter(|op| !self.answered_at_ms.contains_key(*op))
            .cloned()
            .collect();
        for op_id in ops {
            self.answered_at_ms.insert(op_id.clone(), now_ms);
            self.by_answered.insert((now_ms, op_id));
        }
        self.unstamped = false;
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
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(token: u64) -> FenceClaim {
        FenceClaim::unproven("orders", token)
    }

    fn open() -> FencePolicy {
        FencePolicy {
            keys: None,
            jump_max: u64::MAX,
        }
    }

    fn stale(token: u64, highest: u64) -> FenceRefusal {
        FenceRefusal::Stale(StaleToken {
            resource: "orders".into(),
            token,
            highest,
        })
    }

    #[test]
    fn lower_tokens_are_stale_equal_and_higher_pass_and_highest_never_falls() {
        let mut fences = Fences::default();
        assert!(fences.check(&claim(41), &open()).is_ok());
        fences.accept(&claim(42), 1);
        assert_eq!(fences.check(&claim(41), &open()), Err(stale(41, 42)));
        assert!(fences.check(&claim(42), &open()).is_ok());
        fences.accept(&claim(7), 2);
        assert_eq!(fences.highest("orders"), Some(42));
    }

    #[test]
    fn the_jump_bound_counts_from_the_highest_token_of_any_resource() {
        let mut fences = Fences::default();
        let bounded = FencePolicy {
            keys: None,
            jump_max: 100,
        };
        assert!(fences.check(&claim(100), &bounded).is_ok());
        assert!(matches!(
            fences.check(&claim(u64::MAX), &bounded),
            Err(FenceRefusal::TooHigh { ceiling: 0, .. })
        ));
        fences.accept(&FenceClaim::unproven("other", 1_000), 1);
        assert!(fences.check(&claim(1_100), &bounded).is_ok());
        assert!(fences.check(&claim(1_101), &bounded).is_err());
    }

    #[test]
    fn the_first_answer_is_kept() {
        let mut fences = Fences::default();
        let first = FencedAnswer::Applied {
            token: 1,
            receipt: json!({"version": 1}),
        };
        let digest = Digest(1);
        fences.remember("w-1", digest, first.clone(), 5);
        fences.remember(
            "w-1",
            Digest(2),
            FencedAnswer::Applied {
                token: 2,
                receipt: json!(null),
            },
            6,
        );
        assert_eq!(fences.answer("w-1"), Some(&first));
        assert_eq!(fences.repeat("w-1", digest), Ok(Some(&first)));
        assert_eq!(fences.repeat("w-1", Digest(2)), Err(OpIdReused));
        assert_eq!(fences.repeat("w-2", Digest(2)), Ok(None));
    }

    #[test]
    fn a_reset_is_compare_and_set_and_only_lowers() {
        let mut fences = Fences::default();
        fences.accept(&claim(u64::MAX), 1);
        let request = |from, to| FenceResetRequest {
            resource: "orders".into(),
            from,
            to,
            operator: "alice".into(),
            reason: "a typo fenced it off".into(),
        };
        assert!(matches!(
            fences.check_reset(&FenceResetRequest {
                resource: "nobody".into(),
                ..request(1, 0)
            }),
            Err(ResetRefused::Unknown { .. })
        ));
        assert!(matches!(
            fences.check_reset(&request(5, 0)),
            Err(ResetRefused::Changed { highest, .. }) if highest == u64::MAX
        ));
        assert!(matches!(
            fences.check_reset(&request(u64::MAX, u64::MAX)),
            Err(ResetRefused::NotLower { .. })
        ));
        assert_eq!(fences.check_reset(&request(u64::MAX, 3)), Ok(()));
        fences.apply_reset(FenceReset {
            resource: "orders".into(),
            from: u64::MAX,
            to: 3,
            operator: "alice".into(),
            reason: "typo".into(),
            at_ms: 9,
        });
        assert_eq!(fences.highest("orders"), Some(3));
        assert!(fences.check(&claim(3), &open()).is_ok());
        assert_eq!(fences.check(&claim(2), &open()), Err(stale(2, 3)));
        assert_eq!(fences.resets().len(), 1);
        let bounded = FencePolicy {
            keys: None,
            jump_max: 10,
        };
        assert!(
            fences.check(&claim(13), &bounded).is_ok(),
            "the ceiling falls with the reset"
        );
    }

    #[test]
    fn retention_takes_old_answers_and_idle_resources_into_the_floor() {
        let retention = FenceRetention {
            highest_ms: 100,
            answers_ms: 50,
            answers_max: 2,
        };
        let mut fences = Fences::default();
        fences.accept(&claim(10), 0);
        fences.accept(&FenceClaim::unproven("busy", 20), 0);
        fences.accept(&FenceClaim::unproven("locked", 30), 0);
        let applied = FencedAnswer::Applied {
            token: 10,
            receipt: json!(null),
        };
        for (i, op) in ["a", "b", "c"].iter().enumerate() {
            fences.remember(op, Digest(i as u128), applied.clone(), 10 + i as u64);
        }
        // Over the count: the oldest answer goes at once.
        let took = fences.prune(20, &retention, |_| false);
        assert_eq!(
            took,
            Pruned {
                highest: 0,
                answers: 1
            }
        );
        assert!(fences.answer("a").is_none() && fences.answer("b").is_some());
        fences.accept(&FenceClaim::unproven("busy", 21), 90);
        let took = fences.prune(150, &retention, |r| r == "fence:locked" || r == "locked");
        assert_eq!(
            took,
            Pruned {
                highest: 1,
                answers: 2
            }
        );
        assert_eq!(fences.highest("orders"), None);
        assert_eq!(fences.highest("busy"), Some(21));
        assert_eq!(
            fences.highest("locked"),
            Some(30),
            "a locked resource stays"
        );
        assert_eq!(fences.floor(), 10);
        // The pruned resource still refuses its old holders: the floor stands for it.
        assert_eq!(fences.check(&claim(9), &open()), Err(stale(9, 10)));
        assert!(fences.check(&claim(10), &open()).is_ok());
        assert_eq!(
            fences.pruned(),
            Pruned {
                highest: 1,
                answers: 3
            }
        );
    }

    #[test]
    fn a_snapshot_round_trip_keeps_times_and_older_snapshots_are_stamped_on_the_first_pass() {
        let mut fences = Fences::default();
        fences.accept(&claim(4), 7);
        let mut back: Fences =
            serde_json::from_value(serde_json::to_value(&fences).unwrap()).unwrap();
        back.reindex();
        assert_eq!(back, fences);
        let mut old: Fences =
            serde_json::from_value(json!({"highest": {"orders": 4}, "answers": {}})).unwrap();
        old.reindex();
        let retention = FenceRetention {
            highest_ms: 100,
            ..FenceRetention::default()
        };
        assert_eq!(old.prune(1_000, &retention, |_| false).highest, 0);
        assert_eq!(old.written_at_ms("orders"), Some(1_000));
        assert_eq!(old.prune(1_101, &retention, |_| false).highest, 1);
    }
}
