//! Every flag of `twopc participant`, for both backends: the flag groups they share
//! (listening limits, TLS, tokens) and each backend's own, one floor below the backends that
//! read them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use protocol::ParticipantName;

/// Default of `--commit-group-delay-us`: longer than nearly every gap between a commit and the
/// next prepare at concurrency 1 on loopback (500 us let 4 to 9% of commits sync alone, and
/// p50 rose with them; 1 ms let under 1% go), short against a phase two.
pub const COMMIT_GROUP_DELAY_US_DEFAULT: u64 = 1_000;
/// Most `--commit-group-delay-us` accepted.
pub const COMMIT_GROUP_DELAY_US_MAX: u64 = 100_000;

/// PostgreSQL sessions for phase two by default: enough that a lone decision rarely waits for
/// another's round trip, few enough that decisions arriving together share them (one `COMMIT
/// PREPARED` per statement, several per round trip).
pub const POSTGRES_DECISION_CONNECTIONS_DEFAULT: usize = 4;

/// Past this a fill is a long write stalling the syncs behind it, for no gain.
pub const WAL_FILL_AHEAD_BYTES_MAX: u64 = 64 << 20;

/// Command-line arguments (every flag and default is in docs/operations.md).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// This participant's name (as the coordinator registers it), for logs.
    #[arg(long)]
    pub name: ParticipantName,
    /// Address to serve HTTP on, e.g. 127.0.0.1:7001.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Data directory: holds LOCK and the log (wal/). Created if absent. Required by the kv
    /// backend; the postgres backend keeps its state in PostgreSQL.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// What holds the data: the reference key-value store, or a PostgreSQL database.
    #[arg(long, value_enum, default_value_t = Backend::Kv)]
    pub backend: Backend,
    #[command(flatten)]
    pub postgres: PgArgs,
    /// Initial keys, applied only on the first start: the path of a file holding a JSON
    /// object of key to value, or that object itself (`'{"stock:sku-1": 100}'`; a value
    /// starting with `{` is taken as JSON).
    #[arg(long, value_name = "FILE|JSON")]
    pub seed: Option<String>,
    /// Coordinator base URL asked about in-doubt transactions (`http://127.0.0.1:7000`, or
    /// `https://` with --tls-ca); for a coordinator group, every coordinator's URL,
    /// comma-separated (the leader answers; the others are tried in turn).
    #[arg(long, value_name = "URL[,URL...]")]
    pub coordinator: Option<String>,
    /// A prepared transaction with no decision for this long asks the coordinator.
    #[arg(long, default_value_t = 5_000)]
    pub in_doubt_after_ms: u64,
    /// First wait between decision queries after `pending` or no answer (doubles each time).
    #[arg(long, default_value_t = 100)]
    pub decision_backoff_base_ms: u64,
    /// Cap on the wait between decision queries (plus up to half of it as jitter).
    #[arg(long, default_value_t = 10_000)]
    pub decision_backoff_max_ms: u64,
    /// Timeout of one decision query.
    #[arg(long, default_value_t = 2_000)]
    pub decision_timeout_ms: u64,
    /// Write a checkpoint after this many log records.
    #[arg(long, default_value_t = 10_000)]
    pub checkpoint_every_records: u64,
    /// How long decided transactions are remembered for duplicates and late messages.
    #[arg(long, default_value_t = 24 * 60 * 60 * 1000)]
    pub tombstone_retention_ms: u64,
    /// Most decided transactions remembered (the oldest go first).
    #[arg(long, default_value_t = 1_000_000)]
    pub tombstones_max: usize,
    /// Longest a commit or abort record waits (in microseconds) to share its fsync with the next
    /// prepare; it is durable before the ack either way. 0 fsyncs it at once: best for clients
    /// that wait for acknowledgements (`?wait=acked`) one transaction at a time.
    #[arg(long, default_value_t = COMMIT_GROUP_DELAY_US_DEFAULT)]
    pub commit_group_delay_us: u64,
    /// How far ahead of its appends a log segment is zero-filled, so that most fdatasyncs need
    /// not write the file's size; 0 for plain appends, which some storage syncs faster when
    /// transactions come one at a time (docs/operations.md).
    #[arg(long, value_name = "BYTES", default_value_t = wal::FILL_AHEAD_BYTES)]
    pub wal_fill_ahead_bytes: u64,
    /// Longest a prepare may queue for keys locked by older attempts before voting no
    /// (`lock_timeout`); the coordinator's `lock_wait_ms` can only shorten it. 0: never wait.
    #[arg(long, default_value_t = 2_000)]
    pub lock_wait_max_ms: u64,
    /// Most prepares queued for locks at once; past it a conflicting prepare votes no.
    #[arg(long, default_value_t = 4_096)]
    pub lock_waiters_max: usize,
    /// Most a coordinator's epoch may rise above the highest held here in one message; a
    /// bigger jump is refused 409 epoch_too_high (a forged epoch would fence the real
    /// coordinator out for ever). Off when peers authenticate (docs/security.md).
    #[arg(long, default_value_t = crate::epoch_bound::EPOCH_JUMP_MAX_DEFAULT)]
    pub epoch_jump_max: u64,
    /// Fence keys, one per line (the lease service's --fence-key-file): fencing tokens must
    /// then carry the lease service's proof (409 invalid_fence_proof without it), and no jump
    /// bound applies (docs/leases.md).
    #[arg(long, value_name = "FILE")]
    pub fence_key_file: Option<std::path::PathBuf>,
    /// Without --fence-key-file: most a fencing token may rise above every token accepted
    /// here; a bigger jump is refused 409 token_too_high (a typo must not fence a resource
    /// off for ever).
    #[arg(long, default_value_t = crate::fence::policy::FENCE_TOKEN_JUMP_MAX_DEFAULT)]
    pub fence_token_jump_max: u64,
    /// How long a fenced resource's highest token is kept after its last accepted write;
    /// then it joins the floor that every unlisted resource must reach.
    #[arg(long, default_value_t = 7 * 24 * 60 * 60 * 1000)]
    pub fence_retention_ms: u64,
    /// How long a fenced write's answer is kept for a repeat of its op_id; a repeat after
    /// that is a new write.
    #[arg(long, default_value_t = 24 * 60 * 60 * 1000)]
    pub op_answer_retention_ms: u64,
    /// Most fenced-write answers kept (the oldest go first).
    #[arg(long, default_value_t = 1_000_000)]
    pub op_answers_max: usize,
    /// How long delivered and abandoned outbox intents are kept (then dropped); pending and
    /// failed intents are kept whatever their age.
    #[arg(long, default_value_t = crate::outbox::table::OUTBOX_RETENTION_MS_DEFAULT)]
    pub outbox_retention_ms: u64,
    /// Never fsync the log. For benchmark baselines only: a yes vote is then no promise.
    #[arg(long)]
    pub unsafe_no_fsync: bool,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub serve: ServeArgs,
}

