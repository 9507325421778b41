//! One TLS handshake on an outbound TCP stream, for clients built on hyper directly (the
//! coordinator's client to participants). Owns turning a URL's host into the name the server's
//! certificate must carry; must never skip certificate verification.

use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Why a TLS connection was not made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{host:?} is not a DNS name or IP address a certificate can name")]
    BadName { host: String },
    #[error("TLS handshake with {host} failed: {source}")]
    Handshake {
        host: String,
        source: std::io::Error,
    },
    #[error("TLS handshake with {host} took longer than {timeout:?}")]
    Timeout { host: String, timeout: Duration },
}

/// The host of `host:port`, `[v6]:port` or a bare host, as the server's certificate must name
/// it (brackets off an IPv6 address).
pub fn server_name(authority: &str) -> Result<ServerName<'static>, ConnectError> {
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') && port.parse::<u16>().is_ok() => host,
        _ => authority,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_string()).map_err(|_| ConnectError::BadName {
        host: host.to_string(),
    })
}

/// Runs the handshake on `stream` within `timeout`, verifying the certificate against
/// `config`'s roots and `name`.
pub async fn connect(
    stream: TcpStream,
    name: ServerName<'static>,
    config: Arc<ClientConfig>,
    timeout: Duration,
) -> Result<TlsStream<TcpStream>, ConnectError> {
    let host = name.to_str().into_owned();
    match tokio::time::timeout(timeout, TlsConnector::from(config).connect(name, stream)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(source)) => Err(ConnectError::Handshake { host, source }),
        Err(_) => Err(ConnectError::Timeout { host, timeout }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_host_without_port_or_brackets() {
        for (authority, expected) in [
            ("127.0.0.1:7001", "127.0.0.1"),
            ("localhost:7001", "localhost"),
            ("[::1]:7001", "::1"),
            ("inventory.internal", "inventory.internal"),
        ] {
            assert_eq!(server_name(authority).unwrap().to_str(), expected);
        }
        assert!(server_name("bad host:1").is_err());
    }
}
