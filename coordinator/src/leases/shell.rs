//! The lease service's in-process state: the engine behind its own lock, and the clock that
//! feeds it. The steps themselves run in `runtime::leases`, next to the log.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::engine::LeaseEngine;

/// Unix milliseconds that never jump within a run: the wall clock read once at start, plus
/// monotonic time since. A wall clock stepped forward cannot expire a lease early (and across
/// restarts the restart rule holds every lease for its full TTL again).
#[derive(Debug, Clone, Copy)]
pub struct LeaseClock {
    base_ms: u64,
    started: Instant,
}

impl LeaseClock {
    pub fn starting_at(base_ms: u64) -> LeaseClock {
        LeaseClock {
            base_ms,
            started: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.base_ms.saturating_add(elapsed)
    }
}

/// The lease engine and its clock. Lock order: the transaction engine's lock (if taken) before
/// this one, never the other way round (a checkpoint takes both).
#[derive(Debug)]
pub struct Leases {
    engine: Mutex<LeaseEngine>,
    pub clock: LeaseClock,
}

impl Leases {
    pub fn new(engine: LeaseEngine, clock: LeaseClock) -> Leases {
        Leases {
            engine: Mutex::new(engine),
            clock,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, LeaseEngine> {
        // Steps do not panic on any input; after a panic the table is still the best we have.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }
}
