//! Prepare deadlines (`Command::ArmPrepareDeadline`), all kept by one timer task.
//!
//! A spawned sleep per transaction cost a task, a timer entry and, once the deadline passed
//! (long after almost every transaction had ended), a wake and an engine lock for nothing, for
//! every transaction (issue 28). Here arming one is a push into a heap; the task sleeps until
//! the earliest deadline and is woken early only when a new deadline comes before it (a
//! shorter timeout than those queued). Deadlines that pass together are stepped under one
//! engine lock; the engine ignores the deadline of a transaction that is no longer preparing,
//! exactly as it did when each had its own task.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use protocol::TxId;

use super::{Core, now_ms};
use crate::engine::Event;

/// How often an idle timer task checks whether its core is gone.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Longest deadline armed; the configuration's timeouts are far below it.
const ARM_MAX_MS: u64 = 365 * 24 * 3600 * 1000;

/// The armed prepare deadlines, earliest first.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    armed: Mutex<BinaryHeap<Reverse<(Instant, TxId)>>>,
    /// Wakes the timer task when a deadline earlier than every armed one arrives.
    earlier: Notify,
}

impl Deadlines {
    /// `PrepareDeadline` for `txid` after `after_ms`.
    pub(super) fn arm(&self, txid: TxId, after_ms: u64) {
        // Capped so that no timeout, however large, overflows the clock (and a year is never).
        let at = Instant::now() + Duration::from_millis(after_ms.min(ARM_MAX_MS));
        let earliest = {
            let mut armed = self.lock();
            let earliest = armed.peek().is_none_or(|Reverse((first, _))| at < *first);
            armed.push(Reverse((at, txid)));
            earliest
        };
        if earliest {
            self.earlier.notify_one();
        }
    }

    fn next(&self) -> Option<Instant> {
        self.lock().peek().map(|Reverse((at, _))| *at)
    }

    /// Takes every deadline at or before `now`.
    fn take_due(&self, now: Instant) -> Vec<TxId> {
        let mut armed = self.lock();
        let mut due = Vec::new();
        while armed.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            if let Some(Reverse((_, txid))) = armed.pop() {
                due.push(txid);
            }
        }
        due
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BinaryHeap<Reverse<(Instant, TxId)>>> {
        // Pushes and pops cannot leave the heap half-changed; keep going after a panic.
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs until the core is dropped; holds it weakly (the core owns the deadlines).
pub(super) async fn deadline_timer(core: Weak<Core>) {
    loop {
        let Some(deadlines) = core.upgrade().map(|core| core.deadlines.clone()) else {
            return;
        };
        match deadlines.next() {
            Some(at) if at > Instant::now() => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = deadlines.earlier.notified() => {}
                }
            }
            Some(_) => {}
            None => {
                let _ = tokio::time::timeout(IDLE_CHECK, deadlines.earlier.notified()).await;
            }
        }
        let due = deadlines.take_due(Instant::now());
        if due.is_empty() {
            continue;
        }
        let Some(core) = core.upgrade() else {
            return;
        };
        let now = now_ms();
        core.apply_with(|engine| {
            due.into_iter()
                .flat_map(|txid| engine.step(Event::PrepareDeadline { txid, now_ms: now }))
                .collect()
        });
    }
}
