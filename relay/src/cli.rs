//! `twopc relay`: the flags, the token files (`crate::credentials`, reread on SIGHUP), the
//! HTTP clients, the status listener (`crate::status`), and the shell's loop until SIGTERM or
//! Ctrl-C.
//!
//! This module must never print or log a token; errors name the file, not its text.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::coordinator_target::Coordinators;
use crate::credentials::{Authed, Credentials, Sends};
use crate::metrics::Metrics;
use crate::plan::{Config, Planner};
use crate::shell::Wires;
use crate::targets::Routes;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A participant whose outbox is relayed, by name (`orders=http://127.0.0.1:7201`);
    /// repeatable. Deliveries name it as their `source`.
    #[arg(long = "participant", value_name = "NAME=URL", required = true)]
    pub participants: Vec<String>,
    /// Where intents naming a target go: `NAME=URL` (an HTTP receiver; the URL is POSTed),
    /// `NAME=coordinator-transactions` or `NAME=coordinator-sagas` (submitted to
    /// `--coordinator` under the event's id); repeatable. Nothing else is ever called.
    #[arg(
        long = "target",
        value_name = "NAME=URL|NAME=coordinator-transactions|NAME=coordinator-sagas"
    )]
    pub targets: Vec<String>,
    /// The coordinator, or every coordinator of its group, comma-separated (tried in turn
    /// when one cannot be reached or answers 503 not_leader).
    #[arg(long, value_name = "URL[,URL...]")]
    pub coordinator: Option<String>,
    /// The peer token sent to participants (their reports are peer routes): a peer token file,
    /// its first token. Reread on SIGHUP, as every token file of the relay.
    #[arg(long, value_name = "FILE")]
    pub peer_token_file: Option<PathBuf>,
    /// The client token sent to the coordinator: a client token file (`name token`), its first.
    #[arg(long, value_name = "FILE")]
    pub client_token_file: Option<PathBuf>,
    /// Tokens that may read /metrics (one per line), as on the coordinator and the
    /// participants; without it /metrics is open. /healthz and /readyz are always open.
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// PEM certificate(s) of the CA that https:// servers' certificates must come from.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Between two listings of a participant's outbox.
    #[arg(long, default_value_t = 500)]
    pub poll_ms: u64,
    /// One delivery attempt's time, including waiting for a coordinator outcome; past it the
    /// outcome is unknown and the intent goes again under the same id.
    #[arg(long, default_value_t = 5_000)]
    pub attempt_timeout_ms: u64,
    /// The first backoff after an unknown outcome (doubling up to --backoff-max-ms).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub backoff_base_ms: u64,
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub backoff_max_ms: u64,
    /// Most deliveries in flight at once (over every participant and aggregate).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_in_flight: u64,
    /// While this many reports of answered deliveries wait for the participant's answer, no
    /// new delivery starts (a receiver faster than the participant's forced reports would
    /// otherwise pile up reports, and connections to the participant, without limit). Reports
    /// are forced records that group-commit together: too few in flight caps delivery
    /// (docs/benchmarks.md, "The outbox"); the default stays well under a participant's 512
    /// connections.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_reports_in_flight: u64,
    /// Serve /healthz, /readyz and /metrics here (loopback unless you mean it).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

pub fn main(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("twopc relay: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twopc relay: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why the relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Routes(#[from] crate::targets::RoutesError),
    #[error("{0}")]
    Token(String),
    #[error(transparent)]
    Tls(#[from] net::TlsError),
    #[error(transparent)]
    Client(#[from] net::outbound::BuildError),
    #[error("cannot build an HTTP client: {0}")]
    Reqwest(#[from] reqwest::Error),
    #[error("cannot listen on {addr}: {error}")]
    Listen {
        addr: SocketAddr,
        error: std::io::Error,
    },
}

async fn run(args: Args) -> Result<(), StartError> {
    let routes = Routes::parse(
        &args.participants,
        &args.targets,
        args.coordinator.as_deref(),
    )?;
    // Read before anything starts: a bad file stops the start (exit 1).
    let credentials = Arc::new(
        Credentials::load(
            args.peer_token_file.clone(),
            args.client_token_file.clone(),
            args.metrics_token_file.clone(),
        )
        .map_err(StartError::Token)?,
    );
    let tls = args.tls_ca.as_deref().map(net::client_config).transpose()?;
    let attempt_timeout = Duration::from_millis(args.attempt_timeout_ms.max(1));
    let limits = net::Limits::service(attempt_timeout);
    let participants = Authed::new(
        net::outbound::reqwest_client(&limits, tls.clone())?,
        Arc::clone(&credentials),
        Sends::Peer,
    );
    let receivers = net::outbound::reqwest_client(&limits, tls.clone())?;
    let coordinators = if routes.coordinators.is_empty() {
        None
    } else {
        let client = Authed::new(
            net::outbound::reqwest_client(&limits, tls)?,
            Arc::clone(&credentials),
            Sends::Client,
        );
        Some(Coordinators::new(client, routes.coordinators.clone()))
    };
    let reloader = tokio::spawn(Arc::clone(&credentials).reload_on_sighup());
    let metrics = Arc::new(Metrics::default());
    let config = Config {
        poll_ms: args.poll_ms.max(1),
        backoff_base_ms: args.backoff_base_ms,
        backoff_max_ms: args.backoff_max_ms.max(args.backoff_base_ms),
        max_in_flight: usize::try_from(args.max_in_flight).unwrap_or(16),
        max_reports_in_flight: usize::try_from(args.max_reports_in_flight).unwrap_or(256),
    };
    let planner = Planner::new(config, routes.participants.keys().cloned());
    let target_names: Vec<String> = routes.targets.keys().cloned().collect();
    tracing::info!(
        participants = ?routes.participants.keys().collect::<Vec<_>>(),
        targets = ?target_names,
        "relay starting"
    );
    let wires = Arc::new(Wires {
        routes,
        participants,
        receivers,
        coordinators,
        attempt_timeout,
        metrics: metrics.clone(),
    });
    if let Some(addr) = args.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|error| StartError::Listen { addr, error })?;
        let router = crate::status::routes(metrics, target_names, credentials.keys());
        tokio::spawn(async move {
            if let Err(error) = net::serve(listener, router, None, shutdown_signal()).await {
                tracing::error!(%error, "the status listener stopped");
            }
        });
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    }
    crate::shell::run(planner, wires, shutdown_signal()).await;
    reloader.abort();
    tracing::info!("relay stopped");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
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
