//! A coordinator group on one machine, for `twopc demo --ha` and `twopc bench --ha` (issue
//! 27): a local etcd ([`EtcdCluster`]), the participants of a [`ClusterSpec`], and several
//! coordinator processes started with `--ha etcd` on the same participants, which form one
//! group. The first node starts alone and leads; the others start after it and follow. Each
//! participant's `--coordinator` names every node, so its decision queries find the leader.
//!
//! Owns starting the processes, finding the leader and waiting for followers to be in sync,
//! all through etcd's and the coordinators' own interfaces (`GET /v1/group`); it never
//! decides anything about the group itself (that is the coordinators' job) and never talks
//! to etcd's API.
//!
//! Node 0 is the [`LocalCluster`]'s `coordinator` (data in `<data dir>/coordinator`, log
//! `coordinator.log`); node `i > 0` has `<data dir>/coordinator-<name>` and
//! `coordinator-<name>.log`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cluster::{ClusterError, ClusterSpec, LocalCluster};
use crate::etcd::{EtcdCluster, EtcdClusterError};
use crate::node::{Node, NodeSpec, free_port};

/// Why a group could not be started or did not settle.
#[derive(Debug, thiserror::Error)]
pub enum HaClusterError {
    #[error("a coordinator group needs at least one node")]
    NoNodes,
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdClusterError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("no coordinator node {0} in this group")]
    NoSuchNode(usize),
    #[error("{0}")]
    NotSettled(String),
}

type Result<T> = std::result::Result<T, HaClusterError>;

/// What to start.
#[derive(Debug, Clone)]
pub struct HaSpec {
    /// The participants, their seeds and flags; `coordinator_flags` go to every node.
    pub cluster: ClusterSpec,
    /// The coordinator nodes' names (`--node`), in start order: the first leads.
    pub nodes: Vec<String>,
    /// etcd members (1 or 3).
    pub etcd_members: usize,
    /// `--ha-lease-ttl-ms`, if not the coordinator's default.
    pub lease_ttl_ms: Option<u64>,
}

/// A running group. Dropping it kills every process (etcd last, as fields drop in order).
#[derive(Debug)]
pub struct HaCluster {
    /// The participants, and node 0 as `coordinator`.
    pub cluster: LocalCluster,
    /// Nodes 1.., in [`HaSpec::nodes`] order.
    pub others: Vec<Node>,
    pub names: Vec<String>,
    pub etcd: EtcdCluster,
    /// etcd's data and logs (`<data dir>/etcd`), which name its processes' command lines.
    etcd_dir: PathBuf,
}

/// One follower as a leader's `GET /v1/group` lists it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct FollowerView {
    pub node: String,
    pub streaming: bool,
    pub in_sync: bool,
}

/// A node's role as its `GET /v1/group` says (`leading`, `following`, `campaigning`, ...).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct RoleView {
    pub role: String,
    pub term: Option<u64>,
}

/// The parts of `GET /v1/group` the demo and the bench read.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct GroupView {
    pub node: String,
    pub url: String,
    pub role: RoleView,
    #[serde(default)]
    pub followers: Vec<FollowerView>,
}

impl GroupView {
    /// The followers that count in the sync set now.
    pub fn in_sync(&self) -> Vec<String> {
        self.followers
            .iter()
            .filter(|f| f.in_sync)
            .map(|f| f.node.clone())
            .collect()
    }
}

impl HaCluster {
    /// Starts etcd (under `<data dir>/etcd`, which must not exist yet), the participants, node
    /// 0 (waits until it leads and is ready), then the other nodes (does not wait for them:
    /// see [`HaCluster::wait_in_sync`]).
    pub fn start(spec: &HaSpec) -> Result<HaCluster> {
        let first = spec.nodes.first().ok_or(HaClusterError::NoNodes)?;
        let etcd_dir = spec.cluster.data_dir.join("etcd");
        let etcd = EtcdCluster::start(spec.etcd_members, &etcd_dir)?;
        let addrs: Vec<_> = spec
            .nodes
            .iter()
            .enumerate()
            .map(|(i, _)| {
                if i == 0 {
                    LocalCluster::coordinator_addr()
                } else {
                    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
                }
            })
            .collect();
        let list = addrs
            .iter()
            .map(|a| format!("http://{a}"))
            .collect::<Vec<_>>()
            .join(",");
        let participants =
            LocalCluster::start_participants_at(&spec.cluster, addrs[0], &|_| Some(list.clone()))?;
        let participant_urls = participants.urls();
        let ha_flags = |name: &str, addr: &std::net::SocketAddr| {
            let mut flags = vec![
                "--ha".to_string(),
                "etcd".into(),
                "--etcd".into(),
                etcd.client_urls().join(","),
                "--node".into(),
                name.to_string(),
                "--advertise".into(),
                format!("http://{addr}"),
            ];
            if let Some(ttl) = spec.lease_ttl_ms {
                flags.extend(["--ha-lease-ttl-ms".to_string(), ttl.to_string()]);
            }
            flags
        };
        let mut first_spec = spec.cluster.clone();
        first_spec
            .coordinator_flags
            .extend(ha_flags(first, &addrs[0]));
        let cluster =
            LocalCluster::start_coordinator(&first_spec, participants, &participant_urls)?;

        let mut others = Vec::new();
        for (name, addr) in spec.nodes.iter().zip(&addrs).skip(1) {
            let mut args = vec![
                "coordinator".to_string(),
                "--listen".into(),
                addr.to_string(),
                "--data-dir".into(),
                path_arg(&spec.cluster.data_dir.join(format!("coordinator-{name}"))),
            ];
            for (participant, url) in &participant_urls {
                args.extend(["--participant".to_string(), format!("{participant}={url}")]);
            }
            args.extend(spec.cluster.coordinator_flags.iter().cloned());
            args.extend(ha_flags(name, addr));
            others.push(Node::start(NodeSpec {
                name: format!("coordinator-{name}"),
                binary: spec.cluster.binary.clone(),
                args,
                env: Vec::new(),
                addr: *addr,
                log_path: cluster.log_dir.join(format!("coordinator-{name}.log")),
                tokens: cluster.tokens.clone(),
            }));
        }
        Ok(HaCluster {
            cluster,
            others,
            names: spec.nodes.clone(),
            etcd,
            etcd_dir,
        })
    }

