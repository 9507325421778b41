//! A coordinator and its participants as real child processes on free loopback ports, with
//! their data and logs under one directory. `twopc demo`, `twopc bench` and the crash-point
//! scenarios all run on it.
//!
//! Starting is two steps so a harness can put something (a fault proxy) between the
//! coordinator and each participant: `start_participants`, then `start_coordinator` with the
//! URLs the coordinator should use for them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::audit::ClusterUrls;
use crate::auth::TokenSet;
use crate::checkout::{CheckoutConfig, INVENTORY, PAYMENTS, SHIPPING};
use crate::node::{Node, NodeSpec, free_port};

/// Why a cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot prepare {path}: {source}")]
    Files {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    NotReady(String),
    #[error("no participant named {0} in this cluster")]
    NoSuchParticipant(String),
    #[error("cannot make the cluster's tokens: {0}")]
    Tokens(#[from] crate::auth::TokenSetError),
}

type Result<T> = std::result::Result<T, ClusterError>;

fn files(path: &Path) -> impl FnOnce(std::io::Error) -> ClusterError + '_ {
    move |source| ClusterError::Files {
        path: path.to_path_buf(),
        source,
    }
}

/// How long a freshly started process may take to finish recovery.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `twopc` binary (the running one for the demo; the failpoints build for scenarios).
    pub binary: PathBuf,
    pub data_dir: PathBuf,
    /// Participant names; each gets a reference KV participant unless `postgres_args` names it.
    pub participants: Vec<String>,
    /// Participants started with `--backend postgres` and these flags (`--postgres-url`,
    /// `--statements`, ...) instead of a data directory and seed file, by name.
    pub postgres_args: Vec<(String, Vec<String>)>,
    /// Seed file contents by participant name (applied on a participant's first start).
    pub seeds: Vec<(String, serde_json::Value)>,
    /// Extra flags for every process (for example durability off in a bench baseline).
    pub coordinator_flags: Vec<String>,
    pub participant_flags: Vec<String>,
    /// Extra environment (for example `FAILPOINTS`) by node name (`coordinator` or a
    /// participant's name).
    pub env: Vec<(String, Vec<(String, String)>)>,
}

impl ClusterSpec {
    /// The checkout cluster of the demo: `inventory`, `payments`, `shipping`, seeded.
    pub fn checkout(binary: &Path, data_dir: &Path, config: &CheckoutConfig) -> ClusterSpec {
        ClusterSpec {
            binary: binary.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            participants: [INVENTORY, PAYMENTS, SHIPPING].map(String::from).to_vec(),
            postgres_args: Vec::new(),
            seeds: config
                .seeds()
                .into_iter()
                .map(|(name, seed)| (name.to_string(), seed))
                .collect(),
            coordinator_flags: Vec::new(),
            participant_flags: Vec::new(),
            env: Vec::new(),
        }
    }

    fn env_of(&self, node: &str) -> Vec<(String, String)> {
        self.env
            .iter()
            .find(|(name, _)| name == node)
            .map(|(_, env)| env.clone())
            .unwrap_or_default()
    }
}

/// The running processes. Dropping it kills them all.
#[derive(Debug)]
pub struct LocalCluster {
    pub coordinator: Node,
    pub participants: Vec<(String, Node)>,
    pub log_dir: PathBuf,
    /// Every process's token files (in `<data dir>/tokens`); `None` with
    /// `TWOPC_HARNESS_AUTH=off`.
    pub tokens: Option<TokenSet>,
}

/// The participants, started and ready, before the coordinator exists.
#[derive(Debug)]
pub struct Participants {
    nodes: Vec<(String, Node)>,
    coordinator_addr: std::net::SocketAddr,
    log_dir: PathBuf,
    tokens: Option<TokenSet>,
}

impl Participants {
    /// Each participant's own URL, by name (what a proxy would forward to).
    pub fn urls(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .map(|(name, node)| (name.clone(), node.url()))
            .collect()
    }

    /// Their token files (the coordinator gets the same).
    pub fn tokens(&self) -> Option<&TokenSet> {
        self.tokens.as_ref()
    }
}

impl LocalCluster {
    /// Starts the participants, then the coordinator talking to them directly, and waits until
    /// all are ready.
    pub fn start(spec: &ClusterSpec) -> Result<LocalCluster> {
        let participants = Self::start_participants(spec)?;
        let direct = participants.urls();
        Self::start_coordinator(spec, participants, &direct)
    }

    /// Starts every participant and waits until each is ready.
    pub fn start_participants(spec: &ClusterSpec) -> Result<Participants> {
        Self::start_participants_at(spec, loopback(free_port()), &|_| None)
    }

    /// The loopback address a coordinator can be started on later: for
    /// [`LocalCluster::start_participants_at`], whose caller must know it before the
    /// participants start (to put a proxy on their way to it).
    pub fn coordinator_addr() -> std::net::SocketAddr {
        loopback(free_port())
    }

