//! Real local etcd servers for the demos, benches and tests of the coordinator group (issue
//! 27): one or more `etcd` processes on loopback ports, a fresh data directory each, that
//! form one cluster; kill, pause (SIGSTOP), resume and restart single members. Owns starting
//! and signalling the processes and waiting until they answer; never talks etcd's API beyond
//! `GET /health` (that is `net::etcd`'s) and never touches a data directory it did not make.
//!
//! The binary is `$TWOPC_ETCD`, else `etcd` on PATH (Debian: `apt-get install etcd-server`).
//! The members run with a short raft heartbeat ([`HEARTBEAT_MS`]) and election timeout
//! ([`ELECTION_MS`]), so that a killed leader is replaced within about a second: tests of
//! failover stay fast. etcd's smallest lease TTL follows from them (1.5 election timeouts,
//! rounded up to whole seconds: 1 s).
//!
//! Plain `std`, like [`crate::node`], so it works from sync and async tests alike.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::node::{Node, NodeSpec, free_port, http_get};

/// The environment variable naming the etcd binary (else `etcd` on PATH).
pub const BINARY_ENV: &str = "TWOPC_ETCD";

/// What fails when there is no etcd.
pub const INSTALL_HINT: &str = "this needs etcd (3.4 or newer): install it (Debian: apt-get \
install -y etcd-server) or set TWOPC_ETCD to the etcd binary";

/// Raft heartbeat of the members, in milliseconds (etcd's default: 100).
pub const HEARTBEAT_MS: u64 = 50;
/// Raft election timeout of the members, in milliseconds (etcd's default: 1000).
pub const ELECTION_MS: u64 = 500;

/// How long [`EtcdCluster::start`] and [`EtcdCluster::restart`] wait for members to answer.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why etcd could not be started or signalled.
#[derive(Debug, thiserror::Error)]
pub enum EtcdClusterError {
    #[error("{INSTALL_HINT} ({looked})")]
    NoBinary { looked: String },
    #[error("an etcd cluster needs at least one member")]
    NoMembers,
    #[error("no etcd member {0} in this cluster")]
    NoSuchMember(usize),
    #[error("cannot prepare {path}: {source}")]
    Files {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} already exists; etcd members start on fresh data directories")]
    NotFresh { path: PathBuf },
    #[error("{0}")]
    NotReady(String),
    #[error("cannot send {signal} to {name}: {why}")]
    Signal {
        signal: &'static str,
        name: String,
        why: String,
    },
}

type Result<T> = std::result::Result<T, EtcdClusterError>;

/// Running etcd members forming one cluster. Dropping it kills them all.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Node>,
}