    /// Node `i` (in [`HaSpec::nodes`] order).
    pub fn node(&self, i: usize) -> Result<&Node> {
        match i {
            0 => Ok(&self.cluster.coordinator),
            i => self.others.get(i - 1).ok_or(HaClusterError::NoSuchNode(i)),
        }
    }

    /// Node `i`, to kill or restart it.
    pub fn node_mut(&mut self, i: usize) -> Result<&mut Node> {
        match i {
            0 => Ok(&mut self.cluster.coordinator),
            i => self
                .others
                .get_mut(i - 1)
                .ok_or(HaClusterError::NoSuchNode(i)),
        }
    }

    /// Every node's base URL, in node order (what a client's `--coordinator` list names).
    pub fn coordinator_urls(&self) -> Vec<String> {
        std::iter::once(&self.cluster.coordinator)
            .chain(&self.others)
            .map(Node::url)
            .collect()
    }

    /// The index of the node whose URL is `url`.
    pub fn index_of(&self, url: &str) -> Option<usize> {
        let url = url.trim_end_matches('/');
        self.coordinator_urls().iter().position(|u| u == url)
    }

    /// Process ids of every running process: the coordinators, the participants and etcd
    /// (`None` if any of them is not running, so that a CPU sum never misses one).
    pub fn pids(&self) -> Option<Vec<u32>> {
        let mut pids = vec![self.cluster.coordinator.pid()?];
        for node in &self.others {
            pids.push(node.pid()?);
        }
        for (_, node) in &self.cluster.participants {
            pids.push(node.pid()?);
        }
        let etcd = self.etcd_pids();
        if etcd.len() != self.etcd.len() {
            return None;
        }
        pids.extend(etcd);
        Some(pids)
    }

    /// etcd's process ids: those whose command line names a data directory under ours
    /// (`EtcdCluster` does not hand out its children's ids; their command lines are unique to
    /// this group's directory).
    fn etcd_pids(&self) -> Vec<u32> {
        let ours = format!("--data-dir={}/", self.etcd_dir.display());
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline
                        .split(|&b| b == 0)
                        .any(|arg| arg.starts_with(ours.as_bytes()))
                })
            })
            .collect()
    }

    /// What node `url` says about the group, read with the cluster's operator token; `None`
    /// when it does not answer (killed, still starting) or answers something else.
    pub async fn view(&self, client: &reqwest::Client, url: &str) -> Option<GroupView> {
        let response = client
            .get(format!("{url}/v1/group"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// The node that leads now (says so itself), with its view; `None` while none does.
    pub async fn leader(&self, client: &reqwest::Client) -> Option<(usize, GroupView)> {
        for (i, url) in self.coordinator_urls().iter().enumerate() {
            if let Some(view) = self.view(client, url).await
                && view.role.role == "leading"
            {
                return Some((i, view));
            }
        }
        None
    }

    /// Polls until some node leads and every other running node is in its sync set; returns
    /// the leader's index and view. Fails after `timeout` with what was last seen.
    pub async fn wait_in_sync(
        &mut self,
        client: &reqwest::Client,
        timeout: Duration,
    ) -> Result<(usize, GroupView)> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut running = Vec::new();
            for i in 0..self.names.len() {
                if self.node_mut(i)?.is_running() {
                    running.push(self.names[i].clone());
                }
            }
            let seen = self.leader(client).await;
            if let Some((i, view)) = &seen {
                let in_sync = view.in_sync();
                let all = running
                    .iter()
                    .filter(|name| **name != self.names[*i])
                    .all(|name| in_sync.contains(name));
                if all {
                    return Ok((*i, view.clone()));
                }
            }
            if Instant::now() >= deadline {
                return Err(HaClusterError::NotSettled(format!(
                    "the coordinator group did not settle within {timeout:?} (running: {running:?}; \
                     leader's view: {seen:?}); logs in {}",
                    self.cluster.log_dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Graceful stop of every process: coordinators, participants, then etcd (by drop).
    pub fn stop(&mut self) {
        for node in &mut self.others {
            node.terminate(Duration::from_secs(10));
        }
        self.cluster.stop();
    }

    /// Where the processes' logs are.
    pub fn log_dir(&self) -> &Path {
        &self.cluster.log_dir
    }
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
