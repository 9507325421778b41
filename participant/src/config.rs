//! The library's configuration: one place for every tunable and its default.

use std::path::PathBuf;

use wal::WalOptions;

use crate::engine::EngineConfig;

/// How a [`crate::Participant`] runs.
#[derive(Debug, Clone)]
pub struct ParticipantConfig {
    /// Holds `LOCK` (exclusive while the process runs) and the log in `wal/`.
    pub data_dir: PathBuf,
    /// Protocol tunables (in-doubt time, backoff, tombstone retention).
    pub engine: EngineConfig,
    /// Base URLs of the coordinator to ask about in-doubt transactions (`http://host:port`):
    /// one, or every coordinator of its group (the leader answers; the others are tried in
    /// turn). Empty: in-doubt transactions wait for the coordinator's own resend.
    pub coordinator_urls: Vec<String>,
    /// Timeout of one decision query.
    pub decision_timeout_ms: u64,
    /// How often the in-doubt scan runs.
    pub tick_ms: u64,
    /// A checkpoint is written after this many log records, so the log stays bounded.
    pub checkpoint_every_records: u64,
    /// Log options. `SyncPolicy::Never` is for benchmark baselines only.
    pub wal: WalOptions,
    /// How far ahead of its appends a log segment is zero-filled (`wal::PreallocatedStorage`);
    /// 0: plain appends. Used by [`crate::Participant::open`].
    pub wal_fill_ahead_bytes: u64,
    /// The tokens in force (none: authentication off): checked on the routes, and the peer
    /// token sent on decision queries. Reloaded on SIGHUP by `twopc participant`.
    pub keys: protocol::auth::KeyRing,
    /// The listener is a loopback address: without tokens, only loopback `Host` names are
    /// answered (DNS rebinding; docs/security.md). True unless told otherwise, the stricter
    /// choice.
    pub loopback_listen: bool,
    /// Whom an `https://` coordinator's certificate must come from (`--tls-ca`); `None`: an
    /// `https://` coordinator is never trusted.
    pub coordinator_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl ParticipantConfig {
    /// Defaults for everything but the data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            engine: EngineConfig::default(),
            coordinator_urls: Vec::new(),
            decision_timeout_ms: 2_000,
            tick_ms: 100,
            checkpoint_every_records: 10_000,
            wal: WalOptions::default(),
            wal_fill_ahead_bytes: wal::FILL_AHEAD_BYTES,
            keys: protocol::auth::KeyRing::default(),
            loopback_listen: true,
            coordinator_tls: None,
        }
    }
}
