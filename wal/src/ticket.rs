//! The handle an appender waits on: a one-shot cell that the writer thread fills. Works from async
//! code (a future) and from plain threads (a condvar), and never panics inside a runtime.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::error::WalError;

type Outcome = Result<u64, WalError>;

#[derive(Default)]
struct SlotState {
    outcome: Option<Outcome>,
    waker: Option<Waker>,
    /// A thread waits on the condvar (`wait_blocking`). Only then is it notified: a notify
    /// costs a futex system call even with nobody waiting, once per record.
    blocked: bool,
}

#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    filled: Condvar,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        // A panic while holding this lock cannot leave the state half-written; keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Resolves to the record's sequence number (for a checkpoint: the last sequence number the
/// snapshot covers) once the request is written, and for forced appends and checkpoints, durable.
#[must_use = "an append is only known to be durable once its ticket resolves"]
pub struct AppendTicket {
    inner: TicketInner,
}

enum TicketInner {
    Ready(Option<Outcome>),
    Waiting(Arc<Slot>),
}

impl fmt::Debug for AppendTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppendTicket").finish_non_exhaustive()
    }
}

impl AppendTicket {
    pub(crate) fn ready(outcome: Outcome) -> Self {
        AppendTicket {
            inner: TicketInner::Ready(Some(outcome)),
        }
    }

    pub(crate) fn pair() -> (AppendTicket, Completer) {
        let slot = Arc::new(Slot::default());
        (
            AppendTicket {
                inner: TicketInner::Waiting(slot.clone()),
            },
            Completer { slot: Some(slot) },
        )
    }

    /// Waits without blocking the thread.
    pub async fn wait(self) -> Result<u64, WalError> {
        self.await
    }

    /// Blocks the calling thread (fine inside `spawn_blocking` or a plain thread).
    pub fn wait_blocking(self) -> Result<u64, WalError> {
        match self.inner {
            TicketInner::Ready(outcome) => outcome.unwrap_or(Err(WalError::Closed)),
            TicketInner::Waiting(slot) => {
                let mut state = slot.lock();
                loop {
                    if let Some(outcome) = state.outcome.take() {
                        return outcome;
                    }
                    state.blocked = true;
                    state = slot
                        .filled
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            }
        }
    }
}

impl Future for AppendTicket {
    type Output = Result<u64, WalError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().inner {
            TicketInner::Ready(outcome) => {
                Poll::Ready(outcome.take().unwrap_or(Err(WalError::Closed)))
            }
            TicketInner::Waiting(slot) => {
                let mut state = slot.lock();
                match state.outcome.take() {
                    Some(outcome) => Poll::Ready(outcome),
                    None => {
                        state.waker = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            }
        }
    }
}

/// The writer's end of a ticket. Dropping it unfilled resolves the ticket with `Closed`, so no
/// appender waits forever if the writer thread stops.
pub(crate) struct Completer {
    slot: Option<Arc<Slot>>,
}

impl fmt::Debug for Completer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completer").finish_non_exhaustive()
    }
}

impl Completer {
    pub(crate) fn complete(mut self, outcome: Outcome) {
        self.fill(outcome);
    }

    fn fill(&mut self, outcome: Outcome) {
        if let Some(slot) = self.slot.take() {
            let (waker, blocked) = {
                let mut state = slot.lock();
                state.outcome = Some(outcome);
                (state.waker.take(), state.blocked)
            };
            if blocked {
                slot.filled.notify_all();
            }
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        self.fill(Err(WalError::Closed));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_thread_blocked_on_a_ticket_is_woken_when_it_is_filled() {
        let (ticket, completer) = AppendTicket::pair();
        let (done, answered) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || done.send(ticket.wait_blocking()));
        // Let the thread block first (the notify is only sent to a thread that waits).
        std::thread::sleep(Duration::from_millis(50));
        completer.complete(Ok(7));
        let outcome = answered.recv_timeout(Duration::from_secs(5));
        assert_eq!(outcome.ok().and_then(Result::ok), Some(7));
        assert!(waiter.join().is_ok());
        // Filled before anyone waits: the answer is there at once.
        let (ticket, completer) = AppendTicket::pair();
        completer.complete(Ok(8));
        assert_eq!(ticket.wait_blocking().ok(), Some(8));
    }
}