impl Args {
    /// `--fence-key-file` and `--fence-token-jump-max`, for both backends: a key file that does
    /// not read or check is a configuration error.
    pub fn fence_policy(&self) -> Result<crate::fence::FencePolicy, String> {
        let keys = match &self.fence_key_file {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--fence-key-file {}: {e}", path.display()))?;
                let keys =
                    protocol::fence_proof::FenceKeys::parse(&path.display().to_string(), &text)
                        .map_err(|e| format!("--fence-key-file refused: {e}"))?;
                Some(keys)
            }
        };
        Ok(crate::fence::FencePolicy {
            keys,
            jump_max: self.fence_token_jump_max,
        })
    }
}

/// Bounds on slow and idle clients and on open connections (docs/operations.md, "Slow and
/// idle clients"), for the kv and postgres backends alike.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Longest from accept (TLS handshake included) to a request's whole head, and from a
    /// head's first byte to its last; then the connection is closed.
    #[arg(long, value_name = "MS", default_value_t = net::serve_limits::defaults::HEADER_READ_TIMEOUT_MS)]
    pub header_read_timeout_ms: u64,
    /// A kept-alive connection with no request for this long is closed.
    #[arg(long, value_name = "MS", default_value_t = net::serve_limits::defaults::IDLE_TIMEOUT_MS)]
    pub idle_timeout_ms: u64,
    /// Most client connections open at once; past it new ones wait in the kernel's backlog.
    #[arg(long, value_name = "N", default_value_t = net::serve_limits::defaults::CONNECTIONS_MAX)]
    pub connections_max: usize,
}

/// The addresses of `--coordinator` (none without it): each comma-separated base URL without
/// its trailing `/`; an empty one or the same one twice is refused. `TlsArgs::coordinator`
/// checks each one's scheme.
pub fn coordinator_urls(flag: Option<&str>) -> Result<Vec<String>, String> {
    let Some(flag) = flag else {
        return Ok(Vec::new());
    };
    let mut urls: Vec<String> = Vec::new();
    for item in flag.split(',') {
        let url = item.trim().trim_end_matches('/');
        if url.is_empty() {
            return Err(format!("--coordinator {flag:?} has an empty address"));
        }
        if urls.iter().any(|u| u.eq_ignore_ascii_case(url)) {
            return Err(format!("--coordinator names {url:?} twice"));
        }
        urls.push(url.to_string());
    }
    Ok(urls)
}

