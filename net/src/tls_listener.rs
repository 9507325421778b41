//! A listener that gives axum finished TLS connections. One task accepts TCP connections; each
//! handshake runs on a task of its own, bounded to [`HANDSHAKE_TIMEOUT`], and a finished
//! connection is passed on through a channel. Owns the handshake bound and the bound on
//! handshakes in flight; must never let one slow or silent peer hold up the accept loop.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a peer may take to finish its handshake; past it the connection is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most handshakes in flight at once. Past it the accept loop waits for one to end, so a flood
/// of silent connections costs at most this many sockets and tasks, each for at most
/// [`HANDSHAKE_TIMEOUT`].
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = 1024;

/// Finished connections waiting for axum to take them.
const READY_QUEUE: usize = 64;

type Ready = (TlsStream<TcpStream>, SocketAddr);

/// TCP in, TLS out. Dropping it stops accepting (handshakes in flight end within their bound).
#[derive(Debug)]
pub struct TlsListener {
    local_addr: SocketAddr,
    ready: mpsc::Receiver<Ready>,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `tcp` (the caller bound it). Must be called inside a tokio runtime.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> io::Result<Self> {
        Self::with_handshake_timeout(tcp, config, HANDSHAKE_TIMEOUT)
    }

    /// As [`TlsListener::new`] with another handshake bound (tests).
    pub fn with_handshake_timeout(
        tcp: TcpListener,
        config: Arc<ServerConfig>,
        handshake_timeout: Duration,
    ) -> io::Result<Self> {
        let local_addr = tcp.local_addr()?;
        let (sender, ready) = mpsc::channel(READY_QUEUE);
        let accepting = tokio::spawn(accept_loop(
            tcp,
            TlsAcceptor::from(config),
            handshake_timeout,
            sender,
        ));
        Ok(Self {
            local_addr,
            ready,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    ready: mpsc::Sender<Ready>,
) {
    let in_flight = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT_MAX));
    loop {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                handle_accept_error(error).await;
                continue;
            }
        };
        // Answers are small and written whole; Nagle would hold some of them back for an ACK.
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    // Fails only when the listener is gone: the connection is then dropped.
                    let _ = ready.send((tls, peer)).await;
                }
                // A scanner or a client that does not trust us: worth a debug line, no more.
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, ?handshake_timeout, "TLS handshake timed out"),
            }
        });
    }
}

/// As axum's own TCP listener: connection-level errors are the peer's business; anything else
/// (out of file descriptors) is logged and waited out.
async fn handle_accept_error(error: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accept failed; waiting 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended (only when aborted): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
