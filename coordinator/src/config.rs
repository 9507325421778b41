//! The coordinator's configuration: every field documented, every default in one place, and
//! `validate` for what the types cannot say. The CLI and the optional JSON config file both fill
//! a `Config`; flags override the file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use protocol::ParticipantName;
use protocol::auth::{KeyRing, TokenFiles};
use protocol::limits::{TIMEOUT_MS_MAX, TIMEOUT_MS_MIN};

/// Defaults, documented in docs/operations.md.
pub mod defaults {
    pub const LISTEN: &str = "127.0.0.1:7100";
    pub const PREPARE_TIMEOUT_MS: u64 = 5_000;
    pub const DELIVERY_TIMEOUT_MS: u64 = 5_000;
    pub const RETRY_BASE_MS: u64 = 100;
    pub const RETRY_MAX_MS: u64 = 30_000;
    pub const CHECKPOINT_INTERVAL_MS: u64 = 10_000;
    /// 24 hours: how long a client may retry a request and get the recorded outcome.
    pub const RETENTION_MS: u64 = 24 * 60 * 60 * 1000;
    /// Most ended outcomes kept whatever the window: bounds memory (~1 KiB each) and the
    /// checkpoint snapshot (~300 bytes each).
    pub const RETAINED_MAX: usize = 100_000;
    /// Transactions in phase one per participant. A healthy participant on this machine
    /// (2 cores) holds a few hundred at full `twopc bench` load, so the bound only bites in an
    /// outage; each live transaction costs about 2 KiB here.
    pub const MAX_LIVE_PER_PARTICIPANT: u64 = 2_048;
    /// Unacknowledged decisions per participant: the work an outage leaves behind (each about
    /// 1 KiB, plus a retry timer).
    pub const MAX_PENDING_ACKS_PER_PARTICIPANT: u64 = 8_192;
    /// Requests waiting on one transaction (the first plus same-id retries).
    pub const MAX_WAITERS_PER_TRANSACTION: u64 = 16;
    /// `Retry-After` of a 503 `overloaded`.
    pub const OVERLOAD_RETRY_AFTER_MS: u64 = 1_000;
    /// 1 GiB of logical bytes in the outcome index (~400 bytes an outcome with two
    /// participants: about 2.5 million outcomes, a day at ~30 transactions a second).
    pub const RETAINED_DISK_MAX_BYTES: u64 = 1 << 30;
    /// Decision queries about attempts this coordinator has no record of, per caller address,
    /// when peers do not authenticate (docs/security.md): a participant that lost contact asks
    /// about each attempt it holds once per backoff, far below this.
    pub const DECISION_QUERY_RATE: u64 = 100;
    pub const DECISION_QUERY_BURST: u64 = 1_000;
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Holds `LOCK` and the log (`wal/`). Created if absent; its first use creates the
    /// coordinator's identity.
    pub data_dir: PathBuf,
    /// Participants by name; the base URL is `http://host:port` or `https://host:port` (no
    /// path; `https://` needs `tls.ca`).
    pub participants: BTreeMap<ParticipantName, String>,
    /// Prepare-phase timeout for requests that do not give `timeout_ms`.
    pub prepare_timeout_ms: u64,
    /// Timeout of one phase-two request (commit/abort) before it counts as failed and is retried.
    pub delivery_timeout_ms: u64,
    /// First phase-two retry delay; doubles per failure, with jitter.
    pub retry_base_ms: u64,
    /// Cap on the phase-two retry delay. Retries never stop.
    pub retry_max_ms: u64,
    /// How often live state is checkpointed so old log segments can be deleted.
    pub checkpoint_interval_ms: u64,
    /// How long ended transactions' outcomes are kept (idempotent retries, decision queries).
    pub retention_ms: u64,
    /// Most ended outcomes staged in memory before the outcome index holds them; beyond it
    /// new transactions get 503 until the archiver catches up.
    pub retained_max: usize,
    /// Admission control (docs/operations.md, "Admission control"): past any of these, new
    /// transactions naming that participant get 503 `overloaded` with `Retry-After`.
    pub max_live_per_participant: u64,
    pub max_pending_acks_per_participant: u64,
    /// Requests that may wait on one transaction; one more gets 503 `overloaded`.
    pub max_waiters_per_transaction: u64,
    pub overload_retry_after_ms: u64,
    /// Disk budget of the outcome index in logical bytes (keys and values stored); beyond it
    /// the oldest outcomes go first, even inside the retention window.
    pub retained_disk_max_bytes: u64,
    /// Whether the log fsyncs. `false` only for benchmark baselines (`--unsafe-no-fsync`);
    /// never from the config file.
    pub fsync: bool,
    /// Unknown-attempt decision queries answered per second per caller address, and at once
    /// (`query_limit`); beyond them 429 `rate_limited`.
    pub decision_query_rate: u64,
    pub decision_query_burst: u64,
    /// The token files (`--client-token-file` and the rest); reread on SIGHUP.
    pub token_files: TokenFiles,
    /// The tokens in force, read from `token_files` (empty: authentication off).
    pub keys: KeyRing,
    /// Serve a non-loopback address without tokens (`--insecure-no-auth`); never from the
    /// config file.
    pub insecure_no_auth: bool,
    /// `--tls-cert`, `--tls-key`, `--tls-ca` and what was read from them.
    pub tls: TlsSettings,
    /// Bounds on slow and idle clients and on open connections (docs/operations.md, "Slow
    /// and idle clients"): `--header-read-timeout-ms`, `--idle-timeout-ms`,
    /// `--connections-max`.
    pub serve_limits: net::ServeLimits,
    /// `--fence-key-file`: the key lease grants are signed with, so that participants holding
    /// it can verify tokens (docs/leases.md, "Tokens the resource can verify").
    pub fence_key: FenceKeySettings,
}

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

