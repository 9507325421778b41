//! TLS, the outbound-HTTP policy and the `/metrics` exposition of every twopc process, and
//! nothing about transactions.
//!
//! - [`tls_config`]: PEM files into rustls configurations (ring provider; a client trusts only
//!   the CA it is given, never the platform's roots).
//! - [`serve`], [`serve_limits`] and `tls_listener`: serving an axum router over TLS or plain
//!   HTTP, with the caller's address and graceful shutdown, under bounds on slow and idle
//!   clients and on open connections (handshakes on each connection's task, bounded in time).
//! - [`tls_connect`]: one TLS handshake on an outbound TCP stream (for hand-built clients).
//! - [`outbound`]: the policy of every outbound client: no redirects, answers capped in size,
//!   connect and total time bounded.
//! - [`exposition`]: the `/metrics` text (the Prometheus text format, by `prometheus-client`)
//!   and the latency histogram every server shares.
//! - [`etcd`]: a client of etcd's v3 JSON gateway (leases, reads, puts, compare-and-swap
//!   transactions) that never sends a write twice unless doing so is harmless.
//! - `test_certs` and `test_servers` (feature `testing`): a private CA and server certificates
//!   made at test time, and misbehaving servers for the outbound policy's tests.

pub mod etcd;
pub mod exposition;
pub mod outbound;
mod quiet_time;
pub mod serve;
pub mod serve_limits;
#[cfg(feature = "testing")]
pub mod test_certs;
#[cfg(feature = "testing")]
pub mod test_servers;
pub mod tls_config;
pub mod tls_connect;
mod tls_listener;

/// The rustls in use, so that callers name its types without depending on it themselves.
pub use rustls;

pub use outbound::{AnswerError, Limits};
pub use serve::{serve, serve_with_limits};
pub use serve_limits::{ServeLimits, ServeLimitsError};
pub use tls_config::{TlsError, client_config, server_config, server_config_from_flags};
