//! `twopc participant`: the reference KV participant as a process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use protocol::ParticipantName;

use crate::config::ParticipantConfig;
use crate::kv::{KvStore, routes};
use crate::service::Participant;

/// Default of `--commit-group-delay-us`: longer than nearly every gap between a commit and the
/// next prepare at concurrency 1 on loopback (500 us let 4 to 9% of commits sync alone, and
/// p50 rose with them; 1 ms let under 1% go), short against a phase two.
pub const COMMIT_GROUP_DELAY_US_DEFAULT: u64 = 1_000;
/// Most `--commit-group-delay-us` accepted.
pub const COMMIT_GROUP_DELAY_US_MAX: u64 = 100_000;

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
    pub postgres: crate::postgres::cli::PgArgs,
    /// Initial keys, applied only on the first start: the path of a file holding a JSON
    /// object of key to value, or that object itself (`'{"stock:sku-1": 100}'`; a value
    /// starting with `{` is taken as JSON).
    #[arg(long, value_name = "FILE|JSON")]
    pub seed: Option<String>,
    /// Coordinator base URL asked about in-doubt transactions (`http://127.0.0.1:7000`, or
    /// `https://` with --tls-ca).
    #[arg(long)]
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

    /// The decision client's TLS, checked against the --coordinator URL: `http://` or
    /// `https://`, and `https://` only with --tls-ca.
    pub fn coordinator(
        &self,
        coordinator: Option<&str>,
    ) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
        if let Some(url) = coordinator {
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

impl Args {
    fn config(&self) -> Result<ParticipantConfig, String> {
        let Some(data_dir) = &self.data_dir else {
            return Err("--data-dir is required with --backend kv".into());
        };
        if self.commit_group_delay_us > COMMIT_GROUP_DELAY_US_MAX {
            return Err(format!(
                "--commit-group-delay-us {} is over the limit of {COMMIT_GROUP_DELAY_US_MAX} \
                 (every acknowledgement would wait that long at low load)",
                self.commit_group_delay_us
            ));
        }
        if self.checkpoint_every_records == 0 {
            return Err("--checkpoint-every-records must be at least 1".into());
        }
        if self.decision_backoff_base_ms == 0
            || self.decision_backoff_max_ms < self.decision_backoff_base_ms
        {
            return Err(
                "--decision-backoff-base-ms must be at least 1 and at most --decision-backoff-max-ms"
                    .into(),
            );
        }
        let mut config = ParticipantConfig::new(data_dir);
        config.keys = self.auth.keys(self.listen)?;
        config.loopback_listen = self.listen.ip().is_loopback();
        config.coordinator_url = self.coordinator.clone();
        config.coordinator_tls = self.tls.coordinator(self.coordinator.as_deref())?;
        config.engine.in_doubt_after_ms = self.in_doubt_after_ms;
        config.engine.decision_backoff_base_ms = self.decision_backoff_base_ms;
        config.engine.decision_backoff_max_ms = self.decision_backoff_max_ms;
        config.engine.tombstone_retention_ms = self.tombstone_retention_ms;
        config.engine.tombstones_max = self.tombstones_max;
        config.engine.lock_wait_max_ms = self.lock_wait_max_ms;
        config.engine.lock_waiters_max = self.lock_waiters_max;
        config.engine.epoch_jump_max =
            crate::epoch_bound::in_force(self.epoch_jump_max, &config.keys);
        config.engine.fence = crate::fence::FencePolicy {
            keys: self
                .fence_key_file
                .as_deref()
                .map(load_fence_keys)
                .transpose()?,
            jump_max: self.fence_token_jump_max,
        };
        config.engine.fence_retention = crate::fence::table::FenceRetention {
            highest_ms: self.fence_retention_ms,
            answers_ms: self.op_answer_retention_ms,
            answers_max: self.op_answers_max,
        };
        config.decision_timeout_ms = self.decision_timeout_ms;
        config.checkpoint_every_records = self.checkpoint_every_records;
        config.wal.group_delay = std::time::Duration::from_micros(self.commit_group_delay_us);
        if self.unsafe_no_fsync {
            config.wal.sync = wal::SyncPolicy::Never;
        }
        // Scan for in-doubt transactions a few times per in-doubt period, at most every 100 ms.
        config.tick_ms = (self.in_doubt_after_ms / 4).clamp(10, 100);
        Ok(config)
    }
}

/// Reads a fence key file (`protocol::fence_proof`); a file that does not read or check is a
/// configuration error.
fn load_fence_keys(path: &std::path::Path) -> Result<protocol::fence_proof::FenceKeys, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--fence-key-file {}: {e}", path.display()))?;
    protocol::fence_proof::FenceKeys::parse(&path.display().to_string(), &text)
        .map_err(|e| format!("--fence-key-file refused: {e}"))
}

