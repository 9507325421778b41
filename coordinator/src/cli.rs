//! `twopc coordinator`: flags (which override the optional JSON config file), the tokio
//! runtime, and the exit code. Defaults and exit codes are documented in docs/operations.md.

use std::path::PathBuf;
use std::process::ExitCode;

use tracing::error;

use crate::config::{ConfigError, FileConfig, parse_participant};
use crate::server;

/// Run a coordinator: the HTTP transaction API, two-phase commit and recovery.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on [default: 127.0.0.1:7100].
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Data directory (lock file and write-ahead log); created if absent.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// A participant by name and base URL; repeat for each.
    #[arg(long = "participant", value_name = "NAME=URL")]
    pub participants: Vec<String>,
    /// JSON config file with the same settings (snake_case keys); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Prepare-phase timeout when a request does not give one [default: 5000].
    #[arg(long, value_name = "MS")]
    pub prepare_timeout_ms: Option<u64>,
    /// Timeout of one commit/abort delivery before it is retried [default: 5000].
    #[arg(long, value_name = "MS")]
    pub delivery_timeout_ms: Option<u64>,
    /// First phase-two retry delay; doubles per failure, with jitter [default: 100].
    #[arg(long, value_name = "MS")]
    pub retry_base_ms: Option<u64>,
    /// Cap on the phase-two retry delay; retries never stop [default: 30000].
    #[arg(long, value_name = "MS")]
    pub retry_max_ms: Option<u64>,
    /// How often the log is checkpointed [default: 10000].
    #[arg(long, value_name = "MS")]
    pub checkpoint_interval_ms: Option<u64>,
    /// How long ended transactions' outcomes are kept for retries [default: 86400000 = 24 h].
    #[arg(long, value_name = "MS")]
    pub retention_ms: Option<u64>,
    /// Most ended outcomes staged in memory before the outcome index holds them; beyond it
    /// new transactions get 503 until the archiver catches up [default: 100000].
    #[arg(long, value_name = "N")]
    pub retained_max: Option<usize>,
    /// Admission control: most transactions in phase one per participant; past it new ones
    /// naming that participant get 503 overloaded [default: 2048].
    #[arg(long, value_name = "N")]
    pub max_live_per_participant: Option<u64>,
    /// Admission control: most unacknowledged decisions per participant; past it new
    /// transactions naming that participant get 503 overloaded [default: 8192].
    #[arg(long, value_name = "N")]
    pub max_pending_acks_per_participant: Option<u64>,
    /// Most requests waiting on one transaction (the first plus same-id retries) [default: 16].
    #[arg(long, value_name = "N")]
    pub max_waiters_per_transaction: Option<u64>,
    /// Retry-After of a 503 overloaded, rounded up to whole seconds [default: 1000].
    #[arg(long, value_name = "MS")]
    pub overload_retry_after_ms: Option<u64>,
    /// Disk budget of the outcome index (<data-dir>/outcomes.redb) in logical bytes; the
    /// oldest outcomes go first beyond it [default: 1073741824 = 1 GiB].
    #[arg(long, value_name = "BYTES")]
    pub retained_disk_max_bytes: Option<u64>,
    /// How far ahead of its appends a log segment is zero-filled, so that most fdatasyncs
    /// need not write the file's size; 0 for plain appends, which some storage syncs faster
    /// when transactions come one at a time (docs/operations.md) [default: 262144].
    #[arg(long, value_name = "BYTES")]
    pub wal_fill_ahead_bytes: Option<u64>,
    /// Decision queries about attempts this coordinator has no record of, answered per
    /// second per caller address when peers do not authenticate; beyond them 429
    /// rate_limited [default: 100].
    #[arg(long, value_name = "N")]
    pub decision_query_rate: Option<u64>,
    /// How many such queries a caller may make at once before the rate applies
    /// [default: 1000].
    #[arg(long, value_name = "N")]
    pub decision_query_burst: Option<u64>,
    /// Never fsync the log. Decisions are then no promise: for benchmark baselines only.
    #[arg(long)]
    pub unsafe_no_fsync: bool,
    /// Send every prepare and decision as a message of its own, even to participants that offer
    /// batched phase messages (`GET /2pc/capabilities`; docs/participants.md). For comparison
    /// and for debugging; batching changes no outcome.
    #[arg(long)]
    pub no_phase_batching: bool,
    /// Clients' tokens, one `name token` per line: transactions, sagas and leases.
    #[arg(long, value_name = "FILE")]
    pub client_token_file: Option<PathBuf>,
    /// Operators' tokens, one `name token` per line: operator actions, /ui (and client routes).
    #[arg(long, value_name = "FILE")]
    pub operator_token_file: Option<PathBuf>,
    /// Peer tokens, one per line: sent to participants (the first) and taken on /decision (all).
    #[arg(long, value_name = "FILE")]
    pub peer_token_file: Option<PathBuf>,
    /// Tokens that may read /metrics, one per line; without it /metrics is open.
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// Fence keys, one per line (at least 32 characters; the first signs): every lease grant
    /// carries a proof that participants holding the key verify (docs/leases.md).
    #[arg(long, value_name = "FILE")]
    pub fence_key_file: Option<PathBuf>,
    /// Serve a non-loopback address with no token configured (anyone who reaches it may
    /// submit, commit and abort); warned about at every start.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Serve HTTPS only, with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate(s) of the CA that https:// participants' certificates must come from;
    /// nothing else is trusted.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Longest from accept (TLS handshake included) to a request's whole head, and from a
    /// head's first byte to its last; then the connection is closed [default: 10000].
    #[arg(long, value_name = "MS")]
    pub header_read_timeout_ms: Option<u64>,
    /// A kept-alive connection with no request for this long is closed [default: 120000].
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// Most client connections open at once; past it new ones wait in the kernel's backlog
    /// [default: 512].
    #[arg(long, value_name = "N")]
    pub connections_max: Option<usize>,
    /// Run as a node of a coordinator group elected through etcd (the only kind: `etcd`);
    /// needs --etcd and --node (docs/ha.md).
    #[arg(long, value_name = "KIND", value_parser = ["etcd"])]
    pub ha: Option<String>,
    /// etcd client URLs, comma-separated (http://host:2379,...), tried in turn.
    #[arg(long, value_name = "URL[,URL...]", requires = "ha")]
    pub etcd: Option<String>,
    /// This node's name in the group, unique within it.
    #[arg(long, value_name = "NAME", requires = "ha")]
    pub node: Option<String>,
    /// The base URL the group's other nodes and clients reach this node at
    /// [default: http://<--listen>].
    #[arg(long, value_name = "URL", requires = "ha")]
    pub advertise: Option<String>,
    /// The group's key prefix in etcd; one group per prefix [default: /twopc/group].
    #[arg(long, value_name = "PREFIX", requires = "ha")]
    pub ha_prefix: Option<String>,
    /// The leader's etcd lease; failover takes about this long [default: 3000].
    #[arg(long, value_name = "MS", requires = "ha")]
    pub ha_lease_ttl_ms: Option<u64>,
    /// How long the leader waits for a follower to confirm a sync point before it takes it
    /// out of the sync set and goes on without it [default: 1000].
    #[arg(long, value_name = "MS", requires = "ha")]
    pub ha_replica_timeout_ms: Option<u64>,
}

