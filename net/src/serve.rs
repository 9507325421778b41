//! Serves an axum router on a bound TCP listener, over TLS when given a server configuration,
//! until a shutdown future resolves (then in-flight requests finish). Handlers can read the
//! caller's address as `ConnectInfo<SocketAddr>` either way. Owns nothing about routes.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::serve::ListenerExt;
use rustls::ServerConfig;
use tokio::net::TcpListener;

use crate::tls_listener::TlsListener;

/// Serves `router` on `listener` (HTTPS with `tls`, else plain HTTP) until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let app = router.into_make_service_with_connect_info::<SocketAddr>();
    match tls {
        None => {
            // Answers are small and written whole; Nagle would hold some back for an ACK.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(config) => {
            // The no-op tap is what gives `ConnectInfo<SocketAddr>`: axum implements it for
            // any tapped listener whose address is a `SocketAddr` (a direct impl for our own
            // listener would break the orphan rule). Nodelay is set before the handshake.
            let listener = TlsListener::new(listener, config)?.tap_io(|_| {});
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}