/// Why a configuration is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
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

/// The JSON config file: every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    #[serde(default)]
    pub participants: BTreeMap<String, String>,
    pub prepare_timeout_ms: Option<u64>,
    pub delivery_timeout_ms: Option<u64>,
    pub retry_base_ms: Option<u64>,
    pub retry_max_ms: Option<u64>,
    pub checkpoint_interval_ms: Option<u64>,
    pub retention_ms: Option<u64>,
    pub retained_max: Option<usize>,
    pub max_live_per_participant: Option<u64>,
    pub max_pending_acks_per_participant: Option<u64>,
    pub max_waiters_per_transaction: Option<u64>,
    pub overload_retry_after_ms: Option<u64>,
    pub retained_disk_max_bytes: Option<u64>,
    pub decision_query_rate: Option<u64>,
    pub decision_query_burst: Option<u64>,
    /// Token files (docs/security.md): paths only, the tokens stay in the files.
    pub client_token_file: Option<PathBuf>,
    pub operator_token_file: Option<PathBuf>,
    pub peer_token_file: Option<PathBuf>,
    pub metrics_token_file: Option<PathBuf>,
    /// TLS files (docs/operations.md, "TLS"): the server's certificate chain and key (both
    /// or neither), and the CA that participants' certificates must come from.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    /// Bounds on clients (docs/operations.md, "Slow and idle clients").
    pub header_read_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub connections_max: Option<usize>,
    /// The fence key file (docs/leases.md): lease grants carry a proof made with its first key.
    pub fence_key_file: Option<PathBuf>,
}