impl EtcdCluster {
    /// Starts `members` etcd processes (1 or 3 in practice) with their data and logs under
    /// `dir/etcd-<i>/`, and waits (at most [`READY_TIMEOUT`]) until every one reports healthy,
    /// which needs an elected leader.
    pub fn start(members: usize, dir: &Path) -> Result<EtcdCluster> {
        if members == 0 {
            return Err(EtcdClusterError::NoMembers);
        }
        let binary = find_binary()?;
        // Each cluster its own token, so that members of two clusters never mistake each other.
        let token = format!("twopc-{}-{}", std::process::id(), fastrand::u64(..u64::MAX));
        let ports: Vec<(u16, u16)> = (0..members).map(|_| (free_port(), free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("etcd-{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut specs = Vec::with_capacity(members);
        for (i, &(client, peer)) in ports.iter().enumerate() {
            let home = dir.join(format!("etcd-{i}"));
            if home.exists() {
                return Err(EtcdClusterError::NotFresh { path: home });
            }
            std::fs::create_dir_all(&home).map_err(files(&home))?;
            let data = home.join("data");
            let data = data.to_str().ok_or_else(|| EtcdClusterError::Files {
                path: data.clone(),
                source: std::io::Error::other("not UTF-8"),
            })?;
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let args = [
                ("--name", format!("etcd-{i}")),
                ("--data-dir", data.to_string()),
                ("--listen-client-urls", client_url.clone()),
                ("--advertise-client-urls", client_url),
                ("--listen-peer-urls", peer_url.clone()),
                ("--initial-advertise-peer-urls", peer_url),
                ("--initial-cluster", initial_cluster.clone()),
                ("--initial-cluster-state", "new".to_string()),
                ("--initial-cluster-token", token.clone()),
                ("--heartbeat-interval", HEARTBEAT_MS.to_string()),
                ("--election-timeout", ELECTION_MS.to_string()),
                ("--logger", "zap".to_string()),
            ];
            specs.push(NodeSpec {
                name: format!("etcd-{i}"),
                binary: binary.clone(),
                args: args
                    .into_iter()
                    .map(|(flag, value)| format!("{flag}={value}"))
                    .collect(),
                env: Vec::new(),
                addr: ([127, 0, 0, 1], client).into(),
                log_path: home.join("etcd.log"),
                tokens: None,
            });
        }
        // All at once: a member of a new cluster waits for its peers before it answers.
        let mut cluster = EtcdCluster {
            members: specs.into_iter().map(Node::start).collect(),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        for i in 0..members {
            wait_healthy(&mut cluster.members[i], deadline)?;
        }
        Ok(cluster)
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client URL (`http://127.0.0.1:port`), in member order.
    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(Node::url).collect()
    }

    /// Member `i`'s client URL.
    pub fn client_url(&self, i: usize) -> Result<String> {
        Ok(self.member(i)?.url())
    }

    /// What member `i` has logged, across its runs.
    pub fn log(&self, i: usize) -> Result<String> {
        Ok(self.member(i)?.log())
    }

    /// SIGKILL to member `i` (nothing if it is not running).
    pub fn kill(&mut self, i: usize) -> Result<()> {
        self.member_mut(i)?.kill();
        Ok(())
    }

    /// SIGSTOP to member `i`: it keeps its sockets but answers nothing until [`Self::cont`].
    pub fn stop(&mut self, i: usize) -> Result<()> {
        self.signal(i, "STOP")
    }

    /// SIGCONT to member `i`, after [`Self::stop`].
    pub fn cont(&mut self, i: usize) -> Result<()> {
        self.signal(i, "CONT")
    }

    /// Kills member `i` if it runs, starts it again on the same ports and data directory,
    /// and waits (at most [`READY_TIMEOUT`]) until it reports healthy.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let member = self.member_mut(i)?;
        member.restart();
        wait_healthy(member, Instant::now() + READY_TIMEOUT)
    }

    fn member(&self, i: usize) -> Result<&Node> {
        self.members.get(i).ok_or(EtcdClusterError::NoSuchMember(i))
    }

    fn member_mut(&mut self, i: usize) -> Result<&mut Node> {
        self.members
            .get_mut(i)
            .ok_or(EtcdClusterError::NoSuchMember(i))
    }

    fn signal(&mut self, i: usize, signal: &'static str) -> Result<()> {
        let member = self.member_mut(i)?;
        let name = member.spec().name.clone();
        let failed = |why: String| EtcdClusterError::Signal {
            signal,
            name: name.clone(),
            why,
        };
        let pid = match member.pid() {
            Some(pid) if member.is_running() => pid,
            _ => return Err(failed("it is not running".to_string())),
        };
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .map_err(|e| failed(format!("cannot run kill: {e}")))?;
        if !status.success() {
            return Err(failed(format!("kill exited with {status}")));
        }
        Ok(())
    }
}

/// Polls `GET /health` until it says `"health":"true"` (the member has a leader and serves
/// reads), the process exits, or `deadline` passes.
fn wait_healthy(member: &mut Node, deadline: Instant) -> Result<()> {
    let name = member.spec().name.clone();
    let addr = member.spec().addr;
    loop {
        if !member.is_running() {
            return Err(EtcdClusterError::NotReady(format!(
                "{name} exited before it was healthy; log:\n{}",
                member.log()
            )));
        }
        let answer = http_get(addr, "/health");
        if let Some((200, body)) = &answer
            && body.contains(r#""health":"true""#)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(EtcdClusterError::NotReady(format!(
                "{name} not healthy in time (last answer {answer:?}); log:\n{}",
                member.log()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `$TWOPC_ETCD`, else the first `etcd` on PATH.
pub fn find_binary() -> Result<PathBuf> {
    if let Some(named) = std::env::var_os(BINARY_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(named);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(EtcdClusterError::NoBinary {
                looked: format!("{BINARY_ENV}={} is not a file", path.display()),
            })
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("etcd"))
        .find(|path| path.is_file())
        .ok_or_else(|| EtcdClusterError::NoBinary {
            looked: format!("no etcd on PATH and {BINARY_ENV} unset"),
        })
}

fn files(path: &Path) -> impl FnOnce(std::io::Error) -> EtcdClusterError + '_ {
    move |source| EtcdClusterError::Files {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_etcd_the_error_says_how_to_install_it() {
        let error = EtcdClusterError::NoBinary {
            looked: "no etcd on PATH".to_string(),
        };
        let text = error.to_string();
        assert!(text.contains("apt-get install -y etcd-server"), "{text}");
        assert!(text.contains(BINARY_ENV), "{text}");
        let none = EtcdCluster::start(0, Path::new("/nonexistent")).unwrap_err();
        assert!(matches!(none, EtcdClusterError::NoMembers), "{none}");
    }
}
