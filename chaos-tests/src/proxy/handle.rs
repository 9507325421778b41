//! The control handle: switch faults on and off while the proxy runs, partition and heal, and
//! read what the proxy did. Cheap to clone; every clone controls the same proxy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use super::counts::{Counter, FaultCounts, RouteCounts};
use super::schedule::{Plan, Route, Rule, RuleId, Schedule};

#[derive(Debug, Clone)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
}

/// A request held for reordering: the ticket tells its own slot apart from a later one's.
#[derive(Debug)]
struct Held {
    ticket: u64,
    release: oneshot::Sender<()>,
}

#[derive(Debug)]
struct Shared {
    schedule: Mutex<Schedule>,
    partitioned: AtomicBool,
    counts: Mutex<RouteCounts>,
    counts_changed: Notify,
    /// At most one held request per route: the map is bounded by the number of routes.
    held: Mutex<HashMap<Route, Held>>,
    next_ticket: AtomicU64,
}

/// Locks even if a holder panicked: every value behind these locks stays consistent between
/// statements, so a poisoned lock carries no torn state.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ProxyHandle {
    pub(crate) fn new(seed: u64) -> ProxyHandle {
        ProxyHandle {
            shared: Arc::new(Shared {
                schedule: Mutex::new(Schedule::new(seed)),
                partitioned: AtomicBool::new(false),
                counts: Mutex::new(RouteCounts::default()),
                counts_changed: Notify::new(),
                held: Mutex::new(HashMap::new()),
                next_ticket: AtomicU64::new(0),
            }),
        }
    }

    /// Turns a fault on. Rules are independent; several may fire for one request.
    pub fn add(&self, rule: Rule) -> RuleId {
        lock(&self.shared.schedule).add(rule)
    }

    /// Turns one fault off; returns whether it was on.
    pub fn remove(&self, id: RuleId) -> bool {
        lock(&self.shared.schedule).remove(id)
    }

    pub fn rules(&self) -> Vec<(RuleId, Rule)> {
        lock(&self.shared.schedule).rules()
    }

    /// From now on nothing passes either way: new requests are dropped, and answers that come
    /// back from upstream are withheld, until [`ProxyHandle::heal`].
    pub fn partition(&self) {
        self.shared.partitioned.store(true, Ordering::SeqCst);
    }

    pub fn is_partitioned(&self) -> bool {
        self.shared.partitioned.load(Ordering::SeqCst)
    }

    /// Removes every rule, ends the partition, and releases requests held for reordering (they
    /// are forwarded alone). Requests already dropped stay dropped: healing does not resend.
    pub fn heal(&self) {
        lock(&self.shared.schedule).clear();
        self.shared.partitioned.store(false, Ordering::SeqCst);
        // Dropping the senders wakes the held requests.
        lock(&self.shared.held).clear();
    }

    /// Totals over every route.
    pub fn counts(&self) -> FaultCounts {
        lock(&self.shared.counts).total()
    }

    pub fn counts_for(&self, route: Route) -> FaultCounts {
        lock(&self.shared.counts).of(route)
    }

    /// Waits until `done` holds for the totals, at most `timeout_ms`. `Err` carries the totals
    /// at the deadline.
    pub async fn wait_for_counts(
        &self,
        timeout_ms: u64,
        done: impl Fn(&FaultCounts) -> bool,
    ) -> Result<FaultCounts, FaultCounts> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            // Created before the check, so a change between the check and the wait is not missed.
            let changed = self.shared.counts_changed.notified();
            let counts = self.counts();
            if done(&counts) {
                return Ok(counts);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(self.counts());
            }
        }
    }

    pub(crate) fn decide(&self, route: Route) -> Plan {
        lock(&self.shared.schedule).decide(route)
    }

    pub(crate) fn bump(&self, route: Route, counter: Counter) {
        lock(&self.shared.counts).bump(route, counter);
        self.shared.counts_changed.notify_waiters();
    }

    /// Takes the request held on `route`, if any, so the caller can release it after
    /// forwarding its own request.
    pub(crate) fn take_held(&self, route: Route) -> Option<oneshot::Sender<()>> {
        let held = lock(&self.shared.held).remove(&route)?;
        Some(held.release)
    }

    /// Holds the caller's request on `route` until a later one releases it (`true`), or until
    /// `hold` passes or the proxy is healed (`false`).
    pub(crate) async fn hold_for_reorder(&self, route: Route, hold: Duration) -> bool {
        let ticket = self.shared.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (release, released) = oneshot::channel();
        lock(&self.shared.held).insert(route, Held { ticket, release });
        self.bump(route, Counter::HeldForReorder);
        let outcome = tokio::time::timeout(hold, released).await;
        let mut held = lock(&self.shared.held);
        if held.get(&route).is_some_and(|h| h.ticket == ticket) {
            held.remove(&route);
        }
        matches!(outcome, Ok(Ok(())))
    }
}