    /// [`LocalCluster::start_participants`] with the coordinator's address chosen by the caller,
    /// and for each participant that `coordinator_url_of` names a URL for, that URL as its
    /// `--coordinator` (where it sends its decision queries: a proxy on its link to the
    /// coordinator) instead of the coordinator's own.
    pub fn start_participants_at(
        spec: &ClusterSpec,
        coordinator_addr: std::net::SocketAddr,
        coordinator_url_of: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Participants> {
        let log_dir = spec.data_dir.join("logs");
        let seed_dir = spec.data_dir.join("seeds");
        std::fs::create_dir_all(&log_dir).map_err(files(&log_dir))?;
        std::fs::create_dir_all(&seed_dir).map_err(files(&seed_dir))?;

        let tokens = TokenSet::for_harness(&spec.data_dir)?;
        let coordinator_url = format!("http://{coordinator_addr}");
        let mut nodes = Vec::new();
        for name in &spec.participants {
            let addr = loopback(free_port());
            let mut args = vec![
                "participant".to_string(),
                "--name".into(),
                name.clone(),
                "--listen".into(),
                addr.to_string(),
                "--coordinator".into(),
                coordinator_url_of(name).unwrap_or_else(|| coordinator_url.clone()),
            ];
            let postgres = spec.postgres_args.iter().find(|(n, _)| n == name);
            let seed = spec.seeds.iter().find(|(n, _)| n == name);
            match (postgres, seed) {
                // Its data is PostgreSQL's: the caller seeds it with SQL.
                (Some((_, flags)), _) => {
                    args.extend(["--backend".to_string(), "postgres".into()]);
                    args.extend(flags.iter().cloned());
                }
                (None, seed) => {
                    args.extend([
                        "--data-dir".to_string(),
                        path_arg(&spec.data_dir.join(name)),
                    ]);
                    if let Some((_, seed)) = seed {
                        let seed_path = seed_dir.join(format!("{name}.json"));
                        let bytes = serde_json::to_vec_pretty(seed).unwrap_or_default();
                        std::fs::write(&seed_path, bytes).map_err(files(&seed_path))?;
                        args.extend(["--seed".to_string(), path_arg(&seed_path)]);
                    }
                }
            }
            args.extend(spec.participant_flags.iter().cloned());
            let node = Node::start(NodeSpec {
                name: name.clone(),
                binary: spec.binary.clone(),
                args,
                env: spec.env_of(name),
                addr,
                log_path: log_dir.join(format!("{name}.log")),
                tokens: tokens.clone(),
            });
            nodes.push((name.clone(), node));
        }
        for (_, node) in &mut nodes {
            node.wait_ready(READY_TIMEOUT)
                .map_err(ClusterError::NotReady)?;
        }
        Ok(Participants {
            nodes,
            coordinator_addr,
            log_dir,
            tokens,
        })
    }

    /// Starts the coordinator with `participant_urls` (by name) and waits until it is ready.
    pub fn start_coordinator(
        spec: &ClusterSpec,
        participants: Participants,
        participant_urls: &[(String, String)],
    ) -> Result<LocalCluster> {
        let mut args = vec![
            "coordinator".to_string(),
            "--listen".into(),
            participants.coordinator_addr.to_string(),
            "--data-dir".into(),
            path_arg(&spec.data_dir.join("coordinator")),
        ];
        for (name, url) in participant_urls {
            args.extend(["--participant".to_string(), format!("{name}={url}")]);
        }
        args.extend(spec.coordinator_flags.iter().cloned());
        let coordinator = Node::start(NodeSpec {
            name: "coordinator".into(),
            binary: spec.binary.clone(),
            args,
            env: spec.env_of("coordinator"),
            addr: participants.coordinator_addr,
            log_path: participants.log_dir.join("coordinator.log"),
            tokens: participants.tokens.clone(),
        });
        let mut cluster = LocalCluster {
            coordinator,
            participants: participants.nodes,
            log_dir: participants.log_dir,
            tokens: participants.tokens,
        };
        cluster
            .coordinator
            .wait_ready(READY_TIMEOUT)
            .map_err(ClusterError::NotReady)?;
        Ok(cluster)
    }

    /// The node of participant `name`.
    pub fn participant(&mut self, name: &str) -> Result<&mut Node> {
        self.participants
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, node)| node)
            .ok_or_else(|| ClusterError::NoSuchParticipant(name.to_string()))
    }

    /// SIGKILL the coordinator: no flush, no goodbye.
    pub fn kill_coordinator(&mut self) {
        self.coordinator.kill();
    }

    /// Starts the coordinator again on the same port and data directory; waits for recovery.
    pub fn restart_coordinator(&mut self) -> Result<()> {
        self.coordinator.restart();
        self.coordinator
            .wait_ready(READY_TIMEOUT)
            .map_err(ClusterError::NotReady)
    }

    /// Graceful stop of every process (SIGTERM), coordinator first.
    pub fn stop(&mut self) {
        self.coordinator.terminate(Duration::from_secs(10));
        for (_, node) in &mut self.participants {
            node.terminate(Duration::from_secs(10));
        }
    }

    /// An HTTP client that sends the cluster's operator token (none with auth off).
    pub fn http(&self) -> reqwest::ClientBuilder {
        crate::auth::http_client(self.tokens.as_ref())
    }

    pub fn coordinator_url(&self) -> String {
        self.coordinator.url()
    }

    pub fn participant_url(&self, name: &str) -> Option<String> {
        self.participants
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, node)| node.url())
    }

    /// The URLs the audit reads (checkout clusters only).
    pub fn checkout_urls(&self) -> Result<ClusterUrls> {
        let url = |name: &str| {
            self.participant_url(name)
                .ok_or_else(|| ClusterError::NoSuchParticipant(name.to_string()))
        };
        Ok(ClusterUrls {
            coordinator: self.coordinator_url(),
            inventory: url(INVENTORY)?,
            payments: url(PAYMENTS)?,
            shipping: url(SHIPPING)?,
        })
    }
}

fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
