//! Reads PEM files into rustls configurations: a server's certificate chain and private key, a
//! client's trusted CA certificates. Owns the crypto provider (ring), the protocol versions and
//! ALPN (HTTP/1.1 only: both servers speak HTTP/1.1). Must never trust the platform's root
//! certificates, and never put key material in an error or a log line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The only application protocol offered and accepted.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Why a TLS file could not be used. Names the file and what was wrong, never its contents.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path} is not usable PEM: {detail}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{what} {path} holds no certificate")]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("--tls-cert and --tls-key go together: give both or neither")]
    Unpaired,
    #[error("{what} {path} refused by TLS: {source}")]
    Refused {
        what: &'static str,
        path: PathBuf,
        source: rustls::Error,
    },
}

/// The one crypto provider twopc uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM text, in order; at least one.
fn certificates(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certificates)
}

/// A server configuration from a PEM certificate chain (leaf first) and its PEM private key
/// (PKCS#8, PKCS#1 or SEC1), checked to belong together.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_from_pem(
        cert,
        &read("certificate file", cert)?,
        key,
        &read("key file", key)?,
    )
}

/// The server configuration of `--tls-cert` and `--tls-key`: none when neither is given, an
/// error when only one is.
pub fn server_config_from_flags(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<Arc<ServerConfig>>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => server_config(cert, key).map(Some),
        (None, None) => Ok(None),
        _ => Err(TlsError::Unpaired),
    }
}

/// As [`server_config`], from PEM texts already read (`cert`, `key` name where they came from).
pub fn server_config_from_pem(
    cert: &Path,
    cert_pem: &[u8],
    key: &Path,
    key_pem: &[u8],
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates("certificate file", cert, cert_pem)?;
    let private_key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        what: "key file",
        path: key.to_path_buf(),
        // The error names the PEM problem (no key found, bad base64), never key bytes.
        detail: e.to_string(),
    })?;
    let refused = |source| TlsError::Refused {
        what: "certificate and key",
        path: cert.to_path_buf(),
        source,
    };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(refused)?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(refused)?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration that trusts exactly the CA certificates in the PEM file `ca`.
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    client_config_from_pem(ca, &read("CA file", ca)?)
}

/// As [`client_config`], from a PEM text already read (`ca` names where it came from).
pub fn client_config_from_pem(ca: &Path, ca_pem: &[u8]) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates("CA file", ca, ca_pem)? {
        roots.add(certificate).map_err(|source| TlsError::Refused {
            what: "CA file",
            path: ca.to_path_buf(),
            source,
        })?;
    }
    client_config_with_roots(roots).map_err(|source| TlsError::Refused {
        what: "CA file",
        path: ca.to_path_buf(),
        source,
    })
}

/// A client configuration that trusts nobody: every `https://` call fails its handshake.
/// What a client uses when no CA was given, so that it never falls back to other roots.
pub fn client_config_trusting_nobody() -> Result<Arc<ClientConfig>, rustls::Error> {
    client_config_with_roots(RootCertStore::empty())
}

fn client_config_with_roots(roots: RootCertStore) -> Result<Arc<ClientConfig>, rustls::Error> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}