impl FileConfig {
    pub fn load(path: &std::path::Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Lays `over` (the flags) on top of this file: a flag that is set wins; participants
    /// given as flags replace or add to the file's by name.
    pub fn overlay(mut self, over: FileConfig) -> FileConfig {
        macro_rules! take {
            ($($field:ident),*) => { $( if over.$field.is_some() { self.$field = over.$field; } )* };
        }
        take!(
            listen,
            data_dir,
            prepare_timeout_ms,
            delivery_timeout_ms,
            retry_base_ms,
            retry_max_ms,
            checkpoint_interval_ms,
            retention_ms,
            retained_max,
            max_live_per_participant,
            max_pending_acks_per_participant,
            max_waiters_per_transaction,
            overload_retry_after_ms,
            retained_disk_max_bytes,
            decision_query_rate,
            decision_query_burst,
            client_token_file,
            operator_token_file,
            peer_token_file,
            metrics_token_file,
            tls_cert,
            tls_key,
            tls_ca,
            header_read_timeout_ms,
            idle_timeout_ms,
            connections_max,
            fence_key_file
        );
        self.participants.extend(over.participants);
        self
    }

    /// Applies defaults and checks everything.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let listen_text = self.listen.unwrap_or_else(|| defaults::LISTEN.to_string());
        let listen = listen_text
            .parse()
            .map_err(|_| ConfigError::Listen(listen_text.clone()))?;
        let data_dir = self.data_dir.ok_or(ConfigError::NoDataDir)?;
        let mut participants = BTreeMap::new();
        for (name, url) in self.participants {
            let parsed = ParticipantName::new(name.clone())
                .map_err(|source| ConfigError::ParticipantName { name, source })?;
            let url = check_url(&parsed, &url)?;
            participants.insert(parsed, url);
        }
        if participants.is_empty() {
            return Err(ConfigError::NoParticipants);
        }
        if self.tls_ca.is_none()
            && let Some((name, url)) = participants.iter().find(|(_, u)| u.starts_with("https://"))
        {
            return Err(ConfigError::HttpsWithoutCa {
                name: name.to_string(),
                url: url.clone(),
            });
        }
        let tls = TlsSettings::load(self.tls_cert, self.tls_key, self.tls_ca)?;
        let serve_limits = net::ServeLimits::from_flags(
            self.header_read_timeout_ms,
            self.idle_timeout_ms,
            self.connections_max,
        )?;
        let token_files = TokenFiles {
            client: self.client_token_file,
            operator: self.operator_token_file,
            peer: self.peer_token_file,
            metrics: self.metrics_token_file,
        };
        let keys = KeyRing::new(token_files.load(|path| std::fs::read_to_string(path))?);
        let fence_key = FenceKeySettings::load(self.fence_key_file)?;
        let config = Config {
            listen,
            data_dir,
            participants,
            prepare_timeout_ms: self
                .prepare_timeout_ms
                .unwrap_or(defaults::PREPARE_TIMEOUT_MS),
            delivery_timeout_ms: self
                .delivery_timeout_ms
                .unwrap_or(defaults::DELIVERY_TIMEOUT_MS),
            retry_base_ms: self.retry_base_ms.unwrap_or(defaults::RETRY_BASE_MS),
            retry_max_ms: self.retry_max_ms.unwrap_or(defaults::RETRY_MAX_MS),
            checkpoint_interval_ms: self
                .checkpoint_interval_ms
                .unwrap_or(defaults::CHECKPOINT_INTERVAL_MS),
            retention_ms: self.retention_ms.unwrap_or(defaults::RETENTION_MS),
            retained_max: self.retained_max.unwrap_or(defaults::RETAINED_MAX),
            max_live_per_participant: self
                .max_live_per_participant
                .unwrap_or(defaults::MAX_LIVE_PER_PARTICIPANT),
            max_pending_acks_per_participant: self
                .max_pending_acks_per_participant
                .unwrap_or(defaults::MAX_PENDING_ACKS_PER_PARTICIPANT),
            max_waiters_per_transaction: self
                .max_waiters_per_transaction
                .unwrap_or(defaults::MAX_WAITERS_PER_TRANSACTION),
            overload_retry_after_ms: self
                .overload_retry_after_ms
                .unwrap_or(defaults::OVERLOAD_RETRY_AFTER_MS),
            retained_disk_max_bytes: self
                .retained_disk_max_bytes
                .unwrap_or(defaults::RETAINED_DISK_MAX_BYTES),
            fsync: true,
            decision_query_rate: self
                .decision_query_rate
                .unwrap_or(defaults::DECISION_QUERY_RATE),
            decision_query_burst: self
                .decision_query_burst
                .unwrap_or(defaults::DECISION_QUERY_BURST),
            token_files,
            keys,
            insecure_no_auth: false,
            tls,
            serve_limits,
            fence_key,
        };
        config.validate()?;
        Ok(config)
    }
}

