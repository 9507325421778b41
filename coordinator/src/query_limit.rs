//! Per-caller budget for decision queries about attempts this coordinator has no record of.
//!
//! Such a query is cheap for the caller and answered from memory and the outcome index, but
//! an unauthenticated stream of them would still cost index reads and fill logs. Each caller
//! (by address) gets a token bucket: `burst` answers at once, refilled at `per_second`. Known
//! attempts are never charged, so a participant catching up after an outage is not slowed.
//! When peers authenticate, only peers reach the decision route and no limit applies.
//!
//! Pure: the clock arrives as `now_ms`. The table is bounded: past `callers_max` addresses,
//! the one seen longest ago is forgotten (it starts again with a full bucket, which is the
//! worst an attacker with many addresses gets anyway).

use std::collections::HashMap;
use std::net::IpAddr;

/// How many unknown-attempt answers a caller may get.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryLimit {
    pub per_second: f64,
    pub burst: f64,
    pub callers_max: usize,
}

impl Default for QueryLimit {
    fn default() -> Self {
        QueryLimit {
            per_second: 100.0,
            burst: 1000.0,
            callers_max: 4096,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: u64,
}

/// The buckets of every caller seen recently.
#[derive(Debug)]
pub struct QueryLimiter {
    limit: QueryLimit,
    buckets: HashMap<IpAddr, Bucket>,
}

impl QueryLimiter {
    pub fn new(limit: QueryLimit) -> QueryLimiter {
        QueryLimiter {
            limit,
            buckets: HashMap::new(),
        }
    }

    /// Takes one answer from `caller`'s budget; false when there was none left.
    pub fn charge(&mut self, caller: IpAddr, now_ms: u64) -> bool {
        let bucket = self.refilled(caller, now_ms);
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }

    /// Seconds until `caller` has one answer of budget again (at least 1, for `Retry-After`).
    pub fn retry_after_s(&self, caller: IpAddr) -> u64 {
        let missing = self
            .buckets
            .get(&caller)
            .map_or(0.0, |bucket| (1.0 - bucket.tokens).max(0.0));
        if self.limit.per_second <= 0.0 {
            return 60;
        }
        ((missing / self.limit.per_second).ceil() as u64).max(1)
    }

    pub fn callers(&self) -> usize {
        self.buckets.len()
    }

    fn refilled(&mut self, caller: IpAddr, now_ms: u64) -> &mut Bucket {
        if !self.buckets.contains_key(&caller) && self.buckets.len() >= self.limit.callers_max {
            let stalest = self
                .buckets
                .iter()
                .min_by_key(|(_, bucket)| bucket.at_ms)
                .map(|(address, _)| *address);
            if let Some(stalest) = stalest {
                self.buckets.remove(&stalest);
            }
        }
        let limit = self.limit;
        let bucket = self.buckets.entry(caller).or_insert(Bucket {
            tokens: limit.burst,
            at_ms: now_ms,
        });
        // A clock that went back refills nothing rather than draining.
        let elapsed_ms = now_ms.saturating_sub(bucket.at_ms);
        bucket.tokens =
            (bucket.tokens + elapsed_ms as f64 * limit.per_second / 1000.0).min(limit.burst);
        bucket.at_ms = bucket.at_ms.max(now_ms);
        bucket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_second: f64, burst: f64, callers_max: usize) -> QueryLimiter {
        QueryLimiter::new(QueryLimit {
            per_second,
            burst,
            callers_max,
        })
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn a_burst_then_the_rate_and_callers_are_separate() {
        let mut limiter = limiter(10.0, 3.0, 16);
        assert!((0..3).all(|_| limiter.charge(A, 1_000)));
        assert!(!limiter.charge(A, 1_000));
        assert!(!limiter.charge(A, 1_050));
        assert!(
            limiter.charge(B, 1_000),
            "another caller has its own budget"
        );
        // 10 per second: one more every 100 ms, never more than the burst.
        assert!(limiter.charge(A, 1_100));
        assert!(!limiter.charge(A, 1_100));
        assert!((0..3).all(|_| limiter.charge(A, 60_000)));
        assert!(!limiter.charge(A, 60_000));
    }

    #[test]
    fn a_clock_going_back_refills_nothing() {
        let mut limiter = limiter(10.0, 1.0, 16);
        assert!(limiter.charge(A, 5_000));
        assert!(!limiter.charge(A, 1_000));
        assert!(!limiter.charge(A, 5_050));
        assert!(limiter.charge(A, 5_100));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_stalest_caller() {
        let mut limiter = limiter(1.0, 1.0, 2);
        assert!(limiter.charge(A, 0));
        assert!(limiter.charge(B, 10));
        let c = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3));
        assert!(limiter.charge(c, 20));
        assert_eq!(limiter.callers(), 2);
        // A was forgotten: it starts again with a full bucket; B was not.
        assert!(!limiter.charge(B, 20));
        assert!(limiter.charge(A, 20));
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        let mut limiter = limiter(0.5, 1.0, 16);
        assert!(limiter.charge(A, 0));
        assert_eq!(limiter.retry_after_s(A), 2);
        assert_eq!(limiter.retry_after_s(B), 1);
    }
}
