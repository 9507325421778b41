//! A local coordinator group (issue 27, docs/ha.md) of real processes: etcd, N coordinators
//! started with `--ha etcd` and the same participants, and the checkout participants, whose
//! `--coordinator` lists every coordinator. Starts them on loopback ports with one token set,
//! reads each coordinator's `GET /v1/group`, and waits (bounded) for the group to reach a
//! shape: a given node leading, a follower attached in the sync set, the sync set empty.
//!
//! It starts processes and reads their public APIs the way an operator would; it never
//! writes to etcd or to a data directory, and holds no assertions: the tests judge.
//!
//! Starting is blocking (`std`, like [`crate::node`]); reading the group is async (reqwest,
//! with the operator token the group's `/v1/group` asks for).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::audit::ClusterUrls;
use crate::auth::TokenSet;
use crate::checkout::{CheckoutConfig, INVENTORY, PAYMENTS, SHIPPING};
use crate::etcd::{EtcdCluster, EtcdClusterError};
use crate::node::{Node, NodeSpec, free_port};

/// How long a freshly started process may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the waits below ask again.
const POLL: Duration = Duration::from_millis(50);

/// Why a group could not be started or did not reach a shape in time.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("cannot prepare {path}: {source}")]
    Files {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdClusterError),
    #[error("cannot make the group's tokens: {0}")]
    Tokens(#[from] crate::auth::TokenSetError),
    #[error("{0}")]
    NotReady(String),
    #[error("no coordinator {0} in this group")]
    NoSuchNode(usize),
    #[error("cannot send SIG{signal} to {name}: {why}")]
    Signal {
        signal: &'static str,
        name: String,
        why: String,
    },
}

type Result<T> = std::result::Result<T, GroupError>;

/// What to start.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// The `twopc` binary.
    pub binary: PathBuf,
    pub data_dir: PathBuf,
    /// Coordinators in the group (named `c0`, `c1`, ...).
    pub coordinators: usize,
    /// etcd members (1 or 3).
    pub etcd_members: usize,
    /// The checkout store the participants are seeded with.
    pub config: CheckoutConfig,
    /// `--ha-lease-ttl-ms` (`None`: the coordinator's default).
    pub lease_ttl_ms: Option<u64>,
    /// `--ha-replica-timeout-ms` (`None`: the coordinator's default).
    pub replica_timeout_ms: Option<u64>,
    /// Extra flags for every coordinator and every participant.
    pub coordinator_flags: Vec<String>,
    pub participant_flags: Vec<String>,
    /// Environment of every twopc process (for example `RUST_LOG`).
    pub env: Vec<(String, String)>,
}

