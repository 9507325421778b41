//! The fault proxy: an HTTP/1.1 proxy between the coordinator and one participant (the
//! coordinator is given the proxy's URL as that participant's URL) that drops, withholds,
//! duplicates, delays and reorders messages, and partitions, as a [`ProxyHandle`] says at run time.
//!
//! What each fault means, exactly:
//! - drop request: never forwarded. The caller gets no answer: the proxy keeps the connection
//!   open, writes nothing, and closes it when the caller gives up (its timeout) or after
//!   `hold_ms_max`, whichever is first. So the caller sees a timeout, not a connection error.
//! - drop response: forwarded and applied upstream; the answer is withheld exactly as above.
//! - duplicate: forwarded twice in a row; the caller gets the first answer, the second is discarded.
//! - delay: held before forwarding (fixed, or drawn from a range by the seeded RNG).
//! - reorder: held until the next request on the same route has been forwarded and answered
//!   upstream, then forwarded; if none comes within the rule's hold time, forwarded alone.
//! - partition: until healed, every new request is dropped and every answer coming back is
//!   withheld; requests held for delay or reorder are dropped when their hold ends.
//! - upstream down (not a fault you switch on; the participant was killed): the caller's
//!   connection is closed at once without an answer, which is what a dead node looks like.
//!
//! Probabilistic rules (`percent`) draw from RNGs seeded by `ProxyOptions::seed`, one stream per
//! rule, so a seeded schedule replays when requests arrive in the same order.
//!
//! Owns: one loopback listener and the connections to it, and requests to its one upstream.
//! Must never: listen on or forward to anything but loopback (checked at start); queue without
//! bound (connections are capped, at most one request per route is held for reordering) or hold
//! anything longer than `hold_ms_max`; rewrite a request or an answer (only hop-by-hop headers).

mod connection;
mod counts;
mod handle;
mod http1;
mod schedule;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

pub use counts::FaultCounts;
pub use handle::ProxyHandle;
pub use schedule::{Fault, Plan, Route, Rule, RuleId, Schedule, Scope};

use connection::Context;

#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Seeds every probabilistic decision.
    pub seed: u64,
    /// Longest the proxy holds anything: a dropped exchange's open connection, a delay, a
    /// reorder hold.
    pub hold_ms_max: u64,
    /// An idle keep-alive connection is closed after this. Longer than reqwest's 90 s pool idle
    /// timeout, so the client normally closes first and never reuses a connection being closed.
    pub idle_ms_max: u64,
    /// Longest one upstream exchange may take before it counts as an upstream error.
    pub upstream_timeout_ms: u64,
    /// Most caller connections open at once; further callers wait in the listen backlog.
    pub connections_max: usize,
    /// Largest request body forwarded; larger ones are closed without an answer. Above the
    /// services' own limit so their 413 still shows through.
    pub body_bytes_max: usize,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            seed: 0,
            hold_ms_max: 30_000,
            idle_ms_max: 120_000,
            upstream_timeout_ms: 30_000,
            connections_max: 256,
            body_bytes_max: 4 * protocol::limits::BODY_BYTES_MAX,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("upstream {url:?} is not an http URL on a loopback address")]
    NotLoopback { url: String },
    #[error("binding the proxy on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    #[error("building the upstream client: {0}")]
    Client(#[source] reqwest::Error),
}

/// A running proxy. Dropping it stops it and closes every connection it holds.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    handle: ProxyHandle,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1:0` forwarding to `upstream_url` (e.g. `http://127.0.0.1:4001`).
    /// Must be called inside a tokio runtime, which then runs the proxy: from sync test code use
    /// a multi-thread runtime and `runtime.block_on(FaultProxy::start(..))`, and keep the
    /// runtime alive as long as the proxy (a current-thread runtime runs it only inside block_on).
    pub async fn start(
        upstream_url: &str,
        options: ProxyOptions,
    ) -> Result<FaultProxy, ProxyError> {
        let upstream = loopback_base(upstream_url)?;
        let client = reqwest::Client::builder()
            .no_proxy()
            // A fresh connection per forward: a participant killed and restarted on the same port
            // must not leave stale pooled connections that turn into spurious upstream errors.
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_millis(options.upstream_timeout_ms))
            .build()
            .map_err(ProxyError::Client)?;
        let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
            .await
            .map_err(ProxyError::Bind)?;
        let addr = listener.local_addr().map_err(ProxyError::Bind)?;
        let handle = ProxyHandle::new(options.seed);
        let ctx = Arc::new(Context {
            handle: handle.clone(),
            client,
            upstream,
            hold: Duration::from_millis(options.hold_ms_max),
            idle: Duration::from_millis(options.idle_ms_max),
            body_bytes_max: options.body_bytes_max,
        });
        let accept_task = tokio::spawn(accept_loop(listener, ctx, options.connections_max.max(1)));
        Ok(FaultProxy {
            addr,
            handle,
            accept_task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to give the coordinator in place of the participant's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection task.
        self.accept_task.abort();
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Context>, connections_max: usize) {
    let permits = Arc::new(Semaphore::new(connections_max));
    let mut connections = JoinSet::new();
    loop {
        // Reap finished connection tasks so the set stays as small as the open connections.
        while connections.try_join_next().is_some() {}
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            // Out of file descriptors or similar: back off instead of spinning.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        connections.spawn(async move {
            connection::serve(stream, ctx).await;
            drop(permit);
        });
    }
}

/// The upstream base URL without a trailing `/`, if it is plain http on loopback.
fn loopback_base(url: &str) -> Result<String, ProxyError> {
    let not_loopback = || ProxyError::NotLoopback {
        url: url.to_owned(),
    };
    let parsed = reqwest::Url::parse(url).map_err(|_| not_loopback())?;
    let host = parsed.host_str().ok_or_else(not_loopback)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if parsed.scheme() != "http" || !loopback {
        return Err(not_loopback());
    }
    Ok(url.trim_end_matches('/').to_owned())
}
