//! `twopc participant --backend postgres`: the ready-made PostgreSQL participant, serving the
//! statements of a file (see [`super::statements`]).

use std::process::ExitCode;

use super::backend::PgParticipant;
use super::config::PgConfig;
use super::error::PgError;
use super::statements::Statements;
use crate::cli::args::Args;
pub use crate::cli::args::PgArgs;
use crate::cli::shutdown::shutdown_signal;

/// Exit codes as the kv backend's: 2 bad configuration (including every setup mistake found at
/// start: unreachable server, wrong credentials, `max_prepared_transactions = 0`, a statement
/// that does not prepare), 1 runtime failure.
pub fn main(args: &Args) -> ExitCode {
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
    runtime.block_on(serve(args))
}

fn config(args: &Args) -> Result<(PgConfig, Vec<u8>), String> {
    let url = args
        .postgres
        .postgres_url
        .clone()
        .ok_or("--backend postgres needs --postgres-url (or TWOPC_PARTICIPANT_POSTGRES_URL)")?;
    let path = args
        .postgres
        .statements
        .as_ref()
        .ok_or("--backend postgres needs --statements FILE")?;
    let statements = std::fs::read(path)
        .map_err(|e| format!("cannot read the statements file {}: {e}", path.display()))?;
    if args.postgres.postgres_connections == 0 {
        return Err("--postgres-connections must be at least 1".into());
    }
    if args.postgres.postgres_decision_connections == 0 {
        return Err("--postgres-decision-connections must be at least 1".into());
    }
    let mut config = PgConfig::new(url, args.name.as_str());
    config.connections = args.postgres.postgres_connections;
    config.decision_connections = args.postgres.postgres_decision_connections;
    config.coordinator_urls = crate::cli::args::coordinator_urls(args.coordinator.as_deref())?;
    config.coordinator_tls = args.tls.coordinator(&config.coordinator_urls)?;
    config.in_doubt_after_ms = args.in_doubt_after_ms;
    config.scan_every_ms = (args.in_doubt_after_ms / 4).clamp(10, 1_000);
    config.decision_timeout_ms = args.decision_timeout_ms;
    config.decision_backoff_max_ms = args.decision_backoff_max_ms;
    config.lock_wait_max_ms = args.lock_wait_max_ms;
    config.outbox_retention_ms = args.outbox_retention_ms;
    config.fence = args.fence_policy()?;
    config.keys = args.auth.keys(args.listen)?;
    config.loopback_listen = args.listen.ip().is_loopback();
    config.epoch_jump_max = crate::epoch_bound::in_force(args.epoch_jump_max, &config.keys);
    Ok((config, statements))
}

async fn start(config: PgConfig, statements: &[u8]) -> Result<PgParticipant<Statements>, String> {
    let specs = Statements::parse_file(statements)?;
    let pool = super::pool::Pool::new(&config.url, 1, 1).map_err(|e| e.to_string())?;
    let client = pool.connect().await.map_err(|e| e.to_string())?;
    let statements = Statements::check(&client, specs)
        .await
        .map_err(|e| match e {
            PgError::Db { context, message } => format!(
                "{context} does not prepare against this database: {message} (is the schema \
                 created, and the participant connected to the right database?)"
            ),
            other => other.to_string(),
        })?;
    drop(client);
    PgParticipant::start(config, statements)
        .await
        .map_err(|e| e.to_string())
}

async fn serve(args: &Args) -> ExitCode {
    let (config, statements, server_tls, limits) =
        match config(args).and_then(|(config, statements)| {
            Ok((config, statements, args.tls.server()?, args.serve.limits()?))
        }) {
            Ok(parts) => parts,
            Err(message) => {
                tracing::error!("{message}");
                return ExitCode::from(2);
            }
        };
    let participant = match start(config, &statements).await {
        Ok(participant) => participant,
        Err(message) => {
            tracing::error!("cannot start: {message}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(listen = %args.listen, %error, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    let resolver = participant.spawn_resolver();
    let pruner = participant.spawn_outbox_pruner();
    let reloader = tokio::spawn(crate::auth::reload_on_sighup(
        args.auth.files(),
        participant.config().keys.clone(),
    ));
    tracing::info!(name = %args.name, listen = %args.listen,
        statements = ?participant.work().names(),
        max_prepared_transactions = participant.max_prepared_transactions(),
        tls = server_tls.is_some(), "postgres participant ready");
    let served = net::serve_with_limits(
        listener,
        crate::http::finish(participant.router()),
        server_tls,
        limits,
        shutdown_signal(),
    )
    .await;
    resolver.abort();
    pruner.abort();
    reloader.abort();
    if let Err(error) = served {
        tracing::error!(%error, "server failed");
        return ExitCode::FAILURE;
    }
    tracing::info!(name = %args.name, "stopped");
    ExitCode::SUCCESS
}
