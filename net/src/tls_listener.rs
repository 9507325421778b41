//! The TLS side of a listener: one server handshake on an accepted connection, bounded by a
//! deadline. It runs on the connection's own task ([`crate::serve`]), so a slow or silent peer
//! holds up nobody else, and it holds the connection's place under the connection cap, so a
//! flood of silent peers costs at most that many sockets, each until its deadline.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Shakes hands with `peer` until `deadline`; `None` (and a debug line) when it fails or
/// takes too long: a scanner or a client that does not trust us, worth no more.
pub(crate) async fn handshake(
    config: Arc<ServerConfig>,
    stream: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout_at(deadline, TlsAcceptor::from(config).accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}