/// Runs the service; returns the process exit code (0 clean shutdown, 1 runtime failure,
/// 2 bad configuration, 3 data directory locked, 4 corrupt log).
pub fn main(args: Args) -> ExitCode {
    if args.backend == Backend::Postgres {
        return crate::postgres::cli::main(&args);
    }
    let config_and_tls = args
        .config()
        .and_then(|config| Ok((config, args.tls.server()?, args.serve.limits()?)));
    let (config, server_tls, limits) = match config_and_tls {
        Ok(parts) => parts,
        Err(message) => {
            tracing::error!("{message}");
            return ExitCode::from(2);
        }
    };
    let seed = match &args.seed {
        None => KvStore::new(),
        Some(value) => match seed_store(value) {
            Ok(store) => store,
            Err(error) => {
                tracing::error!(%error, "cannot use --seed");
                return ExitCode::from(2);
            }
        },
    };
    if args.unsafe_no_fsync {
        tracing::warn!("--unsafe-no-fsync: the log is never fsynced; votes are no promise");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let token_files = args.auth.files();
    runtime.block_on(serve(
        args.name,
        args.listen,
        config,
        seed,
        token_files,
        server_tls,
        limits,
    ))
}

/// The store `--seed` names: inline JSON when the value starts with `{` (a file path never
/// does in practice, and `./{x}` still reaches such a file), else a file's contents.
fn seed_store(value: &str) -> Result<KvStore, String> {
    let bytes = if value.trim_start().starts_with('{') {
        value.as_bytes().to_vec()
    } else {
        std::fs::read(value).map_err(|e| format!("seed file {value}: {e}"))?
    };
    KvStore::from_seed(&bytes).map_err(|e| e.to_string())
}

async fn serve(
    name: ParticipantName,
    listen: SocketAddr,
    config: ParticipantConfig,
    seed: KvStore,
    token_files: protocol::auth::TokenFiles,
    server_tls: Option<Arc<rustls::ServerConfig>>,
    limits: net::ServeLimits,
) -> ExitCode {
    let opened = tokio::task::spawn_blocking(move || Participant::open(config, move || seed)).await;
    let participant = match opened {
        Ok(Ok(participant)) => participant,
        Ok(Err(error)) => {
            tracing::error!(%error, "cannot start");
            return ExitCode::from(error.exit_code());
        }
        Err(error) => {
            tracing::error!(%error, "recovery panicked");
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%listen, %error, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    let resolver = participant.spawn_resolver();
    let reloader = tokio::spawn(crate::auth::reload_on_sighup(
        token_files,
        participant.config().keys.clone(),
    ));
    let scheme = if server_tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(%name, %listen, scheme, "participant ready");
    let watched = participant.clone();
    let served = net::serve_with_limits(
        listener,
        routes::app(&participant),
        server_tls,
        limits,
        async move {
            tokio::select! {
                () = shutdown_signal() => tracing::info!("shutting down on signal"),
                () = watched.failed() => tracing::error!("shutting down: the log failed"),
            }
        },
    )
    .await;
    resolver.abort();
    reloader.abort();
    let closing = participant.clone();
    let _ = tokio::task::spawn_blocking(move || closing.close()).await;
    if let Err(error) = served {
        tracing::error!(%error, "server failed");
        return ExitCode::FAILURE;
    }
    if participant.is_failed() {
        return ExitCode::FAILURE;
    }
    tracing::info!(%name, "stopped");
    ExitCode::SUCCESS
}

pub(crate) async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: Args,
    }

    fn config(extra: &[&str]) -> Result<ParticipantConfig, String> {
        let mut argv = vec![
            "participant",
            "--name",
            "inventory",
            "--listen",
            "127.0.0.1:7001",
            "--data-dir",
            "/tmp/x",
        ];
        argv.extend_from_slice(extra);
        Wrapper::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .args
            .config()
    }

    #[test]
    fn commit_group_delay_reaches_the_log_options_and_is_bounded() {
        let defaults = config(&[]).unwrap();
        assert_eq!(
            defaults.wal.group_delay,
            std::time::Duration::from_micros(COMMIT_GROUP_DELAY_US_DEFAULT)
        );
        let zero = config(&["--commit-group-delay-us", "0"]).unwrap();
        assert_eq!(zero.wal.group_delay, std::time::Duration::ZERO);
        let error = config(&["--commit-group-delay-us", "100001"]).unwrap_err();
        assert!(error.contains("--commit-group-delay-us 100001"), "{error}");
    }

    #[test]
    fn tls_flags_are_checked() {
        let error = config(&["--coordinator", "https://127.0.0.1:7100"]).unwrap_err();
        assert!(error.contains("--tls-ca"), "{error}");
        let error = config(&["--coordinator", "ftp://127.0.0.1:7100"]).unwrap_err();
        assert!(error.contains("http:// or https://"), "{error}");
        let error = config(&["--tls-ca", "/no/such/ca.pem"]).unwrap_err();
        assert!(error.contains("/no/such/ca.pem"), "{error}");
        for half in [["--tls-cert", "/c.pem"], ["--tls-key", "/k.pem"]] {
            let mut argv = vec!["participant", "--name", "a", "--listen", "127.0.0.1:1"];
            argv.extend_from_slice(&half);
            let args = Wrapper::try_parse_from(argv).unwrap().args;
            let error = args.tls.server().unwrap_err();
            assert!(error.contains("both or neither"), "{error}");
        }
        let dir = tempfile::tempdir().unwrap();
        let ca = net::test_certs::TestCa::new("test ca").unwrap();
        let ca_file = ca.write_cert(dir.path()).unwrap();
        let with_ca = config(&[
            "--coordinator",
            "https://127.0.0.1:7100",
            "--tls-ca",
            ca_file.to_str().unwrap(),
        ])
        .unwrap();
        assert!(with_ca.coordinator_tls.is_some());
    }

    #[test]
    fn seed_is_a_file_or_inline_json() {
        let inline = seed_store(r#" {"stock": 10}"#).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("seed.json");
        std::fs::write(&file, r#"{"stock": 10}"#).unwrap();
        let from_file = seed_store(file.to_str().unwrap()).unwrap();
        assert_eq!(inline, from_file, "the same store either way");
        assert_eq!(
            inline.get("stock").map(|e| e.value),
            Some(serde_json::json!(10))
        );
        let missing = seed_store("/no/such/seed.json").unwrap_err();
        assert!(missing.contains("/no/such/seed.json"), "{missing}");
        assert!(seed_store("{not json").is_err());
        assert!(
            seed_store("[1, 2]").is_err(),
            "not an object, and no such file"
        );
    }

    #[test]
    fn serve_limits_have_flags_and_are_checked() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["participant", "--name", "a", "--listen", "127.0.0.1:1"];
            argv.extend_from_slice(extra);
            Wrapper::try_parse_from(argv).unwrap().args.serve.limits()
        };
        assert_eq!(parse(&[]), Ok(net::ServeLimits::default()));
        let given = parse(&[
            "--header-read-timeout-ms",
            "500",
            "--idle-timeout-ms",
            "900",
            "--connections-max",
            "7",
        ])
        .unwrap();
        assert_eq!(
            given.header_read_timeout,
            std::time::Duration::from_millis(500)
        );
        assert_eq!(given.idle_timeout, std::time::Duration::from_millis(900));
        assert_eq!(given.connections_max, 7);
        let error = parse(&["--connections-max", "0"]).unwrap_err();
        assert!(error.contains("--connections-max"), "{error}");
    }

    #[test]
    fn no_fsync_is_only_ever_asked_for() {
        assert_eq!(config(&[]).unwrap().wal.sync, wal::SyncPolicy::Fsync);
        assert_eq!(
            config(&["--unsafe-no-fsync"]).unwrap().wal.sync,
            wal::SyncPolicy::Never
        );
    }
}
