//! What a served connection is doing, as far as its deadlines care: reading a request's head
//! (since when), idle between requests (since when), or busy with requests in flight (no
//! deadline: the handlers bound their own work). The reads of the connection and the calls of
//! its service report here; the connection task asks for the deadline after every poll.
//!
//! Why not hyper's own `header_read_timeout`: it starts whenever hyper waits for a head, idle
//! kept-alive connections included, so it cannot tell an idle client (allowed minutes) from
//! one that started a head and stopped (allowed seconds).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::serve_limits::ServeLimits;

#[derive(Debug, Clone, Copy)]
enum Phase {
    Head { since: Instant },
    Idle { since: Instant },
    Busy { in_flight: usize },
}

/// The phase of one connection, shared by its stream, its service and its task.
#[derive(Debug)]
pub(crate) struct Activity {
    phase: Mutex<Phase>,
}

impl Activity {
    /// A connection accepted at `accepted` owes its first head from then on.
    pub(crate) fn new(accepted: Instant) -> Arc<Self> {
        Arc::new(Self {
            phase: Mutex::new(Phase::Head { since: accepted }),
        })
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        // The phase is a plain value: a panic elsewhere cannot leave it half written.
        self.phase
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When the connection is to be closed if nothing changes; `None` while requests run.
    pub(crate) fn deadline(&self, limits: &ServeLimits) -> Option<Instant> {
        match *self.phase() {
            Phase::Head { since } => Some(since + limits.header_read_timeout),
            Phase::Idle { since } => Some(since + limits.idle_timeout),
            Phase::Busy { .. } => None,
        }
    }

    /// Whether a request is in flight.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(*self.phase(), Phase::Busy { .. })
    }

    /// Bytes came in: on an idle connection they start the next head.
    fn read_some(&self) {
        let mut phase = self.phase();
        if let Phase::Idle { .. } = *phase {
            *phase = Phase::Head {
                since: Instant::now(),
            };
        }
    }

    /// A request reached its handler; the returned guard ends it when dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        let mut phase = self.phase();
        *phase = match *phase {
            Phase::Busy { in_flight } => Phase::Busy {
                in_flight: in_flight + 1,
            },
            Phase::Head { .. } | Phase::Idle { .. } => Phase::Busy { in_flight: 1 },
        };
        InFlight {
            activity: Arc::clone(self),
        }
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub(crate) struct InFlight {
    activity: Arc<Activity>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut phase = self.activity.phase();
        if let Phase::Busy { in_flight } = *phase {
            *phase = if in_flight > 1 {
                Phase::Busy {
                    in_flight: in_flight - 1,
                }
            } else {
                Phase::Idle {
                    since: Instant::now(),
                }
            };
        }
    }
}

/// A connection's stream that reports its reads to the connection's [`Activity`].
#[derive(Debug)]
pub(crate) struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub(crate) fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_deadline_follows_the_phase() {
        let limits = ServeLimits {
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            connections_max: 1,
        };
        let accepted = Instant::now();
        let activity = Activity::new(accepted);
        assert_eq!(
            activity.deadline(&limits),
            Some(accepted + limits.header_read_timeout)
        );
        let first = activity.begin();
        let second = activity.begin();
        assert_eq!(activity.deadline(&limits), None);
        drop(first);
        assert_eq!(activity.deadline(&limits), None, "one still in flight");
        drop(second);
        let idle = activity.deadline(&limits).unwrap();
        assert!(idle >= accepted + limits.idle_timeout);
        activity.read_some();
        let head = activity.deadline(&limits).unwrap();
        assert!(head < idle, "a started head gets the shorter bound");
        activity.read_some();
        assert_eq!(
            activity.deadline(&limits),
            Some(head),
            "from its first byte"
        );
    }
}
