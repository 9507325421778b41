//! The coordinator's configuration: every field documented, every default in one place, and
//! `validate` for what the types cannot say. The CLI and the optional JSON config file both fill
//! a `Config`; flags override the file.
//!
//! The map, from the ground up: `error` (why a configuration is refused), `secrets` (the
//! settings read from files whose content is secret), this module (`Config`, its defaults and
//! its checks), and `sources` (the JSON file and the flags laid over it, made into a
//! `Config`).

mod error;
mod secrets;
mod sources;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use protocol::ParticipantName;
use protocol::auth::{KeyRing, TokenFiles};
use protocol::limits::{TIMEOUT_MS_MAX, TIMEOUT_MS_MIN};

pub use error::ConfigError;
pub use secrets::{FenceKeySettings, TlsSettings};
pub use sources::{FileConfig, parse_participant};

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
    pub const WAL_FILL_AHEAD_BYTES: u64 = wal::FILL_AHEAD_BYTES;
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
    /// How far ahead of its appends a log segment is zero-filled (`wal::PreallocatedStorage`);
    /// 0: plain appends, each growing the file.
    pub wal_fill_ahead_bytes: u64,
    /// Whether the log fsyncs. `false` only for benchmark baselines (`--unsafe-no-fsync`);
    /// never from the config file.
    pub fsync: bool,
    /// Batch prepares and decisions to participants that offer it (the runtime's batches);
    /// `--no-phase-batching` sends each as a message of its own.
    pub phase_batching: bool,
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
    /// `--ha etcd`: run as a node of a coordinator group (docs/ha.md); `None` runs alone.
    pub ha: Option<crate::ha::HaSettings>,
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
/// Past this a fill is a long write stalling the syncs behind it, for no gain.
const WAL_FILL_AHEAD_BYTES_MAX: u64 = 64 << 20;

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
            "wal_fill_ahead_bytes",
            self.wal_fill_ahead_bytes,
            0,
            WAL_FILL_AHEAD_BYTES_MAX,
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
            wal_fill_ahead_bytes: defaults::WAL_FILL_AHEAD_BYTES,
            fsync: true,
            phase_batching: true,
            decision_query_rate: defaults::DECISION_QUERY_RATE,
            decision_query_burst: defaults::DECISION_QUERY_BURST,
            token_files: TokenFiles::default(),
            keys: KeyRing::default(),
            insecure_no_auth: false,
            tls: TlsSettings::default(),
            serve_limits: net::ServeLimits::default(),
            fence_key: FenceKeySettings::default(),
            ha: None,
        }
    }
}

#[cfg(test)]
mod tests;
