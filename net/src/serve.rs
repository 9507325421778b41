//! Serves an axum router on a bound TCP listener, over TLS when given a server configuration,
//! under [`ServeLimits`], until a shutdown future resolves (then requests in flight finish).
//! Handlers can read the caller's address as `ConnectInfo<SocketAddr>` either way. Owns the
//! accept loop, the connection cap and each connection's task; nothing about routes.
//!
//! Every connection runs under deadlines (see [`crate::quiet_time`]): its first head within
//! `header_read_timeout` of accept (TLS handshake included), any later head within that of its
//! first byte, and no more than `idle_timeout` between requests. At `connections_max` the loop
//! stops accepting rather than accepting and closing: the kernel's backlog holds the newcomers
//! and no descriptor is spent on them, so descriptors the log needs stay free.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;
use tower::util::Oneshot;

use crate::quiet_time::{Activity, InFlight, Watched};
use crate::serve_limits::ServeLimits;
use crate::tls_listener::handshake;

/// How long the loop waits after an accept error that is not the peer's (out of descriptors):
/// long enough not to spin, short enough that a freed descriptor is soon used.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` (HTTPS with `tls`, else plain HTTP) until `shutdown`, under
/// the default [`ServeLimits`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with_limits(listener, router, tls, ServeLimits::default(), shutdown).await
}

/// As [`serve`], under `limits`. Returns once shutdown began and every connection ended;
/// dropping the future closes every connection at once.
pub async fn serve_with_limits(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<ServerConfig>>,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let places = Arc::new(Semaphore::new(limits.connections_max));
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    let mut connections = JoinSet::new();
    loop {
        let place = tokio::select! {
            place = Arc::clone(&places).acquire_owned() => match place {
                Ok(place) => place,
                // Never closed while the loop runs; nothing more to accept if it were.
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        // Ended connections' results are nobody's business; this keeps the set small.
        while connections.try_join_next().is_some() {}
        match accepted {
            Ok((stream, peer)) => {
                connections.spawn(connection(
                    stream,
                    peer,
                    tls.clone(),
                    router.clone(),
                    limits,
                    stopping.clone(),
                    place,
                ));
            }
            Err(error) => {
                drop(place);
                if !is_peers_fault(&error) {
                    tracing::error!(%error, backoff = ?ACCEPT_BACKOFF, "accept failed; waiting");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                        () = &mut shutdown => break,
                    }
                }
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Connection-level errors are the peer's business (it hung up before we took the
/// connection); anything else (out of descriptors) is logged and waited out.
fn is_peers_fault(error: &io::Error) -> bool {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// One connection from accept to close; `_place` is its place under the cap.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<ServerConfig>>,
    router: Router,
    limits: ServeLimits,
    mut stopping: watch::Receiver<bool>,
    _place: OwnedSemaphorePermit,
) {
    let accepted = Instant::now();
    // Answers are small and written whole; Nagle would hold some of them back for an ACK.
    let _ = stream.set_nodelay(true);
    let activity = Activity::new(accepted);
    match tls {
        None => serve_connection(stream, peer, router, &limits, activity, stopping).await,
        Some(config) => {
            let deadline = accepted + limits.header_read_timeout;
            let tls = tokio::select! {
                tls = handshake(config, stream, peer, deadline) => tls,
                _ = stopping.wait_for(|stop| *stop) => None,
            };
            if let Some(tls) = tls {
                serve_connection(tls, peer, router, &limits, activity, stopping).await;
            }
        }
    }
}

/// HTTP/1.1 on `stream` until the peer closes, a deadline passes, or shutdown: at shutdown a
/// connection with a request in flight finishes it and closes, any other closes at once.
async fn serve_connection<T>(
    stream: T,
    peer: SocketAddr,
    router: Router,
    limits: &ServeLimits,
    activity: Arc<Activity>,
    mut stopping: watch::Receiver<bool>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(Watched::new(stream, Arc::clone(&activity)));
    let service = Tracked {
        router,
        peer,
        activity: Arc::clone(&activity),
    };
    let mut builder = http1::Builder::new();
    // Ours instead (crate::quiet_time says why); hyper's would also need a timer.
    builder.header_read_timeout(None);
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut stop = pin!(stopping.wait_for(|stop| *stop));
    let mut draining = false;
    let mut timer = pin!(tokio::time::sleep_until(Instant::now()));
    poll_fn(|cx| {
        loop {
            if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                if let Err(error) = ended {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                }
                return Poll::Ready(());
            }
            if draining || stop.as_mut().poll(cx).is_pending() {
                break;
            }
            if !activity.is_busy() {
                return Poll::Ready(());
            }
            draining = true;
            // Hyper finishes the request in flight and then closes: poll it once more.
            conn.as_mut().graceful_shutdown();
        }
        // Reads and calls change the phase only inside `conn.poll`, so this is current.
        let Some(deadline) = activity.deadline(limits) else {
            return Poll::Pending;
        };
        // The timer may ring early, never late. Every request moves the deadline later (the
        // head's start, then the idle start); following each move would take the runtime's
        // timer lock twice per request. A later deadline waits until the timer rings and is
        // set then; only an earlier one resets it at once.
        if timer.deadline() > deadline {
            timer.as_mut().reset(deadline);
        }
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= deadline {
                tracing::debug!(%peer, "closing a connection quiet past its deadline");
                return Poll::Ready(());
            }
            timer.as_mut().reset(deadline);
        }
        Poll::Pending
    })
    .await;
}

/// The router as a connection's hyper service: each request carries the caller's address
/// and counts as in flight on the connection until its answer is ready.
#[derive(Debug, Clone)]
struct Tracked {
    router: Router,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(ConnectInfo(self.peer));
        let in_flight = self.activity.begin();
        Answer {
            answer: self.router.clone().oneshot(request),
            in_flight: Some(in_flight),
        }
    }
}

/// The router's answer to one request, which counts as in flight until the answer is ready
/// (or the connection drops it). A plain future rather than a boxed `async` block: no
/// allocation per request.
struct Answer {
    answer: Oneshot<Router, hyper::Request<Incoming>>,
    in_flight: Option<InFlight>,
}

impl Future for Answer {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = ready!(Pin::new(&mut self.answer).poll(cx));
        self.in_flight = None;
        Poll::Ready(answer)
    }
}