/// Parses `NAME=URL`.
pub fn parse_participant(spec: &str) -> Result<(String, String), ConfigError> {
    match spec.split_once('=') {
        Some((name, url)) if !name.is_empty() && !url.is_empty() => {
            Ok((name.to_string(), url.to_string()))
        }
        _ => Err(ConfigError::ParticipantSyntax {
            spec: spec.to_string(),
        }),
    }
}

fn check_url(name: &ParticipantName, url: &str) -> Result<String, ConfigError> {
    let bad = || ConfigError::ParticipantUrl {
        name: name.to_string(),
        url: url.to_string(),
    };
    let trimmed = url.trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .ok_or_else(bad)?;
    let ok = !rest.is_empty()
        && !rest.contains(['/', '?', '#', '@', ' '])
        && rest.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)
        });
    if ok {
        Ok(trimmed.to_string())
    } else {
        Err(bad())
    }
}

fn range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            field,
            value,
            min,
            max,
        })
    }
}

const DAY_MS: u64 = 24 * 60 * 60 * 1000;
/// Above this a snapshot could outgrow the WAL's snapshot limit (1 GiB).
const RETAINED_MAX_LIMIT: u64 = 2_000_000;

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        range(
            "prepare_timeout_ms",
            self.prepare_timeout_ms,
            TIMEOUT_MS_MIN,
            TIMEOUT_MS_MAX,
        )?;
        range("delivery_timeout_ms", self.delivery_timeout_ms, 1, 600_000)?;
        range("retry_base_ms", self.retry_base_ms, 1, 600_000)?;
        range(
            "retry_max_ms",
            self.retry_max_ms,
            self.retry_base_ms,
            3_600_000,
        )?;
        range(
            "checkpoint_interval_ms",
            self.checkpoint_interval_ms,
            10,
            DAY_MS,
        )?;
        range("retention_ms", self.retention_ms, 0, 365 * DAY_MS)?;
        range(
            "retained_max",
            self.retained_max as u64,
            // 0 would refuse every new transaction (nothing could be staged).
            1,
            RETAINED_MAX_LIMIT,
        )?;
        range(
            "max_live_per_participant",
            self.max_live_per_participant,
            1,
            1_000_000,
        )?;
        range(
            "max_pending_acks_per_participant",
            self.max_pending_acks_per_participant,
            1,
            10_000_000,
        )?;
        range(
            "max_waiters_per_transaction",
            self.max_waiters_per_transaction,
            1,
            10_000,
        )?;
        range(
            "overload_retry_after_ms",
            self.overload_retry_after_ms,
            1,
            3_600_000,
        )?;
        range(
            "retained_disk_max_bytes",
            self.retained_disk_max_bytes,
            0,
            1 << 50,
        )?;
        range(
            "decision_query_rate",
            self.decision_query_rate,
            1,
            1_000_000,
        )?;
        range(
            "decision_query_burst",
            self.decision_query_burst,
            1,
            10_000_000,
        )?;
        Ok(())
    }

    /// The budget of unknown-attempt decision queries per caller.
    pub fn decision_query_limit(&self) -> crate::query_limit::QueryLimit {
        crate::query_limit::QueryLimit {
            per_second: self.decision_query_rate as f64,
            burst: self.decision_query_burst as f64,
            ..crate::query_limit::QueryLimit::default()
        }
    }

    /// The engine's admission bounds.
    pub fn bounds(&self) -> crate::engine::Bounds {
        crate::engine::Bounds {
            live_per_participant: self.max_live_per_participant,
            pending_acks_per_participant: self.max_pending_acks_per_participant,
            waiters_per_transaction: usize::try_from(self.max_waiters_per_transaction)
                .unwrap_or(usize::MAX),
        }
    }

    /// A configuration for tests and benchmarks: defaults, given participants and directory.
    pub fn for_tests(data_dir: PathBuf, participants: BTreeMap<ParticipantName, String>) -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir,
            participants,
            prepare_timeout_ms: defaults::PREPARE_TIMEOUT_MS,
            delivery_timeout_ms: defaults::DELIVERY_TIMEOUT_MS,
            retry_base_ms: defaults::RETRY_BASE_MS,
            retry_max_ms: defaults::RETRY_MAX_MS,
            checkpoint_interval_ms: defaults::CHECKPOINT_INTERVAL_MS,
            retention_ms: defaults::RETENTION_MS,
            retained_max: defaults::RETAINED_MAX,
            max_live_per_participant: defaults::MAX_LIVE_PER_PARTICIPANT,
            max_pending_acks_per_participant: defaults::MAX_PENDING_ACKS_PER_PARTICIPANT,
            max_waiters_per_transaction: defaults::MAX_WAITERS_PER_TRANSACTION,
            overload_retry_after_ms: defaults::OVERLOAD_RETRY_AFTER_MS,
            retained_disk_max_bytes: defaults::RETAINED_DISK_MAX_BYTES,
            fsync: true,
            decision_query_rate: defaults::DECISION_QUERY_RATE,
            decision_query_burst: defaults::DECISION_QUERY_BURST,
            token_files: TokenFiles::default(),
            keys: KeyRing::default(),
            insecure_no_auth: false,
            tls: TlsSettings::default(),
            serve_limits: net::ServeLimits::default(),
            fence_key: FenceKeySettings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> FileConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_fill_what_is_missing() {
        let config = file(r#"{"data_dir": "/tmp/x", "participants": {"a": "http://127.0.0.1:9"}}"#)
            .into_config()
            .unwrap();
        assert_eq!(config.listen.to_string(), defaults::LISTEN);
        assert_eq!(config.prepare_timeout_ms, defaults::PREPARE_TIMEOUT_MS);
        assert_eq!(config.retention_ms, defaults::RETENTION_MS);
        assert!(config.fsync);
    }

    #[test]
    fn flags_override_the_file() {
        let base = file(
            r#"{"data_dir": "/a", "prepare_timeout_ms": 10, "participants": {"a": "http://h:1", "b": "http://h:2"}}"#,
        );
        let flags = FileConfig {
            data_dir: Some("/b".into()),
            participants: [("b".to_string(), "http://h:3".to_string())].into(),
            ..FileConfig::default()
        };
        let config = base.overlay(flags).into_config().unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/b"));
        assert_eq!(config.prepare_timeout_ms, 10);
        let b = ParticipantName::new("b").unwrap();
        assert_eq!(config.participants[&b], "http://h:3");
        assert_eq!(config.participants.len(), 2);
    }

    #[test]
    fn bad_configs_are_refused_with_reason() {
        let cases = [
            (r#"{"participants": {"a": "http://h:1"}}"#, "data-dir"),
            (r#"{"data_dir": "/x"}"#, "no participants"),
            (
                r#"{"data_dir": "/x", "participants": {"a b": "http://h:1"}}"#,
                "participant name",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "https://h:1"}}"#,
                "--tls-ca",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "ftp://h:1"}}"#,
                "http://host:port",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "tls_cert": "/c.pem"}"#,
                "both or neither",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "tls_key": "/k.pem"}"#,
                "both or neither",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "https://h:1"}, "tls_ca": "/no/ca.pem"}"#,
                "/no/ca.pem",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h:1/path"}}"#,
                "http://host:port",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h"}}"#,
                "http://host:port",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "prepare_timeout_ms": 0}"#,
                "prepare_timeout_ms",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "retry_base_ms": 500, "retry_max_ms": 100}"#,
                "retry_max_ms",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "listen": "nope"}"#,
                "listen",
            ),
            (
                r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "connections_max": 0}"#,
                "--connections-max",
            ),
        ];
        for (json, needle) in cases {
            let err = file(json).into_config().unwrap_err().to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
        assert!(serde_json::from_str::<FileConfig>(r#"{"bogus": 1}"#).is_err());
        assert!(parse_participant("noequals").is_err());
        assert_eq!(
            parse_participant("a=http://h:1").unwrap(),
            ("a".to_string(), "http://h:1".to_string())
        );
    }

    #[test]
    fn trailing_slash_is_trimmed() {
        let config = file(r#"{"data_dir": "/x", "participants": {"a": "http://h:1/"}}"#)
            .into_config()
            .unwrap();
        assert_eq!(config.participants.values().next().unwrap(), "http://h:1");
    }
}
