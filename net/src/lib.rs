//! TLS and the outbound-HTTP policy of every twopc process, and nothing about transactions.
//!
//! - [`tls_config`]: PEM files into rustls configurations (ring provider; a client trusts only
//!   the CA it is given, never the platform's roots).
//! - [`tls_listener`] and [`serve`]: serving an axum router over TLS (handshakes off the accept
//!   loop, bounded in time) or plain HTTP, with the caller's address and graceful shutdown.
//! - [`tls_connect`]: one TLS handshake on an outbound TCP stream (for hand-built clients).
//! - [`outbound`]: the policy of every outbound client: no redirects, answers capped in size,
//!   connect and total time bounded.
//! - `test_certs` and `test_servers` (feature `testing`): a private CA and server certificates
//!   made at test time, and misbehaving servers for the outbound policy's tests.

pub mod outbound;
pub mod serve;
#[cfg(feature = "testing")]
pub mod test_certs;
#[cfg(feature = "testing")]
pub mod test_servers;
pub mod tls_config;
pub mod tls_connect;
pub mod tls_listener;

/// The rustls in use, so that callers name its types without depending on it themselves.
pub use rustls;

pub use outbound::{AnswerError, Limits};
pub use serve::serve;
pub use tls_config::{TlsError, client_config, server_config, server_config_from_flags};