fn ha_settings(
    args: &Args,
    listen: std::net::SocketAddr,
) -> Result<Option<crate::ha::HaSettings>, ConfigError> {
    use crate::ha::defaults;
    if args.ha.is_none() {
        return Ok(None);
    }
    let bad = |why: String| ConfigError::Ha(why);
    let etcd: Vec<String> = args
        .etcd
        .as_deref()
        .ok_or_else(|| bad("--ha etcd needs --etcd URL[,URL...]".to_string()))?
        .split(',')
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect();
    if etcd.is_empty() {
        return Err(bad("--etcd names no URL".to_string()));
    }
    if let Some(url) = etcd
        .iter()
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
    {
        return Err(bad(format!(
            "--etcd {url:?} is not an http:// or https:// URL"
        )));
    }
    let node = args
        .node
        .clone()
        .ok_or_else(|| bad("--ha etcd needs --node NAME".to_string()))?;
    let valid = !node.is_empty()
        && node.len() <= 64
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if !valid {
        return Err(bad(format!(
            "--node {node:?}: 1 to 64 of A-Z a-z 0-9 - _ ."
        )));
    }
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| format!("http://{listen}"));
    crate::http_client::Endpoint::new(&advertise).map_err(|e| bad(format!("--advertise: {e}")))?;
    let lease_ttl_ms = args.ha_lease_ttl_ms.unwrap_or(defaults::LEASE_TTL_MS);
    if !(1_000..=60_000).contains(&lease_ttl_ms) {
        return Err(bad(format!(
            "--ha-lease-ttl-ms {lease_ttl_ms}: between 1000 and 60000 (etcd grants no lease under a second)"
        )));
    }
    let replica_timeout_ms = args
        .ha_replica_timeout_ms
        .unwrap_or(defaults::REPLICA_TIMEOUT_MS);
    if !(50..lease_ttl_ms).contains(&replica_timeout_ms) {
        return Err(bad(format!(
            "--ha-replica-timeout-ms {replica_timeout_ms}: at least 50 and under the lease TTL ({lease_ttl_ms})"
        )));
    }
    Ok(Some(crate::ha::HaSettings {
        etcd,
        node,
        advertise: advertise.trim_end_matches('/').to_string(),
        prefix: args
            .ha_prefix
            .clone()
            .unwrap_or_else(|| defaults::PREFIX.to_string()),
        lease_ttl: std::time::Duration::from_millis(lease_ttl_ms),
        replica_timeout: std::time::Duration::from_millis(replica_timeout_ms),
        poll: std::time::Duration::from_millis(defaults::POLL_MS),
    }))
}

