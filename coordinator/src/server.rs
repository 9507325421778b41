//! Process-level wiring: the data-directory lock, the listener (served before recovery so that
//! callers get 503 `not_ready` instead of connection refused), recovery, background work, and
//! graceful shutdown.

use std::fs::{File, TryLockError};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::api::{AppState, router};
use crate::config::Config;
use crate::metrics::Metrics;
use wal::{FileStorage, MirroredStorage};

use crate::ha::mirror::GroupMirror;
use crate::ha::node::GroupNode;
use crate::runtime::{Core, GroupStart, StartError, housekeeping, recover, recover_with};

/// How long shutdown waits for in-flight requests (a `?wait=acked` may wait on a participant
/// that is down) before it stops them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the service stopped or could not start; each maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "data directory {dir} is locked by another process (is another coordinator running on it?)"
    )]
    Locked { dir: PathBuf },
    #[error("cannot use data directory {dir}: {source}")]
    DataDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("stopped with a failed log; restart once the disk is healthy")]
    LogFailed,
    #[error(transparent)]
    Exposed(#[from] protocol::auth::Exposed),
    #[error("the coordinator group: {0}")]
    Group(#[from] crate::ha::etcd_group::GroupError),
    #[error(
        "stepped down: this node could no longer prove it leads its group; restart it to follow"
    )]
    Deposed,
}

impl RunError {
    /// The process exit code (documented in docs/operations.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Locked { .. } => 3,
            RunError::Exposed(_) => 2,
            RunError::Start(
                StartError::Corrupt(_)
                | StartError::Undecodable { .. }
                | StartError::EpochExhausted { .. },
            ) => 4,
            RunError::Deposed => 5,
            RunError::DataDir { .. }
            | RunError::Group(_)
            | RunError::Bind { .. }
            | RunError::Start(_)
            | RunError::Serve(_)
            | RunError::LogFailed => 1,
        }
    }
}

/// Takes `<data-dir>/LOCK` exclusively for the life of the returned file.
pub fn lock_data_dir(dir: &Path) -> Result<File, RunError> {
    let io = |source| RunError::DataDir {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(RunError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(TryLockError::Error(e)) => Err(io(e)),
    }
}

/// A started coordinator.
#[derive(Debug)]
pub struct Running {
    pub addr: SocketAddr,
    pub core: Arc<Core>,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
    housekeeping: JoinHandle<()>,
    reloader: JoinHandle<()>,
    /// This node of a coordinator group (`--ha`), leading.
    pub group: Option<Arc<GroupNode>>,
    _lock: File,
}

/// Locks the directory, starts serving, recovers, and returns once ready.
pub async fn start(config: Config) -> Result<Running, RunError> {
    let open_on_purpose = protocol::auth::check_exposure(
        config.listen,
        &config.keys.current(),
        config.insecure_no_auth,
    )?;
    if open_on_purpose {
        warn!(listen = %config.listen,
              "--insecure-no-auth: serving a non-loopback address with no token; anyone who \
               reaches it may submit, commit, abort and resolve");
    }
    for kind in config.keys.current().kinds_missing() {
        warn!(
            kind = kind.as_str(),
            "authentication is on but no {} token file is given: every {} call will be              refused (401); give --{}-token-file",
            kind.as_str(),
            kind.as_str(),
            kind.as_str()
        );
    }
    let lock = lock_data_dir(&config.data_dir)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| RunError::Bind {
        addr: config.listen,
        source,
    })?;
    let metrics = Arc::new(Metrics::default());
    let mut state = AppState::new(Arc::clone(&metrics))
        .with_keys(config.keys.clone())
        .with_loopback_listen(config.listen.ip().is_loopback());
    let group = match &config.ha {
        Some(settings) => Some(
            GroupNode::join(
                settings.clone(),
                &config.data_dir,
                config.retained_disk_max_bytes,
                config.retention_ms,
            )
            .await?,
        ),
        None => None,
    };
    if let Some(node) = &group {
        state = state.with_group(Arc::clone(node));
    }
    let reloader = tokio::spawn(reload_tokens_on_sighup(
        config.token_files.clone(),
        config.keys.clone(),
    ));
    let (stop, stopped) = oneshot::channel::<()>();
    // Handlers see the caller's address (`ConnectInfo`): it keys the decision-query budget
    // (`api::QueryLimiter`).
    let server = tokio::spawn(net::serve_with_limits(
        listener,
        router(state.clone()),
        config.tls.server.clone(),
        config.serve_limits,
        async {
            let _ = stopped.await;
        },
    ));
    let scheme = if config.tls.server.is_some() {
        "https"
    } else {
        "http"
    };
    info!(%addr, scheme, data_dir = %config.data_dir.display(), "listening; recovering the log");
    let recovered = match &group {
        None => recover(&config, metrics).await.map_err(RunError::from),
        Some(node) => lead_when_elected(node, &config, metrics).await,
    };
    let core = match recovered {
        Ok(core) => core,
        Err(e) => {
            server.abort();
            reloader.abort();
            return Err(e);
        }
    };
    state.set_ready(Arc::clone(&core));
    info!(%addr, coordinator_id = %core.identity().coordinator_id,
          epoch = %core.identity().epoch, "ready");
    let housekeeping = tokio::spawn(housekeeping(Arc::clone(&core)));
    Ok(Running {
        addr,
        core,
        stop,
        server,
        housekeeping,
        reloader,
        group,
        _lock: lock,
    })
}