impl ServeArgs {
    /// The listener's bounds, checked.
    pub fn limits(&self) -> Result<net::ServeLimits, String> {
        net::ServeLimits::from_flags(
            Some(self.header_read_timeout_ms),
            Some(self.idle_timeout_ms),
            Some(self.connections_max),
        )
        .map_err(|e| e.to_string())
    }
}

/// TLS files (docs/operations.md, "TLS"); read at start.
#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// Serve HTTPS only, with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate(s) of the CA that an https:// --coordinator's certificate must come
    /// from; nothing else is trusted.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The listener's TLS (none: plain HTTP): --tls-cert and --tls-key both or neither.
    pub fn server(&self) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
        net::server_config_from_flags(self.tls_cert.as_deref(), self.tls_key.as_deref())
            .map_err(|e| e.to_string())
    }

    /// The decision client's TLS, checked against each --coordinator URL: `http://` or
    /// `https://`, and `https://` only with --tls-ca.
    pub fn coordinator(
        &self,
        coordinators: &[String],
    ) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
        for url in coordinators {
            if url.starts_with("https://") {
                if self.tls_ca.is_none() {
                    return Err(format!(
                        "--coordinator {url:?} is https:// but no --tls-ca names the CA that \
                         signed its certificate"
                    ));
                }
            } else if !url.starts_with("http://") {
                return Err(format!(
                    "--coordinator {url:?} must start with http:// or https://"
                ));
            }
        }
        self.tls_ca
            .as_deref()
            .map(net::client_config)
            .transpose()
            .map_err(|e| e.to_string())
    }
}

/// Token files (docs/participants.md, "Authentication"); reread on SIGHUP.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// Peer tokens, one per line: taken on /2pc/* and /saga/* (all), sent on decision queries
    /// (the first).
    #[arg(long, value_name = "FILE")]
    pub peer_token_file: Option<PathBuf>,
    /// Clients' tokens, one `name token` per line: fenced writes and reads under /v1/kv.
    #[arg(long, value_name = "FILE")]
    pub client_token_file: Option<PathBuf>,
    /// Operators' tokens, one `name token` per line: /v1/prepared and /v1/attempts (with peers).
    #[arg(long, value_name = "FILE")]
    pub operator_token_file: Option<PathBuf>,
    /// Tokens that may read /metrics, one per line; without it /metrics is open.
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// Serve a non-loopback address with no token configured; warned about at every start.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

impl AuthArgs {
    pub fn files(&self) -> protocol::auth::TokenFiles {
        protocol::auth::TokenFiles {
            client: self.client_token_file.clone(),
            operator: self.operator_token_file.clone(),
            peer: self.peer_token_file.clone(),
            metrics: self.metrics_token_file.clone(),
        }
    }

    /// Reads the files and applies the start-up rule for `listen`.
    pub fn keys(&self, listen: SocketAddr) -> Result<protocol::auth::KeyRing, String> {
        let keys = crate::auth::load(&self.files())?;
        crate::auth::check_exposure(listen, &keys, self.insecure_no_auth)?;
        Ok(keys)
    }
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Kv,
    Postgres,
}

/// The flags only the postgres backend reads (every flag is in docs/operations.md).
#[derive(Debug, Clone, clap::Args)]
pub struct PgArgs {
    /// PostgreSQL connection string (`postgres://user:password@127.0.0.1:5432/db`); also read
    /// from TWOPC_PARTICIPANT_POSTGRES_URL so the password stays off the command line.
    #[arg(long, env = "TWOPC_PARTICIPANT_POSTGRES_URL")]
    pub postgres_url: Option<String>,
    /// JSON file of the named, parameterised statements a transaction may run.
    #[arg(long)]
    pub statements: Option<PathBuf>,
    /// Most PostgreSQL sessions open at once for prepares (each running prepare holds one).
    #[arg(long, default_value_t = 16)]
    pub postgres_connections: usize,
    /// PostgreSQL sessions kept apart for phase two (`COMMIT PREPARED`, `ROLLBACK PREPARED`),
    /// recovery and health reads, on top of --postgres-connections: prepares waiting on a row
    /// lock can never hold them all while the commit that frees the lock waits.
    #[arg(long, default_value_t = POSTGRES_DECISION_CONNECTIONS_DEFAULT)]
    pub postgres_decision_connections: usize,
}