fn config_from(args: Args) -> Result<crate::config::Config, ConfigError> {
    let unsafe_no_fsync = args.unsafe_no_fsync;
    let no_phase_batching = args.no_phase_batching;
    let base = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let mut participants = std::collections::BTreeMap::new();
    for spec in &args.participants {
        let (name, url) = parse_participant(spec)?;
        participants.insert(name, url);
    }
    let ha_args = Args {
        participants: Vec::new(),
        ..args.clone()
    };
    let flags = FileConfig {
        listen: args.listen,
        data_dir: args.data_dir,
        participants,
        prepare_timeout_ms: args.prepare_timeout_ms,
        delivery_timeout_ms: args.delivery_timeout_ms,
        retry_base_ms: args.retry_base_ms,
        retry_max_ms: args.retry_max_ms,
        checkpoint_interval_ms: args.checkpoint_interval_ms,
        retention_ms: args.retention_ms,
        retained_max: args.retained_max,
        max_live_per_participant: args.max_live_per_participant,
        max_pending_acks_per_participant: args.max_pending_acks_per_participant,
        max_waiters_per_transaction: args.max_waiters_per_transaction,
        overload_retry_after_ms: args.overload_retry_after_ms,
        retained_disk_max_bytes: args.retained_disk_max_bytes,
        wal_fill_ahead_bytes: args.wal_fill_ahead_bytes,
        decision_query_rate: args.decision_query_rate,
        decision_query_burst: args.decision_query_burst,
        client_token_file: args.client_token_file,
        operator_token_file: args.operator_token_file,
        peer_token_file: args.peer_token_file,
        metrics_token_file: args.metrics_token_file,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_ca: args.tls_ca,
        header_read_timeout_ms: args.header_read_timeout_ms,
        idle_timeout_ms: args.idle_timeout_ms,
        connections_max: args.connections_max,
        fence_key_file: args.fence_key_file,
    };
    let insecure_no_auth = args.insecure_no_auth;
    let mut config = base.overlay(flags).into_config()?;
    config.insecure_no_auth = insecure_no_auth;
    config.ha = ha_settings(&ha_args, config.listen)?;
    if unsafe_no_fsync {
        tracing::warn!("--unsafe-no-fsync: the log is never fsynced; decisions are no promise");
        config.fsync = false;
    }
    config.phase_batching = !no_phase_batching;
    Ok(config)
}

/// Runs the service; returns the process exit code.
pub fn main(args: Args) -> ExitCode {
    let config = match config_from(args) {
        Ok(config) => config,
        Err(e) => {
            error!("bad configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(server::run(config, server::shutdown_signal()));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::from(e.exit_code())
        }
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

    fn parse(argv: &[&str]) -> Args {
        Wrapper::try_parse_from(std::iter::once("coordinator").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn flags_override_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("coordinator.json");
        std::fs::write(
            &file,
            r#"{"data_dir": "/from/file", "listen": "127.0.0.1:7200", "prepare_timeout_ms": 700,
                "participants": {"inventory": "http://127.0.0.1:7001"}}"#,
        )
        .unwrap();
        let config = config_from(parse(&[
            "--config",
            file.to_str().unwrap(),
            "--data-dir",
            "/from/flag",
            "--participant",
            "payments=http://127.0.0.1:7002",
            "--retained-max",
            "5",
            "--header-read-timeout-ms",
            "500",
        ]))
        .unwrap();
        assert_eq!(
            config.serve_limits.header_read_timeout,
            std::time::Duration::from_millis(500)
        );
        assert_eq!(
            config.serve_limits.connections_max,
            net::serve_limits::defaults::CONNECTIONS_MAX
        );
        assert_eq!(config.data_dir, PathBuf::from("/from/flag"));
        assert_eq!(config.listen.to_string(), "127.0.0.1:7200");
        assert_eq!(config.prepare_timeout_ms, 700);
        assert_eq!(config.retained_max, 5);
        assert_eq!(config.participants.len(), 2);
    }

    #[test]
    fn bad_usage_is_an_error_not_a_default() {
        assert!(config_from(parse(&["--participant", "a=http://h:1"])).is_err());
        assert!(config_from(parse(&["--data-dir", "/x", "--participant", "nonsense"])).is_err());
        let missing = parse(&["--config", "/no/such/file.json"]);
        assert!(matches!(
            config_from(missing),
            Err(ConfigError::Read { .. })
        ));
    }
}
