//! The settings read from files at start whose content is secret (TLS keys, the fence key):
//! kept apart so that comparing or printing a configuration shows only the files' names.

use std::path::PathBuf;
use std::sync::Arc;

use super::error::ConfigError;

/// The fence key in force: the file as given and the keys read from it at start. Compared and
/// printed by file name only.
#[derive(Clone, Default)]
pub struct FenceKeySettings {
    pub file: Option<PathBuf>,
    pub keys: Option<protocol::fence_proof::FenceKeys>,
}

impl FenceKeySettings {
    pub fn load(file: Option<PathBuf>) -> Result<Self, ConfigError> {
        let Some(path) = file else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let keys = protocol::fence_proof::FenceKeys::parse(&path.display().to_string(), &text)?;
        Ok(Self {
            file: Some(path),
            keys: Some(keys),
        })
    }
}

impl PartialEq for FenceKeySettings {
    fn eq(&self, other: &Self) -> bool {
        self.file == other.file
    }
}

impl std::fmt::Debug for FenceKeySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceKeySettings")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// TLS in force (docs/operations.md, "TLS"): the files as given and what was read from them
/// at start. Compared and printed by file names only.
#[derive(Clone, Default)]
pub struct TlsSettings {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    /// From `cert` and `key`: the listener serves HTTPS only.
    pub server: Option<Arc<rustls::ServerConfig>>,
    /// From `ca`: the only CA `https://` participants' certificates may come from.
    pub client: Option<Arc<rustls::ClientConfig>>,
}

impl TlsSettings {
    /// Reads the files: `cert` and `key` both or neither.
    pub fn load(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Self, net::TlsError> {
        let server = net::server_config_from_flags(cert.as_deref(), key.as_deref())?;
        let client = ca.as_deref().map(net::client_config).transpose()?;
        Ok(Self {
            cert,
            key,
            ca,
            server,
            client,
        })
    }
}

impl PartialEq for TlsSettings {
    fn eq(&self, other: &Self) -> bool {
        (&self.cert, &self.key, &self.ca) == (&other.cert, &other.key, &other.ca)
    }
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}
