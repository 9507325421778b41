//! Why a configuration is refused: one error for every source (file, flags, the files they
//! name), so the CLI reports each the same way.

use std::path::PathBuf;

/// Why a configuration is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A coordinator group's flags (`--ha`, `--etcd`, `--node`, ...).
    #[error("{0}")]
    Ha(String),
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("--data-dir (or \"data_dir\" in the config file) is required")]
    NoDataDir,
    #[error("no participants configured: give --participant NAME=URL at least once")]
    NoParticipants,
    #[error("participant {spec:?}: expected NAME=URL")]
    ParticipantSyntax { spec: String },
    #[error("participant name {name:?}: {source}")]
    ParticipantName {
        name: String,
        source: protocol::IdError,
    },
    #[error(
        "participant {name}: URL {url:?} must look like http://host:port or https://host:port \
         (no path)"
    )]
    ParticipantUrl { name: String, url: String },
    #[error(
        "participant {name}: {url:?} is https:// but no --tls-ca names the CA that signed its \
         certificate"
    )]
    HttpsWithoutCa { name: String, url: String },
    #[error("TLS: {0}")]
    Tls(#[from] net::TlsError),
    #[error(transparent)]
    ServeLimits(#[from] net::ServeLimitsError),
    #[error("listen address {0:?} is not HOST:PORT")]
    Listen(String),
    #[error("token file refused: {0}")]
    Tokens(#[from] protocol::auth::TokenFileError),
    #[error("fence key file refused: {0}")]
    FenceKey(#[from] protocol::fence_proof::FenceKeyError),
    #[error("{field} is {value}; it must be between {min} and {max}")]
    OutOfRange {
        field: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
}
