//! `twopc participant --backend kv`: the reference key-value participant as a process, its
//! configuration read from the flags, its seed from `--seed`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use protocol::ParticipantName;

use crate::cli::args::{
    Args, COMMIT_GROUP_DELAY_US_MAX, WAL_FILL_AHEAD_BYTES_MAX, coordinator_urls,
};
use crate::cli::shutdown::shutdown_signal;
use crate::config::ParticipantConfig;
use crate::kv::{KvStore, routes};
use crate::service::Participant;

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
        if self.wal_fill_ahead_bytes > WAL_FILL_AHEAD_BYTES_MAX {
            return Err(format!(
                "--wal-fill-ahead-bytes {} is over the limit of {WAL_FILL_AHEAD_BYTES_MAX} (a fill \
                 that long stalls the syncs behind it)",
                self.wal_fill_ahead_bytes
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
        config.coordinator_urls = coordinator_urls(self.coordinator.as_deref())?;
        config.coordinator_tls = self.tls.coordinator(&config.coordinator_urls)?;
        config.engine.in_doubt_after_ms = self.in_doubt_after_ms;
        config.engine.decision_backoff_base_ms = self.decision_backoff_base_ms;
        config.engine.decision_backoff_max_ms = self.decision_backoff_max_ms;
        config.engine.tombstone_retention_ms = self.tombstone_retention_ms;
        config.engine.tombstones_max = self.tombstones_max;
        config.engine.lock_wait_max_ms = self.lock_wait_max_ms;
        config.engine.lock_waiters_max = self.lock_waiters_max;
        config.engine.epoch_jump_max =
            crate::epoch_bound::in_force(self.epoch_jump_max, &config.keys);
        config.engine.fence = self.fence_policy()?;
        config.engine.fence_retention = crate::fence::table::FenceRetention {
            highest_ms: self.fence_retention_ms,
            answers_ms: self.op_answer_retention_ms,
            answers_max: self.op_answers_max,
        };
        config.engine.outbox_retention = crate::outbox::OutboxRetention {
            settled_ms: self.outbox_retention_ms,
        };
        config.decision_timeout_ms = self.decision_timeout_ms;
        config.checkpoint_every_records = self.checkpoint_every_records;
        config.wal.group_delay = std::time::Duration::from_micros(self.commit_group_delay_us);
        config.wal_fill_ahead_bytes = self.wal_fill_ahead_bytes;
        if self.unsafe_no_fsync {
            config.wal.sync = wal::SyncPolicy::Never;
        }
        // Scan for in-doubt transactions a few times per in-doubt period, at most every 100 ms.
        config.tick_ms = (self.in_doubt_after_ms / 4).clamp(10, 100);
        Ok(config)
    }
}

/// Runs the kv participant; returns the process exit code (0 clean shutdown, 1 runtime
/// failure, 2 bad configuration, 3 data directory locked, 4 corrupt log).
pub fn main(args: Args) -> ExitCode {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::COMMIT_GROUP_DELAY_US_DEFAULT;
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
    fn wal_fill_ahead_reaches_the_config_and_is_bounded() {
        assert_eq!(
            config(&[]).unwrap().wal_fill_ahead_bytes,
            wal::FILL_AHEAD_BYTES
        );
        let plain = config(&["--wal-fill-ahead-bytes", "0"]).unwrap();
        assert_eq!(plain.wal_fill_ahead_bytes, 0);
        let over = (WAL_FILL_AHEAD_BYTES_MAX + 1).to_string();
        let error = config(&["--wal-fill-ahead-bytes", &over]).unwrap_err();
        assert!(error.contains("--wal-fill-ahead-bytes"), "{error}");
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
    fn coordinator_takes_a_list_checking_each_address() {
        let one = config(&["--coordinator", "http://127.0.0.1:7100/"]).unwrap();
        assert_eq!(one.coordinator_urls, ["http://127.0.0.1:7100"]);
        let group = config(&["--coordinator", "http://a:7100, http://b:7100"]).unwrap();
        assert_eq!(group.coordinator_urls, ["http://a:7100", "http://b:7100"]);
        assert!(config(&[]).unwrap().coordinator_urls.is_empty());
        // The TLS check applies to every address, not only the first.
        let error = config(&["--coordinator", "http://a:7100,https://b:7100"]).unwrap_err();
        assert!(
            error.contains("https://b:7100") && error.contains("--tls-ca"),
            "{error}"
        );
        let error = config(&["--coordinator", "http://a:7100,b:7100"]).unwrap_err();
        assert!(error.contains("http:// or https://"), "{error}");
        let error = config(&["--coordinator", "http://a:7100,http://A:7100/"]).unwrap_err();
        assert!(error.contains("twice"), "{error}");
        let error = config(&["--coordinator", "http://a:7100,"]).unwrap_err();
        assert!(error.contains("empty"), "{error}");
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
