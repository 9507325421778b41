//! Where a configuration comes from: the optional JSON file, the flags laid over it, and the
//! step that applies the defaults, reads the files they name and checks the result.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use protocol::ParticipantName;
use protocol::auth::{KeyRing, TokenFiles};

use super::error::ConfigError;
use super::secrets::{FenceKeySettings, TlsSettings};
use super::{Config, defaults};

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
    pub wal_fill_ahead_bytes: Option<u64>,
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
            wal_fill_ahead_bytes,
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
            wal_fill_ahead_bytes: self
                .wal_fill_ahead_bytes
                .unwrap_or(defaults::WAL_FILL_AHEAD_BYTES),
            fsync: true,
            phase_batching: true,
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
            ha: None,
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