/// A node of a group follows (serving its leader's replication) until it wins a campaign,
/// then recovers from its copy as a restarted coordinator would, at an epoch at least the
/// term it won, with its log replicated from here on.
async fn lead_when_elected(
    node: &Arc<GroupNode>,
    config: &Config,
    metrics: Arc<Metrics>,
) -> Result<Arc<Core>, RunError> {
    info!(node = %node.settings().node, "following; campaigning when the group has no leader");
    let (term, lease) = node.until_elected().await?;
    node.host().close_for_promotion();
    let mirror = GroupMirror::new(
        node.group().clone(),
        term.state.term,
        term.claim_revision,
        node.settings().replica_timeout,
        config.keys.clone(),
        config.tls.client.clone(),
    );
    let storage = MirroredStorage::new(
        Arc::new(FileStorage),
        config.data_dir.join("wal"),
        Arc::new(mirror.clone()),
    );
    mirror.set_storage(Arc::clone(&storage));
    let core = recover_with(
        storage,
        config,
        metrics,
        Some(GroupStart {
            term: term.state.term,
            mirror: mirror.clone(),
        }),
    )
    .await?;
    let watched = Arc::clone(&core);
    node.lead(move || watched.is_poisoned(), mirror, lease);
    Ok(core)
}

/// Rereads the token files on every SIGHUP and puts the new set in force whole; a file that
/// does not read or check keeps the old set (and says why). Tokens never reach the log.
///
/// The handler is installed even with no token files: SIGHUP's default action ends the
/// process, and an operator's reflexive `kill -HUP` (or a log rotator's) must not stop a
/// coordinator. Then it only says there is nothing to reload.
async fn reload_tokens_on_sighup(files: protocol::auth::TokenFiles, keys: protocol::auth::KeyRing) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(e) => {
                error!(error = %e, "cannot listen for SIGHUP; tokens will not reload");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            if !files.any() {
                info!("SIGHUP: no token files are given; nothing to reload");
                continue;
            }
            match files.load(|path| std::fs::read_to_string(path)) {
                Ok(loaded) => {
                    info!(tokens = ?loaded, "SIGHUP: token files reloaded");
                    keys.replace(loaded);
                }
                Err(e) => {
                    error!(error = %e, "SIGHUP: token files refused; the old tokens stay in force")
                }
            }
        }
    }
}

impl Running {
    /// Stops accepting, lets in-flight requests finish (bounded), stops background work.
    pub async fn shutdown(self) -> Result<(), RunError> {
        let _ = self.stop.send(());
        let mut server = self.server;
        let served = match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(Ok(result)) => result.map_err(RunError::Serve),
            Ok(Err(join)) => Err(RunError::Serve(std::io::Error::other(join.to_string()))),
            Err(_) => {
                warn!("in-flight requests still open after {SHUTDOWN_GRACE:?}; closing them");
                server.abort();
                Ok(())
            }
        };
        self.housekeeping.abort();
        self.reloader.abort();
        served?;
        let core = Arc::clone(&self.core);
        let _ = tokio::task::spawn_blocking(move || core.close_log()).await;
        if let Some(node) = &self.group {
            // The log is closed: nothing more is acknowledged, so the key can go now.
            node.resign().await;
        }
        if self.core.is_poisoned() {
            return Err(RunError::LogFailed);
        }
        info!("stopped");
        Ok(())
    }
}

/// Runs until `signal` resolves, then shuts down gracefully.
pub async fn run(config: Config, signal: impl Future<Output = ()>) -> Result<(), RunError> {
    tokio::pin!(signal);
    // A follower stays in `start` until it leads; a signal meanwhile ends it at once (it
    // acknowledged nothing).
    let running = tokio::select! {
        started = start(config) => started?,
        () = &mut signal => {
            info!("shutdown requested before this node led its group");
            return Ok(());
        }
    };
    let group = running.group.clone();
    let deposed = async {
        match &group {
            Some(node) => node.deposed().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = &mut signal => {}
        () = deposed => return Err(RunError::Deposed),
    }
    info!("shutdown requested");
    running.shutdown().await
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
