//! What the proxy did, per route and per fault kind, so a test can assert a fault really fired.

use std::ops::AddAssign;

use super::schedule::Route;

/// Monotonic counters. Every request read from a caller ends in exactly one of: answered,
/// `dropped_requests`, `dropped_responses`, `partitioned`, `upstream_errors`, or the caller
/// disconnecting first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultCounts {
    /// Requests read from callers.
    pub requests: u64,
    /// Requests sent upstream, or attempted if upstream was down (a duplicate counts twice).
    pub forwarded: u64,
    /// Answers written in full to callers still connected.
    pub answered: u64,
    pub dropped_requests: u64,
    pub dropped_responses: u64,
    /// Requests that were sent a second time.
    pub duplicated: u64,
    pub delayed: u64,
    /// Requests put on hold waiting for a later one on the same route.
    pub held_for_reorder: u64,
    /// Held requests forwarded after a later one (each is one swapped pair).
    pub reordered: u64,
    /// Held requests forwarded alone: no later request within the hold time, or healed.
    pub reorder_unpaired: u64,
    /// Requests or answers dropped because the proxy was partitioned.
    pub partitioned: u64,
    /// Upstream unreachable or failed mid-answer; the caller's connection was closed at once.
    pub upstream_errors: u64,
}

/// Which counter to bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    Requests,
    Forwarded,
    Answered,
    DroppedRequests,
    DroppedResponses,
    Duplicated,
    Delayed,
    HeldForReorder,
    Reordered,
    ReorderUnpaired,
    Partitioned,
    UpstreamErrors,
}

impl FaultCounts {
    pub(crate) fn bump(&mut self, counter: Counter) {
        let field = match counter {
            Counter::Requests => &mut self.requests,
            Counter::Forwarded => &mut self.forwarded,
            Counter::Answered => &mut self.answered,
            Counter::DroppedRequests => &mut self.dropped_requests,
            Counter::DroppedResponses => &mut self.dropped_responses,
            Counter::Duplicated => &mut self.duplicated,
            Counter::Delayed => &mut self.delayed,
            Counter::HeldForReorder => &mut self.held_for_reorder,
            Counter::Reordered => &mut self.reordered,
            Counter::ReorderUnpaired => &mut self.reorder_unpaired,
            Counter::Partitioned => &mut self.partitioned,
            Counter::UpstreamErrors => &mut self.upstream_errors,
        };
        *field += 1;
    }
}

impl AddAssign for FaultCounts {
    fn add_assign(&mut self, other: FaultCounts) {
        self.requests += other.requests;
        self.forwarded += other.forwarded;
        self.answered += other.answered;
        self.dropped_requests += other.dropped_requests;
        self.dropped_responses += other.dropped_responses;
        self.duplicated += other.duplicated;
        self.delayed += other.delayed;
        self.held_for_reorder += other.held_for_reorder;
        self.reordered += other.reordered;
        self.reorder_unpaired += other.reorder_unpaired;
        self.partitioned += other.partitioned;
        self.upstream_errors += other.upstream_errors;
    }
}

/// Counters for each route.
#[derive(Debug, Default)]
pub(crate) struct RouteCounts([FaultCounts; 5]);

impl RouteCounts {
    pub(crate) fn bump(&mut self, route: Route, counter: Counter) {
        self.0[route.index()].bump(counter);
    }

    pub(crate) fn of(&self, route: Route) -> FaultCounts {
        self.0[route.index()]
    }

    pub(crate) fn total(&self) -> FaultCounts {
        let mut total = FaultCounts::default();
        for counts in self.0 {
            total += counts;
        }
        total
    }
}
