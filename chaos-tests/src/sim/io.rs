//! What a node wrapper may touch while it handles an event: the simulated clock, the seeded
//! generator, request ids, and the outboxes the scheduler drains (messages for the network,
//! timed events for the queue).

use super::Mutation;
use super::net::{Ev, Msg, RequestId};

#[derive(Debug)]
pub struct Io {
    pub now_ms: u64,
    pub rng: fastrand::Rng,
    pub next_rid: RequestId,
    pub mutation: Mutation,
    /// Longest fdatasync of this run.
    pub sync_max_ms: u64,
    pub msgs: Vec<Msg>,
    /// Events at absolute simulated times.
    pub events: Vec<(u64, Ev)>,
    /// Whether to keep the step trace.
    pub tracing: bool,
    /// Notes for the step trace.
    pub notes: Vec<String>,
}

impl Io {
    pub fn new(seed: u64, mutation: Mutation) -> Self {
        Self {
            now_ms: 0,
            rng: fastrand::Rng::with_seed(seed),
            next_rid: 1,
            mutation,
            sync_max_ms: 3,
            msgs: Vec::new(),
            events: Vec::new(),
            tracing: false,
            notes: Vec::new(),
        }
    }

    pub fn rid(&mut self) -> RequestId {
        let rid = self.next_rid;
        self.next_rid += 1;
        rid
    }

    pub fn send(&mut self, msg: Msg) {
        self.msgs.push(msg);
    }

    pub fn after(&mut self, delay_ms: u64, ev: Ev) {
        self.events.push((self.now_ms + delay_ms, ev));
    }

    /// Adds a note to the step trace (built only when tracing: a failing seed is replayed
    /// with tracing on, so the fast path formats nothing).
    pub fn note(&mut self, note: impl FnOnce() -> String) {
        if self.tracing {
            self.notes.push(note());
        }
    }
}
