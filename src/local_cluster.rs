//! A coordinator and the three checkout participants as child processes of this command, on
//! free loopback ports, with their data and logs under one directory. `twopc demo` and
//! `twopc bench` run on it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use chaos_tests::audit::ClusterUrls;
use chaos_tests::checkout::{CheckoutConfig, INVENTORY, PAYMENTS, SHIPPING};
use chaos_tests::node::{Node, NodeSpec, free_port};

/// How long a freshly started process may take to finish recovery.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub data_dir: PathBuf,
    /// Participant names; each gets a reference KV participant.
    pub participants: Vec<String>,
    /// Seed file contents by participant name (applied on a participant's first start).
    pub seeds: Vec<(String, serde_json::Value)>,
    /// Extra flags for every process (for example durability off in a bench baseline).
    pub coordinator_flags: Vec<String>,
    pub participant_flags: Vec<String>,
}

impl ClusterSpec {
    /// The checkout cluster of the demo: `inventory`, `payments`, `shipping`, seeded.
    pub fn checkout(data_dir: &Path, config: &CheckoutConfig) -> ClusterSpec {
        ClusterSpec {
            data_dir: data_dir.to_path_buf(),
            participants: [INVENTORY, PAYMENTS, SHIPPING].map(String::from).to_vec(),
            seeds: config
                .seeds()
                .into_iter()
                .map(|(name, seed)| (name.to_string(), seed))
                .collect(),
            coordinator_flags: Vec::new(),
            participant_flags: Vec::new(),
        }
    }
}

/// The running processes. Dropping it kills them all.
#[derive(Debug)]
pub struct LocalCluster {
    pub coordinator: Node,
    pub participants: Vec<(String, Node)>,
    pub log_dir: PathBuf,
}

impl LocalCluster {
    /// Starts the participants, then the coordinator, and waits until all are ready.
    pub fn start(spec: &ClusterSpec) -> Result<LocalCluster> {
        let binary = std::env::current_exe().context("cannot find the twopc binary")?;
        let log_dir = spec.data_dir.join("logs");
        let seed_dir = spec.data_dir.join("seeds");
        std::fs::create_dir_all(&log_dir)
            .and_then(|()| std::fs::create_dir_all(&seed_dir))
            .with_context(|| format!("cannot create {}", spec.data_dir.display()))?;

        let coordinator_addr = loopback(free_port());
        let coordinator_url = format!("http://{coordinator_addr}");
        let mut participants = Vec::new();
        for name in &spec.participants {
            let addr = loopback(free_port());
            let mut args = vec![
                "participant".to_string(),
                "--name".into(),
                name.clone(),
                "--listen".into(),
                addr.to_string(),
                "--data-dir".into(),
                path_arg(&spec.data_dir.join(name)),
                "--coordinator".into(),
                coordinator_url.clone(),
            ];
            if let Some((_, seed)) = spec.seeds.iter().find(|(n, _)| n == name) {
                let seed_path = seed_dir.join(format!("{name}.json"));
                std::fs::write(&seed_path, serde_json::to_vec_pretty(seed)?)
                    .with_context(|| format!("cannot write {}", seed_path.display()))?;
                args.extend(["--seed".to_string(), path_arg(&seed_path)]);
            }
            args.extend(spec.participant_flags.iter().cloned());
            let node = Node::start(NodeSpec {
                name: name.clone(),
                binary: binary.clone(),
                args,
                env: Vec::new(),
                addr,
                log_path: log_dir.join(format!("{name}.log")),
            });
            participants.push((name.clone(), node));
        }

        let mut args = vec![
            "coordinator".to_string(),
            "--listen".into(),
            coordinator_addr.to_string(),
            "--data-dir".into(),
            path_arg(&spec.data_dir.join("coordinator")),
        ];
        for (name, node) in &participants {
            args.extend(["--participant".to_string(), format!("{name}={}", node.url())]);
        }
        args.extend(spec.coordinator_flags.iter().cloned());
        let coordinator = Node::start(NodeSpec {
            name: "coordinator".into(),
            binary,
            args,
            env: Vec::new(),
            addr: coordinator_addr,
            log_path: log_dir.join("coordinator.log"),
        });

        let mut cluster = LocalCluster {
            coordinator,
            participants,
            log_dir,
        };
        for (_, node) in &mut cluster.participants {
            node.wait_ready(READY_TIMEOUT).map_err(anyhow::Error::msg)?;
        }
        cluster
            .coordinator
            .wait_ready(READY_TIMEOUT)
            .map_err(anyhow::Error::msg)?;
        Ok(cluster)
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
            .map_err(anyhow::Error::msg)
    }

    /// Graceful stop of every process (SIGTERM), coordinator first.
    pub fn stop(&mut self) {
        self.coordinator.terminate(Duration::from_secs(10));
        for (_, node) in &mut self.participants {
            node.terminate(Duration::from_secs(10));
        }
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
                .with_context(|| format!("no participant {name} in this cluster"))
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