impl GroupSpec {
    /// Two coordinators, one etcd member, the default checkout store, default group settings.
    pub fn checkout(binary: &Path, data_dir: &Path) -> GroupSpec {
        GroupSpec {
            binary: binary.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            coordinators: 2,
            etcd_members: 1,
            config: CheckoutConfig::default(),
            lease_ttl_ms: None,
            replica_timeout_ms: None,
            coordinator_flags: Vec::new(),
            participant_flags: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// The running processes. Dropping it kills them all.
#[derive(Debug)]
pub struct LocalGroup {
    pub etcd: EtcdCluster,
    /// Coordinator `i` is the node named `c<i>`.
    pub coordinators: Vec<Node>,
    pub participants: Vec<(String, Node)>,
    pub tokens: Option<TokenSet>,
    pub log_dir: PathBuf,
}

/// One coordinator's answer to `GET /v1/group` (the fields the harness reads).
#[derive(Debug, Clone, Deserialize)]
pub struct GroupView {
    pub node: String,
    pub url: String,
    pub role: RoleView,
    /// The group's record in etcd, as this node read it (`None` before any leader).
    pub state: Option<StateView>,
    /// On the leader: the followers attached.
    #[serde(default)]
    pub followers: Vec<FollowerView>,
    /// The epoch the node runs at, once it leads.
    pub epoch: Option<u64>,
}

/// The node's role: `following`, `campaigning`, `leading` (with its term), `stepped_down`.
#[derive(Debug, Clone, Deserialize)]
pub struct RoleView {
    pub role: String,
    pub term: Option<u64>,
    pub leader: Option<String>,
    pub why: Option<String>,
}

/// The group's state key: the term, who won it, the sync set.
#[derive(Debug, Clone, Deserialize)]
pub struct StateView {
    pub term: u64,
    pub leader: String,
    pub sync: Vec<String>,
}

/// A follower as its leader sees it.
#[derive(Debug, Clone, Deserialize)]
pub struct FollowerView {
    pub node: String,
    pub streaming: bool,
    pub in_sync: bool,
}

impl GroupView {
    pub fn leading(&self) -> bool {
        self.role.role == "leading"
    }

    /// Whether this (leading) node counts `follower` in sync, in its table and in etcd.
    pub fn in_sync(&self, follower: &str) -> bool {
        let attached = self
            .followers
            .iter()
            .any(|f| f.node == follower && f.streaming && f.in_sync);
        let recorded = self
            .state
            .as_ref()
            .is_some_and(|s| s.sync.iter().any(|n| n == follower));
        attached && recorded
    }
}

/// The name of coordinator `i`.
pub fn node_name(i: usize) -> String {
    format!("c{i}")
}

impl LocalGroup {
    /// Starts etcd, the participants, then coordinator `c0` (it finds no leader, so it leads)
    /// and, once it is ready, the others one by one, each waited for until `c0` counts it in
    /// its sync set: the group is whole and `c0` leads when this returns.
    pub async fn start(spec: &GroupSpec) -> Result<LocalGroup> {
        let log_dir = spec.data_dir.join("logs");
        let seed_dir = spec.data_dir.join("seeds");
        for dir in [&log_dir, &seed_dir] {
            std::fs::create_dir_all(dir).map_err(files(dir))?;
        }
        let etcd_dir = spec.data_dir.join("etcd");
        let etcd = blocking(|| EtcdCluster::start(spec.etcd_members, &etcd_dir))?;
        let tokens = TokenSet::for_harness(&spec.data_dir)?;
        let ports: Vec<u16> = (0..spec.coordinators).map(|_| free_port()).collect();
        let coordinator_list = ports
            .iter()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");

        let mut participants = Vec::new();
        for (name, seed) in spec.config.seeds() {
            let port = free_port();
            let seed_path = seed_dir.join(format!("{name}.json"));
            let bytes = serde_json::to_vec_pretty(&seed).unwrap_or_default();
            std::fs::write(&seed_path, bytes).map_err(files(&seed_path))?;
            let mut args = vec![
                "participant".to_string(),
                "--name".into(),
                name.to_string(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--coordinator".into(),
                coordinator_list.clone(),
                "--data-dir".into(),
                path_arg(&spec.data_dir.join(name)),
                "--seed".into(),
                path_arg(&seed_path),
            ];
            args.extend(spec.participant_flags.iter().cloned());
            let node = Node::start(NodeSpec {
                name: name.to_string(),
                binary: spec.binary.clone(),
                args,
                env: spec.env.clone(),
                addr: ([127, 0, 0, 1], port).into(),
                log_path: log_dir.join(format!("{name}.log")),
                tokens: tokens.clone(),
            });
            participants.push((name.to_string(), node));
        }
        for (_, node) in &mut participants {
            blocking(|| node.wait_ready(READY_TIMEOUT)).map_err(GroupError::NotReady)?;
        }

        let participant_flags: Vec<String> = participants
            .iter()
            .flat_map(|(name, node)| {
                [
                    "--participant".to_string(),
                    format!("{name}={}", node.url()),
                ]
            })
            .collect();
        let etcd_list = etcd.client_urls().join(",");
        let mut group = LocalGroup {
            etcd,
            coordinators: Vec::new(),
            participants,
            tokens,
            log_dir,
        };
        for (i, port) in ports.iter().enumerate() {
            let name = node_name(i);
            let mut args = vec![
                "coordinator".to_string(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--data-dir".into(),
                path_arg(&spec.data_dir.join(&name)),
                "--ha".into(),
                "etcd".into(),
                "--etcd".into(),
                etcd_list.clone(),
                "--node".into(),
                name.clone(),
            ];
            if let Some(ttl) = spec.lease_ttl_ms {
                args.extend(["--ha-lease-ttl-ms".to_string(), ttl.to_string()]);
            }
            if let Some(timeout) = spec.replica_timeout_ms {
                args.extend(["--ha-replica-timeout-ms".to_string(), timeout.to_string()]);
            }
            args.extend(participant_flags.iter().cloned());
            args.extend(spec.coordinator_flags.iter().cloned());
            let node = Node::start(NodeSpec {
                name: name.clone(),
                binary: spec.binary.clone(),
                args,
                env: spec.env.clone(),
                addr: ([127, 0, 0, 1], *port).into(),
                log_path: group.log_dir.join(format!("{name}.log")),
                tokens: group.tokens.clone(),
            });
            group.coordinators.push(node);
            if i == 0 {
                let first = &mut group.coordinators[0];
                blocking(|| first.wait_ready(READY_TIMEOUT)).map_err(GroupError::NotReady)?;
            } else {
                group.wait_in_sync(0, i, READY_TIMEOUT).await?;
            }
        }
        Ok(group)
    }

    /// Every coordinator's base URL, in node order.
    pub fn coordinator_urls(&self) -> Vec<String> {
        self.coordinators.iter().map(Node::url).collect()
    }

    /// Coordinator `i`.
    pub fn coordinator(&mut self, i: usize) -> Result<&mut Node> {
        self.coordinators
            .get_mut(i)
            .ok_or(GroupError::NoSuchNode(i))
    }

    /// SIGSTOP to coordinator `i`: it keeps its sockets and its etcd lease runs out, but it
    /// answers nothing until [`Self::cont`] (a stalled leader, a hung follower).
    pub fn stop(&self, i: usize) -> Result<()> {
        self.signal(i, "STOP")
    }

    /// SIGCONT to coordinator `i`, after [`Self::stop`].
    pub fn cont(&self, i: usize) -> Result<()> {
        self.signal(i, "CONT")
    }

    fn signal(&self, i: usize, signal: &'static str) -> Result<()> {
        let node = self.coordinators.get(i).ok_or(GroupError::NoSuchNode(i))?;
        let failed = |why: String| GroupError::Signal {
            signal,
            name: node_name(i),
            why,
        };
        let pid = node
            .pid()
            .ok_or_else(|| failed("it is not running".to_string()))?;
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .map_err(|e| failed(format!("cannot run kill: {e}")))?;
        if !status.success() {
            return Err(failed(format!("kill exited with {status}")));
        }
        Ok(())
    }

    /// An HTTP client that sends the group's operator token (none with auth off).
    pub fn http(&self) -> reqwest::Client {
        crate::auth::http_client(self.tokens.as_ref())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_else(|e| panic!("cannot build an HTTP client: {e}"))
    }

    /// The URLs the audit reads, with coordinator `leader` as the one asked for outcomes.
    pub fn checkout_urls(&self, leader: usize) -> Result<ClusterUrls> {
        let coordinator = self
            .coordinators
            .get(leader)
            .ok_or(GroupError::NoSuchNode(leader))?
            .url();
        let url = |name: &str| {
            self.participants
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, node)| node.url())
                .unwrap_or_default()
        };
        Ok(ClusterUrls {
            coordinator,
            inventory: url(INVENTORY),
            payments: url(PAYMENTS),
            shipping: url(SHIPPING),
        })
    }

    /// Coordinator `i`'s `GET /v1/group`, or `None` when it does not answer 200 (down,
    /// stopped, still starting) or the body does not decode.
    pub async fn view(&self, i: usize) -> Option<GroupView> {
        let node = self.coordinators.get(i)?;
        let response = self
            .http()
            .get(format!("{}{}", node.url(), protocol::routes::GROUP))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }

    /// Polls coordinator `i`'s view until `shape` holds; returns that view, or fails with the
    /// last view seen and the node's log tail.
    pub async fn wait_view(
        &self,
        i: usize,
        what: &str,
        timeout: Duration,
        shape: impl Fn(&GroupView) -> bool,
    ) -> Result<GroupView> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(view) = self.view(i).await {
                if shape(&view) {
                    return Ok(view);
                }
                last = Some(view);
            }
            if Instant::now() >= deadline {
                let log = self.coordinators.get(i).map(Node::log).unwrap_or_default();
                return Err(GroupError::NotReady(format!(
                    "{} not {what} after {timeout:?}; last view {last:?}; log tail:\n{}",
                    node_name(i),
                    tail(&log, 40)
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until coordinator `i` leads and is ready to take transactions (`/readyz` 200);
    /// returns its view.
    pub async fn wait_leading(&self, i: usize, timeout: Duration) -> Result<GroupView> {
        let deadline = Instant::now() + timeout;
        let view = self
            .wait_view(i, "leading", timeout, GroupView::leading)
            .await?;
        let node = self.coordinators.get(i).ok_or(GroupError::NoSuchNode(i))?;
        let addr = node.spec().addr;
        loop {
            let ready = blocking(|| crate::node::http_get(addr, "/readyz"));
            if let Some((200, _)) = ready {
                // Read again: the first view may predate recovery (no epoch yet).
                return Ok(self.view(i).await.unwrap_or(view));
            }
            if Instant::now() >= deadline {
                return Err(GroupError::NotReady(format!(
                    "{} leads but is not ready after {timeout:?} (last {ready:?}); log tail:\n{}",
                    node_name(i),
                    tail(&node.log(), 40)
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until leader `leader` counts follower `follower` in its sync set (attached,
    /// streaming, and recorded in etcd); returns the leader's view.
    pub async fn wait_in_sync(
        &self,
        leader: usize,
        follower: usize,
        timeout: Duration,
    ) -> Result<GroupView> {
        let name = node_name(follower);
        self.wait_view(
            leader,
            &format!("leading with {name} in sync"),
            timeout,
            |v| v.leading() && v.in_sync(&name),
        )
        .await
    }

    /// Waits until leader `leader` runs degraded: leading with an empty sync set in etcd.
    pub async fn wait_degraded(&self, leader: usize, timeout: Duration) -> Result<GroupView> {
        self.wait_view(leader, "leading degraded", timeout, |v| {
            v.leading() && v.state.as_ref().is_some_and(|s| s.sync.is_empty())
        })
        .await
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs blocking process work from async code without stalling the runtime's other tasks
/// (a multi-threaded runtime; on a current-thread one it just runs it).
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

fn files(path: &Path) -> impl FnOnce(std::io::Error) -> GroupError + '_ {
    move |source| GroupError::Files {
        path: path.to_path_buf(),
        source,
    }
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
