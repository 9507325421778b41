//! How long the fence table keeps what it holds (docs/leases.md, "Retention"): an op id's
//! answer for `answers_ms` (at most `answers_max`, oldest first), a resource's highest token
//! for `highest_ms` after its last accepted write, after which its token joins the floor.

use super::{Fences, Pruned};

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

impl Fences {
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
}
