//! How a PostgreSQL participant runs: one place for every tunable and its default.

/// Sessions for phase two by default (the flag's default, where its reasons are).
pub use crate::cli::args::POSTGRES_DECISION_CONNECTIONS_DEFAULT as DECISION_CONNECTIONS_DEFAULT;

/// Configuration of a [`super::PgParticipant`].
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// `postgres://user:password@host:port/database` (or the key/value form).
    pub url: String,
    /// This participant's name; its gids start with `twopc:<name>:` (one process per name and
    /// database: recovery takes every prepared transaction with that prefix as its own).
    pub name: String,
    /// Most PostgreSQL sessions open at once for prepares (each running prepare holds one).
    pub connections: usize,
    /// Most PostgreSQL sessions open at once for phase two, recovery and health reads, on top
    /// of `connections`: prepares waiting on row locks can never take these, so a `COMMIT
    /// PREPARED` (which frees such locks) always finds one. Decisions arriving while all are
    /// busy go out together on the next free one, several per round trip.
    pub decision_connections: usize,
    /// Base URLs of the coordinator (or of every coordinator of its group) asked about in-doubt
    /// transactions, as `ParticipantConfig::coordinator_urls`. Empty: they wait for the
    /// coordinator's resend.
    pub coordinator_urls: Vec<String>,
    /// A prepared transaction with no decision for this long is asked about.
    pub in_doubt_after_ms: u64,
    /// How often `pg_prepared_xacts` is scanned for in-doubt transactions.
    pub scan_every_ms: u64,
    /// Timeout of one decision query.
    pub decision_timeout_ms: u64,
    /// Cap on the wait between two decision queries about one transaction (it doubles).
    pub decision_backoff_max_ms: u64,
    /// Longest a prepare's statements wait for a row lock (PostgreSQL's `lock_timeout`) before
    /// voting no; the coordinator's `lock_wait_ms` can only shorten it.
    pub lock_wait_max_ms: u64,
    /// Most an epoch may rise above the highest recorded in one message
    /// (`crate::epoch_bound`); `None` when peers authenticate.
    pub epoch_jump_max: Option<u64>,
    /// The tokens in force (none: authentication off), as `ParticipantConfig::keys`.
    pub keys: protocol::auth::KeyRing,
    /// As `ParticipantConfig::loopback_listen`.
    pub loopback_listen: bool,
    /// As `ParticipantConfig::coordinator_tls`.
    pub coordinator_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// How long delivered and abandoned intents stay in the outbox (and op ids their answers)
    /// before they are dropped; pending and failed intents are never dropped.
    pub outbox_retention_ms: u64,
    /// How fenced local writes' tokens are judged before the highest-token rule (the lease
    /// service's proof with a fence key, else a bound on jumps), as the KV participant's.
    pub fence: crate::fence::FencePolicy,
}

impl PgConfig {
    /// Defaults for everything but the URL and the name.
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            name: name.into(),
            connections: 16,
            decision_connections: DECISION_CONNECTIONS_DEFAULT,
            coordinator_urls: Vec::new(),
            in_doubt_after_ms: 5_000,
            scan_every_ms: 1_000,
            decision_timeout_ms: 2_000,
            decision_backoff_max_ms: 10_000,
            lock_wait_max_ms: 2_000,
            epoch_jump_max: Some(crate::epoch_bound::EPOCH_JUMP_MAX_DEFAULT),
            keys: protocol::auth::KeyRing::default(),
            loopback_listen: true,
            coordinator_tls: None,
            outbox_retention_ms: crate::outbox::table::OUTBOX_RETENTION_MS_DEFAULT,
            fence: crate::fence::FencePolicy::default(),
        }
    }
}
